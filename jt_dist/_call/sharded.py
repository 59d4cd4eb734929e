"""``sharded_triton_call``'s front door: its key, its cache, its Refs.

The per-shard call itself (specs, reductions, the ``shard_map``) is
``jt_dist._sharding.sharded_call``; this module computes an eager call's
signature first, from the arguments as given, and runs a cached jitted
``shard_map`` on a hit, before any checking.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from jt_dist._call import api as _api
from jt_dist._call import dispatch as _dispatch
from jt_dist._call import lean as _lean
from jt_dist._call import operands as _operands
from jt_dist._call import refs as _refs
from jt_dist._call import tensordesc as _tensordesc
from jt_dist._sharding import replay as _replay
from jt_dist._sharding import sharded_call as _sharded_call


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
    out_shape = _api.resolve_out_shape(out_shape, out_type)
  specs = (mesh, in_specs, out_specs, out_reduce, sharding_rule)
  # Arrays only, laid out as before: the cheapest key (jt_dist._call.lean).
  lean_key = _lean.sharded_key(args, kernel, out_shape, grid, specs, kwargs)
  if lean_key is not None:
    outs = _lean.call(lean_key, args)
    if outs is not _lean.MISS:
      return outs
  found = _signature(args, kernel, out_shape, grid, specs, kwargs)
  if found is not None:
    entry = _dispatch.lookup(found[0], grid)
    if entry is not None:
      _lean.register(lean_key, entry, len(args))
      return entry(found[1])
  return _first_call(args, kernel, out_shape, grid, specs, kwargs,
                     None if found is None else found[0])


def _first_call(args, kernel, out_shape, grid, specs, kwargs, signature):
  """A call with no entry: checks it, runs it, and files its entry."""
  mesh, in_specs, out_specs, out_reduce, rule = specs
  _refuse_descriptors(args, kwargs)
  # Keyword operands become positional, so in_specs and rules see them.
  args, kwargs = _operands.merge_keywords(kernel, args, kwargs)
  if _refs.has_refs(args):
    return _with_refs(args, kernel, out_shape, grid, mesh, in_specs,
                      out_specs, out_reduce, rule, kwargs)
  try:
    hash(signature)
  except TypeError:  # An unhashable part: no entry.
    signature = None
  recorder = (None if signature is None
              else _replay.recorder(signature, kernel, grid))
  return _sharded_call.run(args, _api.triton_call, kernel, out_shape, grid,
                           mesh, in_specs, out_specs, out_reduce, rule,
                           kwargs, recorder=recorder)


_CONTAINERS = frozenset((list, dict))


def _signature(args, kernel, out_shape, grid, specs, kwargs):
  """``(key, args)`` of an eager call (``_dispatch.key``), or None.

  Scalar values are in it exactly: each shard's body is traced with them.
  """
  try:
    # With no mesh given or found on the arguments, the ambient one is used.
    if _CONTAINERS.isdisjoint(map(type, specs)):  # Tuples, specs, meshes.
      fixed = specs + (jax.sharding.get_abstract_mesh(),)
    else:
      fixed = (tuple(map(_hashable, specs))
               + (jax.sharding.get_abstract_mesh(),))
  except Exception:  # pylint: disable=broad-except
    return None
  return _dispatch.key(args, kernel, out_shape, grid, fixed, kwargs, True)


def _is_spec_leaf(x: Any) -> bool:
  return x is None or isinstance(x, P)


def _hashable(x: Any) -> Any:
  """A pytree of specs as a hashable key: its structure and leaves."""
  if isinstance(x, list):
    return tuple(x)
  if isinstance(x, dict):
    leaves, tree = jax.tree_util.tree_flatten(x, is_leaf=_is_spec_leaf)
    return tree, tuple(leaves)
  return x


def _refuse_descriptors(args, kwargs) -> None:
  """TensorDescriptors describe global arrays; shards need their own.

  Keyword operands are checked too: given by name, a descriptor would
  otherwise reach every shard whole.

  Raises:
    NotImplementedError: an argument is a ``jt_dist.TensorDescriptor``.
  """
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
  outs, updated = _sharded_call.run(
      values, _api.triton_call, kernel, out_shape, grid, mesh, in_specs,
      out_specs, out_reduce, None, kwargs, ref_args=ref_args)
  for i, new in zip(ref_args, updated):
    if not isinstance(new, jax.core.Tracer):
      # An eager Ref keeps its placement; the update comes back as the
      # shard_map placed it.
      new = jax.device_put(new, values[i].sharding)
    args[i][...] = new
  return outs
