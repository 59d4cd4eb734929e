"""One kernel call per shard of a mesh, in one pass: ``resolve`` (the mesh,
one checked spec per array leaf), ``place``, then ``run`` (the outputs'
plan, or a ``ShardingRule``'s, and one ``jax.shard_map``).

An output varies over every mesh axis an input does, so its ``out_specs``
must name those axes unless ``out_reduce`` reduces over them;
``_check_varying`` says so before ``shard_map`` would, whose message
advises ``check_vma=False`` (one shard's data returned as the whole).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
from jax.sharding import PartitionSpec as P

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import arguments as _arguments
from jt_dist._core import outputs as _outputs
from jt_dist._core import placeholders as _placeholders
from jt_dist._sharding import advice as _advice
from jt_dist._sharding import local_call as _local_call
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import rule as _rule
from jt_dist._sharding import specs as _specs


class Resolved(NamedTuple):
  """A call's mesh and one checked spec per array leaf, in order."""

  mesh: Any
  specs: tuple[P, ...]


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


def resolve(args, mesh, in_specs, out_shape, out_specs, out_reduce,
            rule) -> Resolved:
  """The mesh and the array leaves' specs: from ``in_specs``, else their
  own. With inferred specs, an output split over an axis no input is split
  over is refused: a kernel sized by its inputs would overrun its shard."""
  if rule is not None:  # The rule picks the specs.
    rule = _rule.check(rule, "sharded_triton_call")
    given = [name for name, value in (("out_specs", out_specs),
                                      ("out_reduce", out_reduce))
             if value is not None]
    if given:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: got sharding_rule={rule!r} and {given}; the"
          " rule decides how outputs are split and reduced. Leave"
          f" {' and '.join(given)} out, or drop sharding_rule.")
  flat, arrays = _specs.arrays_of(args)
  mesh = _specs.resolve_mesh(mesh, flat.leaves)
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
        raise _errors.ShardingSpecError(_advice.unsplit_inputs(
            [flat.names[j] for j in arrays],
            [flat.leaves[j].shape for j in arrays], specs,
            any(path for _, path in flat.places), k, out_shapes[k][0], spec,
            out_tree, alone, mesh))
  return Resolved(mesh, tuple(specs))


def place(args, resolved: Resolved):
  """``args`` with each array leaf laid out by its spec on the mesh."""
  flat = _arguments.flatten(args)
  specs = iter(resolved.specs)
  return flat.rebuild([
      _specs.place(leaf, next(specs), resolved.mesh)
      if _specs.is_array(leaf) else leaf for leaf in flat.leaves])


def run(args, kernel, out_shape, grid, resolved: Resolved, out_specs,
        out_reduce, sharding_rule, kwargs, ref_args=()):
  """``sharded_triton_call`` on arrays, resolved; with ``ref_args`` (indices
  of the Refs' values in ``args``) returns ``(outputs, the Refs' new
  values)``."""
  out_shapes, out_tree = _outputs.flatten_out_shape(
      out_shape, allow_empty=bool(ref_args))
  mesh, arg_specs = resolved
  # Tuple operands' leaves are split one by one, as positional arrays are.
  leaves, positions = _specs.arrays_of(args)
  # Checks indices at the caller's line; each shard resolves its own.
  _placeholders.resolve_sizes(args, kwargs)
  if sharding_rule is not None:
    return _partition.run(args, _local_call.shard_call, kernel, out_shapes,
                          out_tree, grid, sharding_rule,
                          _partition.Layout(mesh, arg_specs), kwargs,
                          "sharded_triton_call")
  o_specs = _out_specs_for(out_specs, out_tree, out_shapes, mesh)
  reductions = _reductions_for(out_reduce, out_tree, len(out_shapes), mesh)
  outputs = _advice.Outputs(
      names=_advice.output_names(out_tree),
      shapes=tuple(shape for shape, _ in out_shapes), specs=tuple(o_specs),
      given=out_specs is not None, out_tree=out_tree, reduced=tuple(reductions))
  operands = [_advice.Operand(leaves.names[k], tuple(leaves.leaves[k].shape),
                              spec) for k, spec in zip(positions, arg_specs)]
  per_shard = _partition.shard_body(
      args, _local_call.shard_call, kernel, grid, kwargs, out_shapes,
      out_tree, o_specs, mesh, [[r] if r else [] for r in reductions],
      ref_args, lambda flat: _check_varying(flat, outputs, operands, mesh))
  # Refs are arguments of their own: leaf (i, ()).
  ref_specs = tuple(arg_specs[positions.index(leaves.places.index((i, ())))]
                    for i in ref_args)
  # Placed eagerly already; in a trace, resharded where the specs differ.
  arrays = [_specs.place(leaves.leaves[k], spec, mesh)
            for k, spec in zip(positions, arg_specs)]
  mapped = jax.shard_map(
      per_shard, mesh=mesh, in_specs=arg_specs,
      out_specs=tuple(o_specs) + ref_specs, check_vma=True)
  # jax allows Refs made inside a shard_map only under a trace.
  flat = list((jax.jit(mapped) if ref_args else mapped)(*arrays))
  if ref_args:
    n = len(flat) - len(ref_args)
    return jax.tree_util.tree_unflatten(out_tree, flat[:n]), flat[n:]
  return jax.tree_util.tree_unflatten(out_tree, flat)


def _check_varying(flat: Sequence[Any], outputs: _advice.Outputs,
                   operands: Sequence[_advice.Operand], mesh) -> None:
  """Raises if a shard's output varies over a mesh axis its spec lacks."""
  # An axis manual in a caller's shard_map is the caller's to name.
  outer = _specs.manual_axes(mesh)
  order = [a for a in mesh.axis_names if a not in outer]
  for k, x in enumerate(flat):
    varying = _compat.varying_axes(jax.typeof(x)) & set(order)
    if missing := varying - set(_specs.spec_axes(outputs.specs[k])):
      raise _errors.ShardingSpecError(_advice.varying(
          k, sorted(varying, key=order.index), sorted(missing, key=order.index),
          outputs, operands, mesh))
