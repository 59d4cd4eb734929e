"""``sharded_triton_call``'s front door: its memo and its Refs.

An eager call fixes its mesh and specs from its arguments, then runs the
jitted ``shard_map`` made for them.
"""

from __future__ import annotations

from typing import Any

import jax

from jt_dist._call import api as _api
from jt_dist._call import kernel_call as _kernel_call
from jt_dist._call import memo as _memo
from jt_dist._core import exact as _exact
from jt_dist._core import host_faults as _host_faults
from jt_dist._core import operands as _operands
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import tensordesc as _tensordesc
from jt_dist._sharding import refs as _refs
from jt_dist._sharding import sharded_call as _sharded_call
from jt_dist._sharding import specs as _specs

OPERAND = _kernel_call.OPERAND


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
  if out_type is not None:
    out_shape = _kernel_call.resolve_out_shape(out_shape, out_type)
  _refuse_descriptors(args, kwargs)
  # Keyword operands become positional, so in_specs and rules see them.
  kernel, args, kwargs = _operands.merge_keywords(kernel, args, kwargs)
  if _refs.has_refs(args):
    return _with_refs(args, kernel, out_shape, grid, mesh, in_specs,
                      out_specs, out_reduce, sharding_rule, kwargs)
  if any(isinstance(leaf, jax.core.Tracer)
         for leaf in jax.tree_util.tree_leaves(args)):
    # Inside a trace: jax's own jit (the caller's) is the cache.
    return _sharded_call.run(args, kernel, out_shape, grid, mesh, in_specs,
                             out_specs, out_reduce, sharding_rule, kwargs)
  # Eagerly, the mesh and the in_specs the arguments imply are fixed now:
  # the jitted call's trace sees no concrete shardings.
  mesh = _specs.resolve_mesh(mesh, _pytree_args.flatten(args).leaves)
  leaf_specs = _sharded_call.leaf_specs(args, mesh, in_specs, out_shape,
                                        out_specs, sharding_rule)
  if in_specs is None:
    in_specs = _per_argument(args, leaf_specs)
  args = _placed(args, leaf_specs, mesh)
  statics = tuple(OPERAND if _api._is_operand(a) else a for a in args)  # pylint: disable=protected-access
  specs = (mesh, in_specs, out_specs, out_reduce, sharding_rule)
  spec_leaves, spec_tree = jax.tree_util.tree_flatten(
      specs, is_leaf=_sharded_call.is_spec_leaf)
  try:
    key = (id(kernel), _memo.out_key(out_shape), _memo.grid_key(grid),
           _exact.dict_key(kwargs),
           tuple(s if s is OPERAND else _exact.key(s) for s in statics),
           spec_tree, tuple(spec_leaves))
    call = _memo.sharded_calls.get(key)
  except TypeError:
    key = call = None
  if call is None or call.kernel is not kernel:
    call = _ShardedCall(kernel, out_shape, grid, specs, kwargs, statics)
    if key is not None:
      _memo.sharded_calls.put(key, call)
  return call(*[a for a, s in zip(args, statics) if s is OPERAND])


class _ShardedCall:
  """An eager ``sharded_triton_call``'s jitted ``shard_map``."""

  def __init__(self, kernel, out_shape, grid, specs, kwargs, statics):
    self.kernel = kernel

    def traced(*operands):
      it = iter(operands)
      args = [next(it) if s is OPERAND else s for s in statics]
      return _sharded_call.run(args, kernel, out_shape, grid, *specs, kwargs)

    self._jitted = jax.jit(traced)

  def __call__(self, *operands):
    try:
      return self._jitted(*operands)
    except Exception as e:  # pylint: disable=broad-except
      _host_faults.raise_original(e)
      raise


def _placed(args, leaf_specs, mesh):
  """``args`` with each array leaf laid out on ``mesh`` by its spec: the
  jitted call refuses operands on devices other than the mesh's."""
  flat = _pytree_args.flatten(args)
  specs = iter(leaf_specs)
  return flat.rebuild([
      _specs.place(leaf, next(specs), mesh, equivalent_ok=True)
      if _specs.is_array(leaf)
      else leaf for leaf in flat.leaves])


def _per_argument(args, leaf_specs):
  """Specs of array leaves as ``in_specs``: one entry per array argument
  (a tuple operand's nested as it is, None for a scalar)."""
  it = iter(leaf_specs)

  def entry(arg):
    if _pytree_args.is_tuple(arg):
      return tuple(entry(item) for item in arg)
    return next(it) if _specs.is_array(arg) else None

  return tuple(entry(arg) for arg in args
               if any(_specs.is_array(leaf)
                      for leaf in jax.tree_util.tree_leaves(arg)))


def _refuse_descriptors(args, kwargs) -> None:
  """TensorDescriptors describe global arrays; shards need their own (a
  keyword operand's too, or it would reach every shard whole)."""
  given = [(f"args[{i}]", arg) for i, arg in enumerate(args)]
  given += [(f"the keyword operand {name}=", value)
            for name, value in kwargs.items()]
  for where, arg in given:
    if isinstance(arg, _tensordesc.TensorDescriptor):
      raise NotImplementedError(
          f"sharded_triton_call: {where} is a TensorDescriptor, whose"
          " shape and strides are those of the global array, not of a"
          " shard. Pass the array, and build the descriptor per shard"
          " inside jax.shard_map: jax.shard_map(lambda x: triton_call("
          "TensorDescriptor.from_array(x, block_shape), ...), ...).")


def _with_refs(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
               out_reduce, rule, kwargs):
  """A sharded call with Ref arguments: their values go in as arrays, and
  come back as extra outputs, split as the inputs, to be written back."""
  _refs.check(args, kwargs.get("input_output_aliases"), rule,
              "sharded_triton_call")
  ref_args = _refs.top_level(args, "sharded_triton_call")
  values = [a[...] if i in ref_args else a for i, a in enumerate(args)]
  outs, updated = _sharded_call.run(
      values, kernel, out_shape, grid, mesh, in_specs,
      out_specs, out_reduce, None, kwargs, ref_args=ref_args)
  for i, new in zip(ref_args, updated):
    if not isinstance(new, jax.core.Tracer):
      # An eager Ref keeps its placement, whatever the shard_map's.
      new = jax.device_put(new, values[i].sharding)
    args[i][...] = new
  return outs
