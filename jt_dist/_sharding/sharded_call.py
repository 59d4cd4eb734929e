"""One kernel call per shard over a device mesh (``sharded_triton_call``).

An output varies over every mesh axis an input does, so its ``out_specs``
must name those axes unless ``out_reduce`` reduces over them.
``_check_varying`` says so inside the shard, before ``shard_map`` would:
its message advises ``check_vma=False``, which returns one shard's data as
the whole.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
from jax.sharding import PartitionSpec as P

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import outputs as _outputs
from jt_dist._sharding import local_call as _local_call
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import rule as _rule
from jt_dist._core import shard_size as _shard_size
from jt_dist._sharding import specs as _specs


class _Operand(NamedTuple):
  """An array argument of the call, as messages describe it."""

  where: str  # e.g. "args[0]"
  shape: tuple
  spec: P


class _Outputs(NamedTuple):
  """What the varying check needs to know of the outputs, one entry each."""

  names: tuple[str, ...]  # Pytree paths, e.g. "out_shape[1]".
  shapes: tuple[tuple, ...]  # Global shapes.
  specs: tuple[P, ...]
  given: bool  # Whether the user passed out_specs.
  out_tree: Any
  reduced: tuple[tuple[str, tuple[str, ...]] | None, ...]  # out_reduce.


def is_spec_leaf(x: Any) -> bool:
  return x is None or isinstance(x, P)


def _per_output(value, is_one, out_tree, n: int, message) -> list:
  """``value`` for each of ``n`` outputs: one for all, or a pytree shaped
  as out_shape (else ``message(structure)`` is raised)."""
  if value is None or is_one(value):
    return [value] * n
  leaves, tree = jax.tree_util.tree_flatten(
      value, is_leaf=lambda x: x is None or is_one(x))
  if tree != out_tree:
    raise _errors.ShardingSpecError(message(tree))
  return leaves


def _out_specs_for(out_specs, out_tree, out_shapes, mesh) -> list[P]:
  specs = _per_output(
      out_specs, lambda x: isinstance(x, P), out_tree, len(out_shapes),
      lambda tree: (
          f"sharded_triton_call: out_specs {out_specs!r} must be one"
          " PartitionSpec for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}); got the structure {tree}."))
  return [_specs.check_spec(f"output {k}", shape, spec, mesh)
          for k, (spec, (shape, _)) in enumerate(zip(specs, out_shapes))]


def _reductions_for(out_reduce, out_tree, n_out, mesh) -> list:
  """One (collective, axes) pair or None per output."""
  entries = _per_output(
      out_reduce,
      lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str),
      out_tree, n_out,
      lambda tree: (
          f"sharded_triton_call: out_reduce {out_reduce!r} must be one"
          " (op, axes) pair for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}) holding pairs or None."))
  return [_check_reduction(k, e, mesh) for k, e in enumerate(entries)]


def _check_reduction(k: int, entry, mesh):
  """``(op, axes)`` with ``axes`` a tuple of the mesh's axes, or None."""
  if entry is None:
    return None
  op, axes = entry
  if op not in _specs.COLLECTIVES:
    raise ValueError(
        f"sharded_triton_call: out_reduce of output {k} is {entry!r}; the"
        f" collective must be one of {sorted(_specs.COLLECTIVES)}.")
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  unknown = [a for a in axes if a not in mesh.shape]
  if unknown or not axes:
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: out_reduce of output {k} reduces over mesh"
        f" axes {list(axes)}, but the mesh has axes {dict(mesh.shape)}.")
  return op, axes


def leaf_specs(args, mesh, in_specs, out_shape, out_specs, rule) -> list[P]:
  """One checked spec per array leaf: from ``in_specs``, else its own. With
  inferred specs, an output split over an axis no input is split over is
  refused: a kernel sized by its inputs would overrun its shard."""
  specs = _specs.in_specs_for(in_specs, args, mesh)
  if (in_specs is None and rule is None and out_specs is not None
      and specs):
    out_shapes, out_tree = _outputs.flatten_out_shape(out_shape,
                                                      allow_empty=True)
    o_specs = _out_specs_for(out_specs, out_tree, out_shapes, mesh)
    split = {a for s in specs for a in _specs.spec_axes(s)}
    split |= _specs.manual_axes(mesh)
    for k, spec in enumerate(o_specs):
      if alone := [a for a in _specs.spec_axes(spec) if a not in split]:
        raise _errors.ShardingSpecError(_unsplit_inputs_message(
            args, specs, k, out_shapes[k][0], spec, out_tree, alone, mesh))
  return specs


