"""``ShardingRule``: how a kernel's dimensions may be split over a mesh.

A factor an output lacks is contracted: split, it leaves partial results, so
the rule must say how they combine (``reductions``) or forbid the split
(``whole``); else answers would be silently wrong, so it is refused.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, Sequence

from jt_dist import _errors

REDUCTIONS = ("max", "min", "sum")

_FACTOR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _parse_group(text: str, where: str, rule: str) -> tuple[str, ...]:
  factors = tuple(text.split())
  for factor in factors:
    if not _FACTOR.match(factor):
      raise ValueError(
          f"ShardingRule({rule!r}): {where} has the factor {factor!r}; a factor"
          " is a name (letters, digits, '_'), and dimensions are separated by"
          " spaces, operands by ',', e.g. 'i k, k j -> i j'.")
  if twice := sorted({f for f in factors if factors.count(f) > 1}):
    raise ValueError(
        f"ShardingRule({rule!r}): {where} uses factors {twice} for more than"
        " one of its dimensions; a mesh axis can split only one dimension of"
        " an array. Give each dimension its own factor.")
  return factors


def _parse(rule: str) -> tuple[tuple[tuple[str, ...], ...], ...]:
  if not isinstance(rule, str):
    raise TypeError(
        f"ShardingRule: the rule {rule!r} of type {type(rule).__name__} must"
        " be a str such as 'i k, k j -> i j'.")
  if rule.count("->") != 1:
    raise ValueError(
        f"ShardingRule({rule!r}): the rule needs exactly one '->' between the"
        " operands and the outputs, e.g. 'i k, k j -> i j'.")
  lhs, rhs = rule.split("->")
  sides = []
  for side, text in (("operand", lhs), ("output", rhs)):
    groups = text.split(",")
    if len(groups) == 1 and not groups[0].strip():
      raise ValueError(
          f"ShardingRule({rule!r}): the rule names no {side}s; list one group"
          f" of factors per array {side}, e.g. 'i k, k j -> i j' (a 0-d"
          " array gets an empty group between commas: 'i, -> i').")
    sides.append(tuple(
        _parse_group(g, f"{side} {k} ({g.strip()!r})", rule)
        for k, g in enumerate(groups)))
  return sides[0], sides[1]


@dataclasses.dataclass(frozen=True, init=False)
class ShardingRule:
  """How a kernel call may be split over a device mesh.

  Pass it as ``triton_call(..., sharding_rule=rule)``: under ``jax.jit`` over
  a mesh with explicit axes, the call then runs once per device on its shard
  instead of being refused, and ``sharded_triton_call`` needs no specs.

  Example::

    rule = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})

  Attributes:
    rule: the rule text, one group of factors per array operand and output.
    operands: the factors of each array operand, in order (scalars have
      none; a tuple operand's arrays count one by one, in flattened order).
    outputs: the factors of each output, in the order of ``out_shape``.
    reductions: ``(factor, op)`` pairs: a contracted factor that may be
      split, and how the partial outputs are combined (``"sum"``, ``"max"``
      or ``"min"``).
    whole: factors that must never be split (a softmax row, say); operands
      split along one are gathered first.
  """

  rule: str
  operands: tuple[tuple[str, ...], ...]
  outputs: tuple[tuple[str, ...], ...]
  reductions: tuple[tuple[str, str], ...]
  whole: tuple[str, ...]

  def __init__(self, rule: str, *, reductions: Mapping[str, str] | None = None,
               whole: Iterable[str] = ()):
    """Declares a rule; checks that every split it allows is correct.

    Args:
      rule: Shardy factor notation, e.g. ``"i k, k j -> i j"``: per array
        operand (scalar arguments take no group; a tuple operand takes one
        group per array in it, in flattened order) and per output, one
        factor name per dimension, separated by spaces.
      reductions: maps each contracted factor that may be split (one missing
        from an output) to ``"sum"``, ``"max"`` or ``"min"``.
      whole: factors that must stay whole on every device.

    Raises:
      TypeError: the rule is not a str, ``reductions`` not a mapping or
        ``whole`` not an iterable of str.
      ValueError: the rule does not parse; a reduction is unknown, names a
        factor that no operand has or that every output keeps, or is also
        ``whole``; or a factor missing from an output is neither a reduction
        nor whole.
    """
    operands, outputs = _parse(rule)
    reductions = _check_reductions(rule, reductions, operands, outputs)
    whole = _check_whole(rule, whole, operands, outputs, reductions)
    _check_contracted(rule, operands, outputs, reductions, whole)
    for field, value in (("rule", rule), ("operands", operands),
                         ("outputs", outputs), ("whole", whole),
                         ("reductions", tuple(reductions.items()))):
      object.__setattr__(self, field, value)

  def __repr__(self) -> str:
    extra = [f", {name}={value!r}" for name, value in (
        ("reductions", dict(self.reductions)), ("whole", self.whole)) if value]
    return f"ShardingRule({self.rule!r}{''.join(extra)})"

  def reduction(self, factor: str) -> str | None:
    """The op combining partial results split along ``factor``, or None."""
    return dict(self.reductions).get(factor)

  def factor_sizes(self, arrays: Sequence[tuple[str, tuple]],
                   outputs: Sequence[tuple]) -> dict[str, int]:
    """Checks the call's shapes against the rule; returns each factor's size.

    Args:
      arrays: ``(name, shape)`` of each array operand, e.g. ``("args[1]",
        (32, 16))``.
      outputs: the global shape of each output.

    Raises:
      jt_dist.ShardingSpecError: a different number of operands or outputs,
        a rank that differs from its group's number of factors, or a factor
        whose dimensions differ in size.
    """
    outputs = [(f"output {k}", shape) for k, shape in enumerate(outputs)]
    for what, groups, given in (("array operands", self.operands, arrays),
                                ("outputs", self.outputs, outputs)):
      if len(groups) != len(given):
        names = [name for name, _ in given]
        leaves = (" and each array in a tuple operand its own, in order"
                  if any("][" in n for n in names) else "")
        raise _errors.ShardingSpecError(
            f"{self!r}: the rule lists {len(groups)} {what}, but the call"
            f" has {len(given)} ({', '.join(names) or 'none'}). Give one"
            f" group of factors per array {what.split()[-1].rstrip('s')}"
            f" (scalar arguments take none{leaves}).")
    sizes: dict[str, tuple[int, str]] = {}
    for factors, (name, shape) in zip(self.operands + self.outputs,
                                      [*arrays, *outputs]):
      shape = tuple(shape)
      if len(factors) != len(shape):
        raise _errors.ShardingSpecError(
            f"{self!r}: {name} has shape {shape} (rank {len(shape)}), but the"
            f" rule gives it {len(factors)} factors {list(factors)}. Give one"
            " factor per dimension.")
      for dim, (factor, size) in enumerate(zip(factors, shape)):
        where = f"{name} dimension {dim} (size {size})"
        if factor in sizes and sizes[factor][0] != size:
          raise _errors.ShardingSpecError(
              f"{self!r}: factor {factor!r} is {where}, but"
              f" {sizes[factor][1]}; the dimensions of one factor must have"
              " the same size. Fix the shapes, or give the dimensions"
              " different factors.")
        sizes.setdefault(factor, (size, where))
    return {factor: size for factor, (size, _) in sizes.items()}


def _all_factors(groups) -> list[str]:
  return list(dict.fromkeys(f for group in groups for f in group))


def _check_reductions(rule, reductions, operands, outputs) -> dict[str, str]:
  if reductions is None:
    return {}
  if not isinstance(reductions, Mapping):
    raise TypeError(
        f"ShardingRule({rule!r}): reductions={reductions!r} of type"
        f" {type(reductions).__name__} must map factor names to one of"
        f" {list(REDUCTIONS)}, e.g. {{'k': 'sum'}}.")
  in_operands = set(_all_factors(operands))
  in_every_output = set.intersection(*(set(o) for o in outputs))
  for factor, op in reductions.items():
    if op not in REDUCTIONS:
      raise ValueError(
          f"ShardingRule({rule!r}): reductions[{factor!r}] = {op!r} is not a"
          f" reduction jt_dist knows; use one of {list(REDUCTIONS)}.")
    if factor not in in_operands:
      raise ValueError(
          f"ShardingRule({rule!r}): reductions names factor {factor!r}, which"
          f" no operand has (operand factors: {_all_factors(operands)}).")
    if factor in in_every_output:
      raise ValueError(
          f"ShardingRule({rule!r}): reductions names factor {factor!r}, but"
          " every output keeps it, so nothing is contracted over it. Drop it"
          " from reductions.")
  return dict(reductions)


def _check_whole(rule, whole, operands, outputs, reductions) -> tuple[str, ...]:
  if isinstance(whole, str) or not all(isinstance(f, str) for f in whole):
    raise TypeError(
        f"ShardingRule({rule!r}): whole={whole!r} must be a tuple of factor"
        " names, e.g. whole=('j',).")
  whole = tuple(whole)
  known = _all_factors(operands + outputs)
  for factor in whole:
    if factor not in known:
      raise ValueError(
          f"ShardingRule({rule!r}): whole names factor {factor!r}, which the"
          f" rule does not have (its factors: {known}).")
    if factor in reductions:
      raise ValueError(
          f"ShardingRule({rule!r}): factor {factor!r} is both whole and a"
          f" reduction ({reductions[factor]!r}); a whole factor is never"
          " split, so it needs no reduction. Keep one of the two.")
  return whole


def _check_contracted(rule, operands, outputs, reductions, whole) -> None:
  """A factor an output lacks must be declared, or it is summed silently."""
  for k, out in enumerate(outputs):
    for factor in _all_factors(operands):
      if factor not in (*out, *reductions, *whole):
        raise ValueError(
            f"ShardingRule({rule!r}): factor {factor!r} of the operands is"
            f" missing from output {k} ({' '.join(out) or 'no factors'}), so"
            " each shard split along it would hold a partial result. Declare"
            f" how partials combine, reductions={{{factor!r}: 'sum'}} (or"
            f" 'max', 'min'), or keep it unsplit with whole=({factor!r},).")


def check(rule: Any, where: str) -> ShardingRule:
  """``rule`` as a ``ShardingRule``, or a TypeError naming ``where``."""
  if not isinstance(rule, ShardingRule):
    raise TypeError(
        f"{where}: sharding_rule={rule!r} of type {type(rule).__name__} must"
        " be a jt_dist.ShardingRule, e.g. jt_dist.ShardingRule('i k, k j ->"
        " i j', reductions={'k': 'sum'}).")
  return rule
