"""``sharded_triton_call`` outputs whose spec leaves out an axis they vary on.

Inside ``shard_map`` JAX types every value with the mesh axes it varies over
(``check_vma``); a kernel's outputs vary over every axis one of its inputs
varies over. An output's ``out_specs`` entry must name each of those axes,
unless ``out_reduce`` reduces over it. ``shard_map`` refuses such an output
too, but in words about its own internals (the function it was applied to
is jt_dist's) and with advice (``check_vma=False``) that a jt_dist user
cannot take and that would return one shard's data as the whole. So the
check runs first, inside the shard, and names the output, the spec it would
need and the argument to pass.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
from jax.sharding import PartitionSpec as P

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._sharding import specs as _specs


@dataclasses.dataclass(frozen=True)
class Operand:
  """An array argument of the call, as the message describes it."""

  where: str  # e.g. "args[0]"
  shape: tuple
  spec: P


@dataclasses.dataclass(frozen=True)
class Outputs:
  """What the check needs to know about a call's outputs, one entry each."""

  names: tuple[str, ...]  # Pytree paths, e.g. "out_shape[1]".
  shapes: tuple[tuple, ...]  # Global shapes.
  specs: tuple[P, ...]
  given: bool  # Whether the user passed out_specs.
  out_tree: Any
  reduced: tuple[tuple[str, tuple[str, ...]] | None, ...]  # out_reduce.


def output_names(out_tree) -> tuple[str, ...]:
  """Each output's pytree path within ``out_shape``, in flattened order."""
  skeleton = jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))
  paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
  return tuple("out_shape" + jax.tree_util.keystr(p) for p, _ in paths)


def check(flat: Sequence[Any], outputs: Outputs,
          operands: Sequence[Operand], mesh) -> None:
  """Raises if an output varies over a mesh axis its spec does not name.

  ``flat`` are the shard's outputs (tracers), after any ``out_reduce``.
  """
  # Only the axes this call's shard_map makes manual: inside a caller's
  # shard_map, an axis already manual there (the mesh is then the abstract
  # one, that axis Manual) leaves each shard's values varying over it, and
  # the caller's out_specs account for it, as jax.shard_map's own check
  # leaves out ``mesh.manual_axes``.
  outer = _specs.manual_axes(mesh)
  order = [a for a in mesh.axis_names if a not in outer]
  for k, x in enumerate(flat):
    varying = _compat.varying_axes(jax.typeof(x)) & set(order)
    missing = varying - set(_specs.spec_axes(outputs.specs[k]))
    if missing:
      raise _errors.ShardingSpecError(_message(
          k, sorted(varying, key=order.index), sorted(missing, key=order.index),
          outputs, operands, mesh))


def _message(k: int, varying: list, missing: list, outputs: Outputs,
             operands: Sequence[Operand], mesh) -> str:
  name, shape, spec = outputs.names[k], outputs.shapes[k], outputs.specs[k]
  sources = [f"{o.where} with spec {spec_text(o.spec)}" for o in operands
             if set(_specs.spec_axes(o.spec)) & set(varying)]
  why = (f", since inputs are split over them ({', '.join(sources)})"
         if sources else "")
  how = (f"its out_specs entry is {spec_text(spec)}" if outputs.given else
         "out_specs was left out, so it is P() (replicated)")
  needed = needed_spec(shape, varying, operands, mesh)
  slice_fix = (
      f"name mesh axes {varying} in its out_specs entry, on the dimensions"
      " of the output they split" if needed is None
      else f"pass {_suggest_specs(outputs, k, needed)}")
  return (
      f"sharded_triton_call: output {k} ({name}, global shape {shape}) varies"
      f" over mesh axes {varying} of mesh {dict(mesh.shape)}{why}, but {how},"
      f" which does not name {missing}. If each shard computes its own slice"
      f" of the output, {slice_fix}. {_reduce_fix(outputs, k, missing)}")


def _reduce_fix(outputs: Outputs, k: int, missing: list) -> str:
  """The sentence suggesting ``out_reduce`` for output ``k``."""
  op, axes = outputs.reduced[k] or ("sum", ())
  axes = (*axes, *missing)
  pair = (op, axes[0] if len(axes) == 1 else axes)
  if len(outputs.names) == 1:
    fix = f"pass out_reduce={pair!r}"
  else:
    fix = (f"give {outputs.names[k]} the pair {pair!r} in out_reduce (a"
           " pytree matching out_shape, None for outputs not reduced)")
  if outputs.reduced[k]:
    return (f"If each shard's result is partial over {missing} too, reduce"
            f" over them as well: {fix}.")
  return (f"If each shard computes a partial result (a sum, maximum or"
          f" minimum over its part of the inputs), {fix} (or 'max' / 'min').")


def needed_spec(shape: tuple, varying: list, operands: Sequence[Operand],
                mesh) -> P | None:
  """A spec that names ``varying`` on the output's dimensions, or None.

  The spec of an operand of the output's shape that varies over exactly
  those axes; else each axis on the one output dimension whose size
  matches a dimension it splits in an operand; else None (no guess).
  """
  for o in operands:
    if tuple(o.shape) == tuple(shape) and (
        set(_specs.spec_axes(o.spec)) == set(varying)):
      return o.spec
  entries: list[list] = [[] for _ in shape]
  for axis in varying:
    sizes = {o.shape[d] for o in operands for d, entry in enumerate(o.spec)
             if axis in _specs.entry_axes(entry)}
    dims = [d for d, size in enumerate(shape) if size in sizes]
    if len(dims) != 1:
      return None
    entries[dims[0]].append(axis)
  sizes = dict(mesh.shape)
  if any(shape[d] % math.prod(sizes[a] for a in e)
         for d, e in enumerate(entries)):
    return None
  return _specs.spec_of(entries)


class _Shown(str):
  """A text whose repr is itself, to show a pytree of specs."""

  __repr__ = str.__str__


def _suggest_specs(outputs: Outputs, k: int, spec: P) -> str:
  """``out_specs=...`` with ``spec`` for output ``k``, the others unchanged."""
  if len(outputs.names) == 1:
    return f"out_specs={spec_text(spec)}"
  leaves = [_Shown(spec_text(spec if j == k else s))
            for j, s in enumerate(outputs.specs)]
  tree = jax.tree_util.tree_unflatten(outputs.out_tree, leaves)
  return f"out_specs={tree!r}"


def spec_text(spec: P) -> str:
  """A spec as the user writes it: P('x', None)."""
  return "P(" + ", ".join(repr(e) for e in spec) + ")"