def _unsplit_inputs_message(args, specs, k, shape, spec, out_tree, alone,
                            mesh) -> str:
  leaves, positions = _specs.arrays_of(args)
  inferred = ", ".join(f"{leaves.names[k]} {_spec_text(_specs.trimmed(s))}"
                       for k, s in zip(positions, specs))
  local = _specs.local_shape(shape, spec, mesh)
  name = _output_names(out_tree)[k]
  suggestion = "pass in_specs (one PartitionSpec per array argument)"
  if not any(path for _, path in leaves.places):  # No tuple operands.
    entries = [
        _spec_text(spec if tuple(leaves.leaves[j].shape) == tuple(shape)
                   else P()) for j in positions]
    comma = "," if len(entries) == 1 else ""
    suggestion = f"pass in_specs=({', '.join(entries)}{comma})"
  return (
      f"sharded_triton_call: out_specs split output {k} ({name}, global"
      f" shape {tuple(shape)}) over mesh axes {alone} (its entry is"
      f" {_spec_text(spec)}), but no array argument is split over"
      " them: in_specs were left out, so each argument's spec comes from"
      f" its sharding on mesh {dict(mesh.shape)}: {inferred} (an array with"
      " no sharding there, such as a NumPy array or an array on one device,"
      f" is replicated). The shards along {alone} would get the same"
      f" inputs and each write its output into a shard of shape {local},"
      " which a kernel sized by its inputs overruns. To split the inputs as"
      f" the output is split, {suggestion}; if every shard is meant to"
      " compute the same slice, give the replicated in_specs explicitly.")


def run(args, kernel, out_shape, grid, mesh, in_specs,
        out_specs, out_reduce, sharding_rule, kwargs, ref_args=()):
  """``sharded_triton_call`` on arrays; with ``ref_args`` (indices of the
  Refs' values in ``args``) returns ``(outputs, the Refs' new values)``."""
  out_shapes, out_tree = _outputs.flatten_out_shape(
      out_shape, allow_empty=bool(ref_args))
  # Tuple operands' leaves are split one by one, as positional arrays are.
  leaves, positions = _specs.arrays_of(args)
  mesh = _specs.resolve_mesh(mesh, leaves.leaves)
  # Checks indices at the caller's line; each shard resolves its own.
  _shard_size.resolve(args, kwargs)
  arg_specs = leaf_specs(args, mesh, in_specs, out_shape, out_specs,
                         sharding_rule)
  if sharding_rule is not None:  # The rule picks the specs.
    rule = _rule.check(sharding_rule, "sharded_triton_call")
    given = [name for name, value in (("out_specs", out_specs),
                                      ("out_reduce", out_reduce))
             if value is not None]
    if given:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: got sharding_rule={rule!r} and {given}; the"
          " rule decides how outputs are split and reduced. Leave"
          f" {' and '.join(given)} out, or drop sharding_rule.")
    return _partition.run(args, _local_call.shard_call, kernel, out_shapes,
                          out_tree, grid, rule,
                          _partition.Layout(mesh, tuple(arg_specs)), kwargs,
                          "sharded_triton_call")
  o_specs = _out_specs_for(out_specs, out_tree, out_shapes, mesh)
  reductions = _reductions_for(out_reduce, out_tree, len(out_shapes), mesh)
  outputs = _Outputs(
      names=_output_names(out_tree),
      shapes=tuple(shape for shape, _ in out_shapes), specs=tuple(o_specs),
      given=out_specs is not None, out_tree=out_tree, reduced=tuple(reductions))
  operands = [_Operand(leaves.names[k], tuple(leaves.leaves[k].shape), spec)
              for k, spec in zip(positions, arg_specs)]
  per_shard = _partition.shard_body(
      args, _local_call.shard_call, kernel, grid, kwargs, out_shapes,
      out_tree, o_specs, mesh, [[r] if r else [] for r in reductions],
      ref_args, lambda flat: _check_varying(flat, outputs, operands, mesh))
  # Refs are arguments of their own: leaf (i, ()).
  ref_specs = tuple(arg_specs[positions.index(leaves.places.index((i, ())))]
                    for i in ref_args)
  arrays = [_specs.place(leaves.leaves[k], spec, mesh)
            for k, spec in zip(positions, arg_specs)]
  mapped = jax.shard_map(
      per_shard, mesh=mesh, in_specs=tuple(arg_specs),
      out_specs=tuple(o_specs) + ref_specs, check_vma=True)
  # jax allows Refs made inside a shard_map only under a trace.
  flat = list((jax.jit(mapped) if ref_args else mapped)(*arrays))
  if ref_args:
    n = len(flat) - len(ref_args)
    return jax.tree_util.tree_unflatten(out_tree, flat[:n]), flat[n:]
  return jax.tree_util.tree_unflatten(out_tree, flat)


