"""One kernel call per shard over a device mesh (``sharded_triton_call``).

The front door (``jt_dist._call.sharded``) merges keyword operands and
handles Refs; each shard runs ``jt_dist._sharding.local_call``.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from jt_dist import _errors
from jt_dist._core import binding as _binding
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._sharding import local_call as _local_call
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import rule as _rule
from jt_dist._core import shard_size as _shard_size
from jt_dist._sharding import specs as _specs
from jt_dist._sharding import varying as _varying

def is_spec_leaf(x: Any) -> bool:
  return x is None or isinstance(x, P)


def _out_specs_for(out_specs, out_tree, out_shapes, mesh) -> list[P]:
  if out_specs is None or isinstance(out_specs, P):
    specs = [out_specs] * len(out_shapes)
  else:
    leaves, tree = jax.tree_util.tree_flatten(out_specs, is_leaf=is_spec_leaf)
    if tree != out_tree:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: out_specs {out_specs!r} must be one"
          " PartitionSpec for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}); got the structure {tree}.")
    specs = leaves
  return [
      _specs.check_spec(f"output {k}", shape, spec, mesh)
      for k, (spec, (shape, _)) in enumerate(zip(specs, out_shapes))
  ]


def _is_reduction(x: Any) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)


def _reductions_for(out_reduce, out_tree, n_out, mesh) -> list:
  """One (collective, axes) pair or None per output."""
  if out_reduce is None or _is_reduction(out_reduce):
    entries = [out_reduce] * n_out
  else:
    entries, tree = jax.tree_util.tree_flatten(
        out_reduce, is_leaf=lambda x: x is None or _is_reduction(x))
    if tree != out_tree:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: out_reduce {out_reduce!r} must be one"
          " (op, axes) pair for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}) holding pairs or None.")
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


def infer_in_specs(args, mesh, out_shape, out_specs, sharding_rule) -> list[P]:
  """The array leaves' specs when ``in_specs`` are left out: their own.

  Each array's spec comes from its sharding on ``mesh``; one with none
  there (a NumPy array, an array on one device) is taken as replicated.

  Raises:
    ShardingSpecError: ``out_specs`` split an output over a mesh axis that
      none of those specs splits. The shards along it would get the same
      inputs and write the same result into buffers a fraction of the
      output's size (a kernel sized by its inputs, through ``shard_size``,
      writes past them): the inputs were meant to be split, and
      ``in_specs`` must say how. Axes already manual outside the call
      (inside the caller's ``shard_map``) are not the call's to split.
  """
  specs = _specs.in_specs_for(None, args, mesh)
  if sharding_rule is None and out_specs is not None and specs:
    out_shapes, out_tree = _binding.flatten_out_shape(out_shape,
                                                      allow_empty=True)
    o_specs = _out_specs_for(out_specs, out_tree, out_shapes, mesh)
    split = {a for s in specs for a in _specs.spec_axes(s)}
    split |= _specs.manual_axes(mesh)
    for k, spec in enumerate(o_specs):
      alone = [a for a in _specs.spec_axes(spec) if a not in split]
      if alone:
        raise _errors.ShardingSpecError(_unsplit_inputs_message(
            args, specs, k, out_shapes[k][0], spec, out_tree, alone, mesh))
  return specs


def _unsplit_inputs_message(args, specs, k, shape, spec, out_tree, alone,
                            mesh) -> str:
  leaves = _pytree_args.flatten(args)
  names = [name for name, leaf in zip(leaves.names, leaves.leaves)
           if _specs.is_array(leaf)]
  inferred = ", ".join(f"{n} {_varying.spec_text(_specs.trimmed(s))}"
                       for n, s in zip(names, specs))
  local = _specs.local_shape(shape, spec, mesh)
  name = _varying.output_names(out_tree)[k]
  suggestion = "pass in_specs (one PartitionSpec per array argument)"
  if not leaves.has_tuples:
    # Inputs of the output's shape split as it is; the others replicated.
    entries = [_varying.spec_text(spec if tuple(leaf.shape) == tuple(shape)
                                  else P())
               for leaf in leaves.leaves if _specs.is_array(leaf)]
    comma = "," if len(entries) == 1 else ""
    suggestion = f"pass in_specs=({', '.join(entries)}{comma})"
  return (
      f"sharded_triton_call: out_specs split output {k} ({name}, global"
      f" shape {tuple(shape)}) over mesh axes {alone} (its entry is"
      f" {_varying.spec_text(spec)}), but no array argument is split over"
      " them: in_specs were left out, so each argument's spec comes from"
      f" its sharding on mesh {dict(mesh.shape)}: {inferred} (an array with"
      " no sharding there, such as a NumPy array or an array on one device,"
      f" is replicated). The shards along {alone} would get the same"
      f" inputs and each write its output into a shard of shape {local},"
      " which a kernel sized by its inputs overruns. To split the inputs as"
      f" the output is split, {suggestion}; if every shard is meant to"
      " compute the same slice, give the replicated in_specs explicitly.")


def _by_rule(args, kernel, out_shapes, out_tree, grid, mesh, arg_specs, rule,
             out_specs, out_reduce, kwargs):
  """``sharded_triton_call`` with a ``ShardingRule``: the rule picks specs."""
  rule = _rule.check(rule, "sharded_triton_call")
  given = [name for name, value in (("out_specs", out_specs),
                                    ("out_reduce", out_reduce))
           if value is not None]
  if given:
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: got sharding_rule={rule!r} and {given}; the"
        " rule decides how outputs are split and reduced. Leave"
        f" {' and '.join(given)} out, or drop sharding_rule.")
  layout = _partition.Layout(mesh, tuple(arg_specs))
  return _partition.run(args, _local_call.shard_call, kernel, out_shapes,
                        out_tree, grid, rule, layout, kwargs,
                        "sharded_triton_call")


def run(args, kernel, out_shape, grid, mesh, in_specs,
        out_specs, out_reduce, sharding_rule, kwargs, ref_args=()):
  """``sharded_triton_call`` on arrays; with ``ref_args``, also their updates.

  ``args`` has keyword operands merged in, and Refs' values in place of the
  Refs at ``ref_args``; the call then returns ``(outputs, their new
  values)``.
  """
  out_shapes, out_tree = _binding.flatten_out_shape(
      out_shape, allow_empty=bool(ref_args))
  # Tuple operands' leaves are split one by one, as positional arrays are.
  leaves = _pytree_args.flatten(args)
  mesh = _specs.resolve_mesh(mesh, leaves.leaves)
  # Resolving against the global arguments checks indices early, at the
  # caller's line; the values used are resolved again inside each shard.
  _shard_size.resolve(args, kwargs)
  if in_specs is None:
    arg_specs = infer_in_specs(args, mesh, out_shape, out_specs,
                               sharding_rule)
  else:
    arg_specs = _specs.in_specs_for(in_specs, args, mesh)
  if sharding_rule is not None:
    return _by_rule(args, kernel, out_shapes, out_tree, grid, mesh,
                    arg_specs, sharding_rule, out_specs, out_reduce, kwargs)
  o_specs = _out_specs_for(out_specs, out_tree, out_shapes, mesh)
  reductions = _reductions_for(out_reduce, out_tree, len(out_shapes), mesh)
  positions = [k for k, a in enumerate(leaves.leaves) if _specs.is_array(a)]
  outputs = _varying.Outputs(
      names=_varying.output_names(out_tree),
      shapes=tuple(shape for shape, _ in out_shapes), specs=tuple(o_specs),
      given=out_specs is not None, out_tree=out_tree, reduced=tuple(reductions))
  per_shard = _shard_body(leaves, positions, arg_specs, kernel, grid, kwargs,
                          mesh, ref_args, out_shapes, outputs)
  ref_specs = tuple(arg_specs[positions.index(leaves.index_of(i))]
                    for i in ref_args)
  arrays = [_specs.place(leaves.leaves[k], spec, mesh)
            for k, spec in zip(positions, arg_specs)]
  mapped = jax.shard_map(
      per_shard, mesh=mesh, in_specs=tuple(arg_specs),
      out_specs=tuple(o_specs) + ref_specs, check_vma=True)
  if ref_args:
    # The shards' Refs live inside the shard_map, which jax allows only
    # under a trace.
    mapped = jax.jit(mapped)
  flat = list(mapped(*arrays))
  if ref_args:
    n = len(flat) - len(ref_args)
    return jax.tree_util.tree_unflatten(out_tree, flat[:n]), flat[n:]
  return jax.tree_util.tree_unflatten(out_tree, flat)


def _shard_body(leaves, positions, arg_specs, kernel, grid, kwargs, mesh,
                ref_args, out_shapes, outputs):
  """The function each device runs: the kernel on its shards, reduced.

  It takes the shards of ``leaves``' arrays (at ``positions``), in order,
  rebuilds the tuples around them, and gives each Ref's value (at
  ``ref_args``) to the kernel as a new Ref, whose value it returns after
  the outputs.
  """
  local_out = jax.tree_util.tree_unflatten(outputs.out_tree, [
      jax.ShapeDtypeStruct(_specs.local_shape(shape, spec, mesh), dtype)
      for (shape, dtype), spec in zip(out_shapes, outputs.specs)])
  operands = [
      _varying.Operand(leaves.names[k], tuple(leaves.leaves[k].shape), spec)
      for k, spec in zip(positions, arg_specs)]

  def per_shard(*local_arrays):
    local_args = _partition.with_arrays(leaves, positions, local_arrays)
    for i in ref_args:
      local_args[i] = jax.new_ref(local_args[i])
    result = _local_call.shard_call(
        *local_args, kernel=kernel, out_shape=local_out, grid=grid, **kwargs)
    flat = [x if r is None else _specs.COLLECTIVES[r[0]](x, r[1])
            for x, r in zip(jax.tree_util.tree_leaves(result),
                            outputs.reduced)]
    _varying.check(flat, outputs, operands, mesh)
    return (*flat, *(local_args[i][...] for i in ref_args))

  return per_shard
