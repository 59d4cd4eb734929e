"""``jax.Ref`` arguments: buffers a kernel mutates in place.

A Ref is read, its value passed as an input aliased by a hidden output, and
that output written back: the primitive never sees a Ref, and jax's own
discharge of Ref reads and writes carries the update under every transform.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import types as _types


def _ref_like(x: Any) -> bool:
  # A tracer of a Ref is a jax.Ref too; a view (ref.at[...]) is not.
  return isinstance(x, jax.Ref) or _compat.is_ref_view(x)


def _leaves(args):
  """``args``' leaves (Refs included), their names and the treedef."""
  flat, tree = jax.tree_util.tree_flatten_with_path(
      tuple(args), is_leaf=_ref_like)
  names = ["args" + jax.tree_util.keystr(path) for path, _ in flat]
  return [leaf for _, leaf in flat], names, tree


# Never Refs: jax's Ref isinstance costs microseconds, asked per eager call.
_PLAIN_TYPES = {int, float, bool, np.ndarray}


def has_refs(args) -> bool:
  """Whether any argument is, or holds, a Ref or a view of one."""
  # Flattens only containers, which plain calls do not pass.
  for a in args:
    kind = type(a)
    if kind in _PLAIN_TYPES:
      continue
    if _ref_like(a):
      return True
    if isinstance(a, (tuple, list, dict)) and any(
        _ref_like(leaf) for leaf in _leaves((a,))[0]):
      return True
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
      # A concrete array's class is never a Ref's: ask once per class.
      _PLAIN_TYPES.add(kind)
  return False


def check(args, aliases: Any, rule: Any, where: str) -> None:
  """Refuses what Ref arguments cannot be combined with."""
  leaves, names, _ = _leaves(args)
  for leaf, name in zip(leaves, names):
    if _compat.is_ref_view(leaf):
      raise NotImplementedError(
          f"{where}: {name} is a view of a jax.Ref (ref.at[...]), which"
          " a kernel cannot take: it would need the view's strides. Pass the"
          " whole Ref and index inside the kernel, or pass the view's value"
          " (ref.at[...][...]) as an array and write the result back.")
  refs = ", ".join(n for leaf, n in zip(leaves, names)
                   if isinstance(leaf, jax.Ref))
  if aliases:
    raise ValueError(
        f"{where}: input_output_aliases={aliases!r}"
        f" cannot be combined with Ref arguments ({refs}): a Ref is"
        " already updated in place. Drop input_output_aliases and pass every"
        " buffer the kernel updates as a Ref (jax.new_ref(x)).")
  if rule is not None:
    raise NotImplementedError(
        f"{where}: sharding_rule={rule!r} cannot be combined with Ref"
        f" arguments ({refs}): the rule describes outputs listed in"
        " out_shape, and a Ref's update is not one. Pass the Ref's value as"
        " an array and list the updated buffer in out_shape (with"
        " input_output_aliases), or drop sharding_rule.")


def with_values(args, run):
  """``run(values, refs)`` on ``args`` with each Ref replaced by its value
  (``refs``: their indices as ``input_output_aliases`` counts); ``run``
  returns (outputs, the Refs' new values), which are written back."""
  leaves, names, tree = _leaves(args)
  arrays = [k for k, leaf in enumerate(leaves)
            if isinstance(leaf, jax.Ref) or not _types.is_scalar(leaf)]
  refs = [(i, k) for i, k in enumerate(arrays)
          if isinstance(leaves[k], jax.Ref)]
  values = list(leaves)
  for _, k in refs:
    values[k] = leaves[k][...]
  outs, updated = run(tuple(jax.tree_util.tree_unflatten(tree, values)),
                      tuple(i for i, _ in refs))
  for (_, k), new in zip(refs, updated):
    # An update varying over a manual axis the value does not would leave
    # the Ref's copies in a shard_map differing.
    extra = sorted(_compat.varying_axes(jax.typeof(new))
                   - _compat.varying_axes(jax.typeof(values[k])))
    if extra:
      raise _errors.ShardingSpecError(
          f"triton_call: the Ref {names[k]} holds the same value on every"
          f" device along mesh axes {extra}, but the kernel's update of it"
          " reads inputs that differ along them, so the Ref's copies would"
          " differ. Split the Ref over those axes too (its in_specs entry,"
          " in sharded_triton_call or jax.shard_map), or make its value vary"
          " over them (jax.lax.pcast(x, axes, to='varying')) before"
          " jax.new_ref, or pass it as an array and return the update as an"
          " output.")
    leaves[k][...] = new
  return outs


def top_level(args, where: str) -> list[int]:
  """The argument indices of the Refs; refuses one inside a pytree."""
  leaves, names, _ = _leaves(args)
  nested = [n for leaf, n in zip(leaves, names)
            if isinstance(leaf, jax.Ref) and n.count("[") > 1]
  if nested:
    raise NotImplementedError(
        f"{where}: the Ref {nested[0]} sits inside a pytree argument; here"
        " Refs must be arguments of their own. Pass it as a separate"
        " argument (and take it as a separate kernel parameter).")
  return [i for i, a in enumerate(args) if isinstance(a, jax.Ref)]