def _output_names(out_tree) -> tuple[str, ...]:
  """Each output's pytree path within ``out_shape``, in flattened order."""
  skeleton = jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))
  paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
  return tuple("out_shape" + jax.tree_util.keystr(p) for p, _ in paths)


def _check_varying(flat: Sequence[Any], outputs: _Outputs,
                   operands: Sequence[_Operand], mesh) -> None:
  """Raises if a shard's output varies over a mesh axis its spec lacks."""
  # An axis manual in a caller's shard_map is the caller's to name.
  outer = _specs.manual_axes(mesh)
  order = [a for a in mesh.axis_names if a not in outer]
  for k, x in enumerate(flat):
    varying = _compat.varying_axes(jax.typeof(x)) & set(order)
    if missing := varying - set(_specs.spec_axes(outputs.specs[k])):
      raise _errors.ShardingSpecError(_message(
          k, sorted(varying, key=order.index), sorted(missing, key=order.index),
          outputs, operands, mesh))


def _message(k: int, varying: list, missing: list, outputs: _Outputs,
             operands: Sequence[_Operand], mesh) -> str:
  name, shape, spec = outputs.names[k], outputs.shapes[k], outputs.specs[k]
  sources = [f"{o.where} with spec {_spec_text(o.spec)}" for o in operands
             if set(_specs.spec_axes(o.spec)) & set(varying)]
  why = (f", since inputs are split over them ({', '.join(sources)})"
         if sources else "")
  how = (f"its out_specs entry is {_spec_text(spec)}" if outputs.given else
         "out_specs was left out, so it is P() (replicated)")
  needed = _needed_spec(shape, varying, operands, mesh)
  slice_fix = (
      f"name mesh axes {varying} in its out_specs entry, on the dimensions"
      " of the output they split" if needed is None
      else f"pass {_suggest_specs(outputs, k, needed)}")
  return (
      f"sharded_triton_call: output {k} ({name}, global shape {shape}) varies"
      f" over mesh axes {varying} of mesh {dict(mesh.shape)}{why}, but {how},"
      f" which does not name {missing}. If each shard computes its own slice"
      f" of the output, {slice_fix}. {_reduce_fix(outputs, k, missing)}")


def _reduce_fix(outputs: _Outputs, k: int, missing: list) -> str:
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


def _needed_spec(shape: tuple, varying: list, operands: Sequence[_Operand],
                 mesh) -> P | None:
  """A spec naming ``varying`` on the output's dimensions, or None: an
  operand's of the same shape and axes, else each axis on the one output
  dimension whose size matches one it splits in an operand."""
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
  if any(shape[d] % math.prod(mesh.shape[a] for a in e)
         for d, e in enumerate(entries)):
    return None
  return _specs.spec_of(entries)


class _Shown(str):
  """A text whose repr is itself, to show a pytree of specs."""

  __repr__ = str.__str__


def _suggest_specs(outputs: _Outputs, k: int, spec: P) -> str:
  """``out_specs=...`` with ``spec`` for output ``k``, the others unchanged."""
  if len(outputs.names) == 1:
    return f"out_specs={_spec_text(spec)}"
  leaves = [_Shown(_spec_text(spec if j == k else s))
            for j, s in enumerate(outputs.specs)]
  return f"out_specs={jax.tree_util.tree_unflatten(outputs.out_tree, leaves)!r}"


def _spec_text(spec: P) -> str:
  """A spec as the user writes it: P('x', None)."""
  return "P(" + ", ".join(repr(e) for e in spec) + ")"
