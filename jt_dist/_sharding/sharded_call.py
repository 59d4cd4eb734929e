"""``sharded_triton_call``: one kernel call per shard over a device mesh."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from jt_dist._call import api as _api
from jt_dist._core import binding as _binding
from jt_dist._call import operands as _operands
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._call import dispatch as _dispatch
from jt_dist import _errors
from jt_dist._call import refs as _refs
from jt_dist._call import tensordesc as _tensordesc
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import rule as _rule
from jt_dist._sharding import shard_size as _shard_size
from jt_dist._sharding import specs as _specs
from jt_dist._sharding import varying as _varying

_COLLECTIVES = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def _is_spec_leaf(x: Any) -> bool:
  return x is None or isinstance(x, P)


def _out_specs_for(out_specs, out_tree, n_out, out_shapes, mesh) -> list[P]:
  if out_specs is None or isinstance(out_specs, P):
    specs = [out_specs] * n_out
  else:
    leaves, tree = jax.tree_util.tree_flatten(out_specs, is_leaf=_is_spec_leaf)
    if tree != out_tree:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: out_specs {out_specs!r} must be one"
          " PartitionSpec for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}); got the structure {tree}."
      )
    specs = leaves
  return [
      _specs.check_spec(f"output {k}", shape, spec, mesh)
      for k, (spec, (shape, _)) in enumerate(zip(specs, out_shapes))
  ]


def _is_reduction(x: Any) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)


def _reductions_for(out_reduce, out_tree, n_out, mesh) -> list:
  """One (collective, axes) pair or None per output."""
  if out_reduce is None:
    return [None] * n_out
  if _is_reduction(out_reduce):
    entries = [out_reduce] * n_out
  else:
    entries, tree = jax.tree_util.tree_flatten(
        out_reduce, is_leaf=lambda x: x is None or _is_reduction(x))
    if tree != out_tree:
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: out_reduce {out_reduce!r} must be one"
          " (op, axes) pair for every output, or a pytree with the structure"
          f" of out_shape ({out_tree}) holding pairs or None."
      )
  return [_check_reduction(k, e, mesh) for k, e in enumerate(entries)]


def _check_reduction(k: int, entry, mesh):
  if entry is None:
    return None
  op, axes = entry
  if op not in _COLLECTIVES:
    raise ValueError(
        f"sharded_triton_call: out_reduce of output {k} is {entry!r}; the"
        f" collective must be one of {sorted(_COLLECTIVES)}."
    )
  axes = (axes,) if isinstance(axes, str) else tuple(axes)
  unknown = [a for a in axes if a not in mesh.shape]
  if unknown or not axes:
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: out_reduce of output {k} reduces over mesh"
        f" axes {list(axes)}, but the mesh has axes {dict(mesh.shape)}."
    )
  return _COLLECTIVES[op], axes


def _reduction_named(reduction):
  """``(collective, axes)`` as the user wrote it: ``(op, axes)``, or None."""
  if reduction is None:
    return None
  op = next(name for name, f in _COLLECTIVES.items() if f is reduction[0])
  return op, tuple(reduction[1])


def _check_placeholders(args, metaparams) -> None:
  # Resolving against the global arguments checks indices early, at the
  # caller's line; the values used are resolved again inside each shard.
  _shard_size.resolve(args, metaparams)


def _by_rule(args, kernel, out_shapes, out_tree, grid, mesh, arg_specs, rule,
             out_specs, out_reduce, kwargs, recorder):
  """``sharded_triton_call`` with a ``ShardingRule``: the rule picks specs."""
  rule = _rule.check(rule, "sharded_triton_call")
  given = [name for name, value in (("out_specs", out_specs),
                                    ("out_reduce", out_reduce))
           if value is not None]
  if given:
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: got sharding_rule={rule!r} and {given}; the"
        " rule decides how outputs are split and reduced. Leave"
        f" {' and '.join(given)} out, or drop sharding_rule."
    )
  layout = _partition.Layout(mesh, tuple(arg_specs))
  return _partition.run(args, _api.triton_call, kernel, out_shapes, out_tree,
                        grid, rule, layout, kwargs, "sharded_triton_call",
                        recorder=recorder)


def _signature(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
               out_reduce, rule, kwargs):
  """The eager call's cache key (``_dispatch.signature``), or None.

  Scalar values are in it exactly: each shard's body is traced with them.
  """
  if any(isinstance(a, jax.core.Tracer) for a in args):
    return None
  fixed = tuple(_hashable(x) for x in (mesh, in_specs, out_specs, out_reduce))
  # With no mesh given or found on the arguments, the ambient one is used.
  fixed += (jax.sharding.get_abstract_mesh(),)
  return _dispatch.signature(args, kernel, out_shape, grid, fixed + (rule,),
                             kwargs, True)


def _hashable(x: Any) -> Any:
  """A pytree of specs as a hashable key: its structure and leaves."""
  if isinstance(x, list):
    return tuple(x)
  if isinstance(x, dict):
    leaves, tree = jax.tree_util.tree_flatten(x, is_leaf=_is_spec_leaf)
    return tree, tuple(leaves)
  return x


def _refuse_descriptors(args) -> None:
  """TensorDescriptors describe global arrays; shards need their own.

  Raises:
    NotImplementedError: an argument is a ``jt_dist.TensorDescriptor``.
  """
  for i, arg in enumerate(args):
    if isinstance(arg, _tensordesc.TensorDescriptor):
      raise NotImplementedError(
          f"sharded_triton_call: args[{i}] is a TensorDescriptor, whose"
          " shape and strides are those of the global array, not of a"
          " shard. Pass the array, and build the descriptor per shard"
          " inside jax.shard_map: jax.shard_map(lambda x: triton_call("
          "TensorDescriptor.from_array(x, block_shape), ...), ...).")


def sharded_triton_call(
    *args: Any,
    kernel: Any,
    out_shape: Any = None,
    grid: Any,
    mesh: Any = None,
    in_specs: Any = None,
    out_specs: Any = None,
    out_reduce: Any = None,
    out_type: Any = None,
    sharding_rule: Any = None,
    **kwargs: Any,
) -> Any:
  """Runs a Triton kernel once per shard of a device mesh, via ``shard_map``.

  The kernel is written for one shard. ``out_shape`` is global; each shard's
  output shape follows from ``out_specs`` and the mesh. Sizes the kernel or
  the grid needs per shard come from ``jt_dist.shard_size``, which resolves
  inside the shard, so a grid such as
  ``lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)`` sees local sizes.

  Args:
    *args: the kernel's inputs, as for ``triton_call``; arrays are global.
      A ``jax.Ref`` is split by its ``in_specs`` entry like an array, and
      each shard's kernel updates its shard of it in place; a Ref must be
      split over every mesh axis its new value varies over.
    kernel: a ``@triton.jit`` kernel, optionally autotuned.
    out_shape: the global outputs: an object with ``.shape`` and ``.dtype``,
      or a pytree of them.
    grid: the per-shard grid: an int, a tuple, or a callable of the
      metaparams and scalar arguments (local values).
    mesh: the ``jax.sharding.Mesh``; by default the mesh of the arguments'
      shardings, else the ambient mesh (``jax.set_mesh``).
    in_specs: one ``PartitionSpec`` per array argument, in order; by default
      each argument's own sharding spec (replicated when it has none). As in
      ``jax.shard_map``, a prefix of the arguments: a tuple operand takes
      one entry, a ``PartitionSpec`` for all its arrays or a tuple with one
      entry per element (None for a scalar); each array leaf is split on
      its own, and the kernel gets a tuple of shards.
    out_specs: one ``PartitionSpec`` for all outputs, or a pytree of them
      matching ``out_shape``; replicated (``P()``) by default, which is
      right only for outputs that vary over no mesh axis (all inputs
      replicated) or that ``out_reduce`` reduces over every axis they vary
      over.
    out_reduce: partial results to reduce across shards before they leave
      them: ``(op, axes)`` with op ``"sum"``, ``"max"`` or ``"min"``, for
      every output, or a pytree matching ``out_shape`` of such pairs or None.
    out_type: another name for ``out_shape``.
    sharding_rule: a ``jt_dist.ShardingRule``; it decides the specs, so
      ``out_specs`` and ``out_reduce`` must be left out. ``in_specs`` (or
      the arguments' shardings) then give where the operands are now;
      those that disagree with the rule are resharded.
    **kwargs: every other ``triton_call`` keyword (``num_warps``,
      ``input_output_aliases``, ...) and the kernel's metaparams.

  Returns:
    The global outputs, sharded by ``out_specs``, in the structure of
    ``out_shape``.

  Raises:
    jt_dist.ShardingSpecError: no mesh, the wrong number of ``in_specs``,
      unknown or repeated axes, a spec longer than an array's rank, a
      dimension its axes do not divide, or an output that varies over a
      mesh axis (as an input split over it does) that neither its
      ``out_specs`` entry names nor ``out_reduce`` reduces over.
    ValueError: a ``shard_size`` pointing at a scalar or a missing argument.
    TypeError, jt_dist.KernelBindingError: as for ``triton_call``.
  """
  out_shape = _api.resolve_out_shape(out_shape, out_type)
  _refuse_descriptors(args)
  # Keyword operands become positional, so in_specs and rules see them.
  args, kwargs = _operands.merge_keywords(kernel, args, kwargs)
  if _refs.has_refs(args):
    return _with_refs(args, kernel, out_shape, grid, mesh, in_specs,
                      out_specs, out_reduce, sharding_rule, kwargs)
  return _sharded(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
                  out_reduce, sharding_rule, kwargs)


def _with_refs(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
               out_reduce, rule, kwargs):
  """A sharded call with Ref arguments: each shard updates its shard of them.

  The Refs' values go in as arrays; each shard wraps its piece in a fresh
  Ref for the kernel, and hands the piece back as an extra output split as
  the Ref's input is; the new global values are written back.
  """
  _refs.check(args, kwargs, rule, "sharded_triton_call")
  ref_args = _refs.top_level(args, "sharded_triton_call")
  values = list(args)
  for i in ref_args:
    values[i] = args[i][...]
  outs, updated = _sharded(values, kernel, out_shape, grid, mesh, in_specs,
                           out_specs, out_reduce, None, kwargs,
                           ref_args=ref_args)
  for i, new in zip(ref_args, updated):
    if not isinstance(new, jax.core.Tracer):
      # An eager Ref keeps its placement; the update comes back as the
      # shard_map placed it.
      new = jax.device_put(new, values[i].sharding)
    args[i][...] = new
  return outs


def _shard_body(leaves, arg_specs, kernel, grid, kwargs, mesh, ref_args,
                outs):
  """The function each device runs: the kernel on its shards, reduced.

  Args:
    leaves: the call's ``pytree_args.FlatArgs``; the body takes its array
      leaves' shards, in order, and rebuilds the tuples around them.
    arg_specs: the array leaves' specs.
    kernel, grid, kwargs: as for ``triton_call``.
    mesh: the mesh.
    ref_args: argument indices of Refs' values (see ``_sharded``).
    outs: ``(out_shapes, out_tree, out_specs, reductions, specs_given)``.
  """
  out_shapes, out_tree, o_specs, reductions, given = outs
  local_out = jax.tree_util.tree_unflatten(out_tree, [
      jax.ShapeDtypeStruct(_specs.local_shape(shape, spec, mesh), dtype)
      for (shape, dtype), spec in zip(out_shapes, o_specs)
  ])
  is_array = [_specs.is_array(a) for a in leaves.leaves]
  outputs = _varying.Outputs(
      names=_varying.output_names(out_tree),
      shapes=tuple(shape for shape, _ in out_shapes), specs=tuple(o_specs),
      given=given, out_tree=out_tree,
      reduced=tuple(_reduction_named(r) for r in reductions))
  names = leaves.names
  operands = [
      _varying.Operand(names[k], tuple(leaves.leaves[k].shape), spec)
      for k, spec in zip([k for k, f in enumerate(is_array) if f], arg_specs)]

  def per_shard(*local_arrays):
    it = iter(local_arrays)
    local_args = leaves.rebuild(
        [next(it) if flag else a for a, flag in zip(leaves.leaves, is_array)])
    result, updated = _refs.with_fresh_refs(
        local_args, ref_args, lambda *a: _api.triton_call(
            *a, kernel=kernel, out_shape=local_out, grid=grid, **kwargs))
    flat = jax.tree_util.tree_leaves(result)
    flat = [x if r is None else r[0](x, r[1]) for x, r in zip(flat, reductions)]
    _varying.check(flat, outputs, operands, mesh)
    return tuple(flat) + tuple(updated)

  return per_shard


def _sharded(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
             out_reduce, sharding_rule, kwargs, ref_args=()):
  """``sharded_triton_call`` on arrays; with ``ref_args``, also their updates.

  ``ref_args``: argument indices whose arrays are Refs' values; the call
  then returns ``(outputs, those arrays' new values)`` and records nothing.
  """
  key = None if ref_args else _signature(
      args, kernel, out_shape, grid, mesh, in_specs, out_specs, out_reduce,
      sharding_rule, kwargs)
  entry, key = _dispatch.lookup(key, grid)
  if entry is not None:
    return entry(args)
  recorder = (None if key is None
              else _dispatch.replay_recorder(key, kernel, grid))
  out_shapes, out_tree = _binding.flatten_out_shape(
      out_shape, allow_empty=bool(ref_args))
  # Tuple operands' leaves are split one by one, as positional arrays are.
  leaves = _pytree_args.flatten(args)
  mesh = _specs.resolve_mesh(mesh, leaves.leaves)
  _check_placeholders(args, {k: v for k, v in kwargs.items()})
  arg_specs = _specs.in_specs_for(in_specs, args, mesh)
  if sharding_rule is not None:
    return _by_rule(args, kernel, out_shapes, out_tree, grid, mesh, arg_specs,
                    sharding_rule, out_specs, out_reduce, kwargs, recorder)
  o_specs = _out_specs_for(out_specs, out_tree, len(out_shapes), out_shapes,
                           mesh)
  reductions = _reductions_for(out_reduce, out_tree, len(out_shapes), mesh)
  is_array = [_specs.is_array(a) for a in leaves.leaves]
  positions = [k for k, flag in enumerate(is_array) if flag]
  per_shard = _shard_body(
      leaves, arg_specs, kernel, grid, kwargs, mesh, ref_args,
      (out_shapes, out_tree, o_specs, reductions, out_specs is not None))
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
  if recorder is not None and not leaves.has_tuples and isinstance(
      mesh, jax.sharding.Mesh) and not any(
          isinstance(a, jax.core.Tracer) for a in arrays):
    mapped = recorder(args, positions, arg_specs, mesh, mapped, out_tree)
  flat = list(mapped(*arrays))
  if ref_args:
    n = len(flat) - len(ref_args)
    return jax.tree_util.tree_unflatten(out_tree, flat[:n]), flat[n:]
  return jax.tree_util.tree_unflatten(out_tree, flat)
