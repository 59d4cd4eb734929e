"""``sharded_kernel_call``, a ``jax.jit`` of ``jt_dist._sharding.mesh_call``'s
``shard_map``, and ``sharded_triton_call``, its memo's drop-in front door."""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any, Sequence

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.sharding import SingleDeviceSharding

from jt_dist._call import api as _api
from jt_dist._call import kernel_call as _kernel_call
from jt_dist._call import memo as _memo
from jt_dist._core import arguments as _arguments
from jt_dist._core import exact as _exact
from jt_dist._core import host_faults as _host_faults
from jt_dist._core import placeholders as _placeholders
from jt_dist._core import tensordesc as _tensordesc
from jt_dist._sharding import mesh_call as _mesh_call
from jt_dist._sharding import refs as _refs

OPERAND = _kernel_call.OPERAND
_SHAPE_DTYPE = jax.ShapeDtypeStruct
_SHARDING = operator.attrgetter("sharding")
# The classes of concrete jax.Arrays (jaxlib's ArrayImpl), as they are met.
_ARRAYS: set[type] = set()
# What a plain key files by value (a float is not: 0.0 == -0.0).
_BY_VALUE = frozenset((int, bool, _placeholders.ShardSize))


class ShardedKernelCall:
  """A Triton kernel run once per shard of a mesh, as a function.

  Call it with the kernel's operands, global arrays, in order. Positional
  values fixed when it was made (``statics``: scalars, ``shard_size``
  placeholders) keep their places among them.
  """

  def __init__(self, kernel, out_shape, grid, mesh, in_specs, out_specs,
               out_reduce, sharding_rule, kwargs: dict,
               statics: Sequence[Any] = ()):
    self.kernel = kernel
    self._call = (out_shape, grid, out_specs, out_reduce, sharding_rule,
                  kwargs)
    self._where = (mesh, in_specs)
    self.statics = tuple(statics)
    self.passed = tuple(s is OPERAND for s in self.statics)
    # A given mesh and in_specs resolve alike in the trace (_jitted); else
    # they are found on the operands, static (_by_layout).
    self._in_trace = mesh is not None and in_specs is not None
    # Per operand, the shardings taken as they are; None: each call places.
    self._accepted = None
    self._jitted = jax.jit(functools.partial(self._traced, None))
    self._by_layout = jax.jit(self._traced, static_argnums=0)

  def _args(self, operands: Sequence[Any]) -> list[Any]:
    it = iter(operands)
    args = [next(it) if s is OPERAND else s for s in self.statics]
    args.extend(it)
    return args

  def _resolve(self, args):
    out_shape, _, out_specs, out_reduce, rule, _ = self._call
    return _mesh_call.resolve(args, *self._where, out_shape, out_specs,
                              out_reduce, rule)

  def _traced(self, resolved, *operands):
    args = self._args(operands)
    out_shape, grid, out_specs, out_reduce, rule, kwargs = self._call
    return _mesh_call.run(args, self.kernel, out_shape, grid,
                          resolved or self._resolve(args), out_specs,
                          out_reduce, rule, kwargs)

  def __call__(self, *operands: Any) -> Any:
    accepted = self._accepted
    if accepted is not None and len(operands) == len(accepted):
      try:  # In C: a Tracer's, or a NumPy array's, sharding is missing.
        laid_out = all(map(operator.contains, accepted,
                           map(_SHARDING, operands)))
      except AttributeError:
        laid_out = False
      if laid_out:  # Laid out as the call wants: jax's dispatch alone.
        return self._run(None, operands)
    if any(isinstance(x, jax.core.Tracer)
           for x in jax.tree_util.tree_leaves(operands)):
      # In the caller's trace, where the caller's jit is the cache.
      return self._traced(None, *operands)
    args = self._args(operands)
    resolved = self._resolve(args)
    placed = _mesh_call.place(args, resolved)
    if self.statics:
      n = len(self.statics)
      placed = [*itertools.compress(placed[:n], self.passed), *placed[n:]]
    if self._in_trace:
      self._accepted = _accepted(operands, resolved)
      resolved = None
    return self._run(resolved, placed)

  def _run(self, resolved, operands):
    try:
      if resolved is None:
        return self._jitted(*operands)
      return self._by_layout(resolved, *operands)
    except KeyboardInterrupt:
      _host_faults.abandon_launches()  # The other devices' launches stop.
      raise
    except Exception as e:  # pylint: disable=broad-except
      _host_faults.raise_original(e)
      raise

  def __repr__(self) -> str:
    name = getattr(getattr(self.kernel, "fn", None), "__name__", self.kernel)
    return (f"jt_dist.sharded_kernel_call({name}, mesh={self._where[0]},"
            f" in_specs={self._where[1]!r})")


def _accepted(operands, resolved):
  """Per operand, the shardings taken as they are; None for a non-array."""
  if len(resolved.specs) != len(operands):
    return None
  accepted = []
  for x, spec in zip(operands, resolved.specs):
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
      return None
    ok = (NamedSharding(resolved.mesh, spec),)
    if resolved.mesh.size == 1:  # On the mesh's one device, as placed.
      ok += (SingleDeviceSharding(resolved.mesh.devices.flat[0]),)
    # The operand's own sharding object first, where it is one of them:
    # arrays made by one executable share it, and `in` tries `is` first.
    if x.sharding in ok:
      ok = (x.sharding, *(s for s in ok if s != x.sharding))
    accepted.append(ok)
  return tuple(accepted)


def sharded_kernel_call(kernel: Any, *, out_shape: Any = None, grid: Any,
                        mesh: Any = None, in_specs: Any = None,
                        out_specs: Any = None, out_reduce: Any = None,
                        sharding_rule: Any = None,
                        **options_and_metaparams: Any) -> ShardedKernelCall:
  """Makes a function that runs ``kernel`` once per shard of a mesh.

  The curried form of ``sharded_triton_call``, as ``kernel_call`` is of
  ``triton_call``: everything but the operands is given once. With
  ``mesh`` and ``in_specs`` given, a repeated call on operands already laid
  out by ``in_specs`` (a previous call's outputs, say) goes through
  ``jax.jit``'s own dispatch; other operands are first moved there with
  one ``jax.device_put`` each. Under ``jax.jit`` it binds in the caller's
  trace::

      add = jt_dist.sharded_kernel_call(
          add_kernel, out_shape=x, grid=grid, mesh=mesh,
          in_specs=(P("x"), P("x")), out_specs=P("x"),
          n=jt_dist.shard_size(0), BLOCK=1024)
      for _ in range(steps):
        x = add(x, y)

  Args:
    kernel: a ``@triton.jit`` kernel, optionally autotuned.
    out_shape: as for ``sharded_triton_call``.
    grid: as for ``sharded_triton_call``.
    mesh: as for ``sharded_triton_call``.
    in_specs: as for ``sharded_triton_call``.
    out_specs: as for ``sharded_triton_call``.
    out_reduce: as for ``sharded_triton_call``.
    sharding_rule: as for ``sharded_triton_call``.
    **options_and_metaparams: ``triton_call``'s options and the kernel's
      metaparams by name.

  Returns:
    A ``ShardedKernelCall``: call it with the kernel's array operands
    (global arrays, tuples of them), in order; scalars and ``shard_size``
    placeholders are given here, by their parameters' names.

  Raises:
    jt_dist.ShardingSpecError, TypeError, ValueError: as for
      ``sharded_triton_call``, at the first call.
  """
  kwargs = dict(options_and_metaparams)
  out_type = kwargs.pop("out_type", None)
  if out_type is not None:
    out_shape = _kernel_call.resolve_out_shape(out_shape, out_type)
  return ShardedKernelCall(kernel, out_shape, grid, mesh, in_specs,
                           out_specs, out_reduce, sharding_rule, kwargs)


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
  Each call is ``jt_dist.sharded_kernel_call(kernel, ...)(*args)``, found by
  its static parts in a bounded memo.

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
      its own, and the kernel gets a tuple of shards. An array laid out
      otherwise (on one device, on another mesh object, by another spec) is
      moved there with ``jax.device_put`` first.
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
      dimension its axes do not divide, inputs split differently over one
      output dimension, or an output that varies over a mesh axis (as an
      input split over it does) that neither its ``out_specs`` entry names
      nor ``out_reduce`` reduces over.
    ValueError: a ``shard_size`` pointing at a scalar or a missing argument.
    TypeError, jt_dist.KernelBindingError: as for ``triton_call``.
  """
  specs = (mesh, in_specs, out_specs, out_reduce, sharding_rule)
  plain = None
  if (type(out_shape) is _SHAPE_DTYPE and type(grid) is tuple  # pylint: disable=unidiomatic-typecheck
      and out_type is None):
    # The commonest call, keyed without a Python loop: arrays by type, and
    # other arguments (at positions an itemgetter filed here picks) by value.
    try:
      plain = (id(kernel), out_shape.shape, out_shape.dtype,
               out_shape.weak_type, out_shape.sharding, grid, specs,
               tuple(map(type, args)), *kwargs.items())
      call = _memo.sharded_calls.get(plain)
      if type(call) is operator.itemgetter:  # pylint: disable=unidiomatic-typecheck
        call = _memo.sharded_calls.get((call, call(args)))
    except TypeError:
      plain = call = None
    if call is not None and call.kernel is kernel:
      return call(*itertools.compress(args, call.passed))
  return _first_call(args, kernel, out_shape, grid, out_type, specs, kwargs,
                     plain)


def _first_call(args, kernel, out_shape, grid, out_type, specs, kwargs,
                plain):
  """A call its plain key does not find: made, or found by its full key."""
  if out_type is not None:
    out_shape = _kernel_call.resolve_out_shape(out_shape, out_type)
  _tensordesc.refuse_split("sharded_triton_call", "a sharded call", args,
                           out_shape, kwargs)
  # Keyword operands become positional, so in_specs and rules see them.
  merged_kernel, merged, merged_kwargs = _arguments.merge_keywords(
      kernel, args, kwargs)
  if _refs.has_refs(merged):
    return _with_refs(merged, merged_kernel, out_shape, grid, *specs,
                      merged_kwargs)
  statics = tuple(OPERAND if _api._is_operand(a) else a for a in merged)  # pylint: disable=protected-access
  for a in merged:
    if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer):
      _ARRAYS.add(type(a))
  spec_leaves, spec_tree = jax.tree_util.tree_flatten(
      specs, is_leaf=lambda x: x is None or isinstance(x, P))
  try:
    key = (id(merged_kernel), _memo.out_key(out_shape), _memo.grid_key(grid),
           _exact.dict_key(merged_kwargs),
           tuple(s if s is OPERAND else _exact.key(s) for s in statics),
           spec_tree, tuple(spec_leaves))
    call = _memo.sharded_calls.get(key)
  except TypeError:
    key = call = None
  if call is None or call.kernel is not merged_kernel:
    call = ShardedKernelCall(merged_kernel, out_shape, grid, *specs,
                             merged_kwargs, statics)
    if key is not None:
      _memo.sharded_calls.put(key, call)
  # Filed under the plain key too where no keyword moved into the args.
  if (plain is not None and len(merged) == len(args)
      and merged_kernel is kernel
      and _BY_VALUE.union(_ARRAYS).issuperset(map(type, args))
      and _BY_VALUE.union(_exact.PLAIN).issuperset(
          map(type, (*kwargs.values(), *grid)))):
    _file_plain(plain, args, call)
  return call(*itertools.compress(merged, call.passed))


def _file_plain(plain, args, call) -> None:
  """Files ``call`` under ``plain``, or under its scalars' getter and values."""
  positions = [i for i, a in enumerate(args) if type(a) not in _ARRAYS]
  if not positions:
    _memo.sharded_calls.put(plain, call)
    return
  getter = _memo.sharded_calls.get(plain)
  if type(getter) is not operator.itemgetter:  # pylint: disable=unidiomatic-typecheck
    getter = operator.itemgetter(*positions)
    _memo.sharded_calls.put(plain, getter)
  _memo.sharded_calls.put((getter, getter(args)), call)


def _with_refs(args, kernel, out_shape, grid, mesh, in_specs, out_specs,
               out_reduce, rule, kwargs):
  """A call with Refs: their values go in, and come back to be written."""
  _refs.check(args, kwargs.get("input_output_aliases"), rule,
              "sharded_triton_call")
  ref_args = _refs.top_level(args, "sharded_triton_call")
  values = [a[...] if i in ref_args else a for i, a in enumerate(args)]
  resolved = _mesh_call.resolve(values, mesh, in_specs, out_shape, out_specs,
                                out_reduce, None)
  outs, updated = _mesh_call.run(
      _mesh_call.place(values, resolved), kernel, out_shape, grid, resolved,
      out_specs, out_reduce, None, kwargs, ref_args=ref_args)
  for i, new in zip(ref_args, updated):
    if not isinstance(new, jax.core.Tracer):
      # An eager Ref keeps its placement, whatever the shard_map's.
      new = jax.device_put(new, values[i].sharding)
    args[i][...] = new
  return outs
