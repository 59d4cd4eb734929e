"""Eager calls from a cache: bind once per call signature, then dispatch.

An eager ``triton_call`` first binds its arguments (``_binding``), checks
where they live (``_placement``) and builds its static ``CallSpec``. None of
that changes between two calls with the same *signature*: the kernel (and
its source), the operands' shapes, dtypes, shardings and committed-ness,
the scalars' Triton types (and their values where they are specialised on),
the metaparams, the grid, the options, and the settings that change
lowering. So the first call with a signature records an ``Entry``: a
compiled ``jax.jit`` callable and where to find its operands among the
arguments. Later calls with that signature compute the key (a tuple; no
array is ever kept in it) and call the entry, which goes through jax.jit's
C++ dispatch with no further jt_dist Python.

Both caches here are bounded LRUs (``configure_cache(dispatch_entries=)``),
and both are emptied whenever a choice made at lowering time may change
(``invalidate``: pinning or forgetting an autotuning choice).

Scalars: on the CPU, an entry passes its scalar arguments to the host
callback as a runtime operand (their 64-bit patterns), so a new value runs
the same XLA executable. On GPUs jaxlib's Triton call carries scalar
values in the custom call, so a new value needs a new executable: it reuses
the binding and the compiled Triton kernel (Triton specialises integers
only on divisibility by 16 and equality to 1), and pays only JAX's lowering
and XLA's compilation of the one custom call.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jt_dist._core import binding as _binding
from jt_dist import _compat
from jt_dist._core import kernel as _kernel
from jt_dist._core import primitive as _primitive
from jt_dist._core import types as _types
from jt_dist._cpu import lowering as _cpu_lowering
from jt_dist._cpu import scalars as _cpu_scalars
from jt_dist._gpu import cache as _cache
from jt_dist._gpu import faults as _gpu_faults
from jt_dist._sharding import shard_size as _shard_size
from jt_dist._sharding import specs as _specs

DEFAULT_ENTRIES = 256
# Environment variables read when a call is lowered or launched: flipping
# one makes every signature miss once.
_ENV_VARS = (_gpu_faults.SYNC_ENV_VAR, "JT_DIST_AUTOTUNE_PIN",
             "JT_DIST_AUTOTUNE", "JT_DIST_AUTOTUNE_CPU")
_INT_TYPES = frozenset((int, np.int8, np.int16, np.int32, np.int64, np.uint8,
                        np.uint16, np.uint32, np.uint64))
# Exact types only: a subclass of int (an IntEnum) takes the slow path.
_SCALAR_TYPES = _INT_TYPES | {bool, float, np.bool_, np.float16, np.float32,
                              np.float64}

# signature -> Entry; spec -> jitted callable.
entries = _cache.LRUCache(DEFAULT_ENTRIES)
executables = _cache.LRUCache(DEFAULT_ENTRIES)
_generation = [0]
_array_type: list[type] = []


def configure_cache(*, disk_cache: bool | None = None,
                    cache_dir: str | None = None,
                    memory_entries: int | None = None,
                    dispatch_entries: int | None = None) -> None:
  """Sets how kernels and calls are cached; arguments left None are unchanged.

  Args:
    disk_cache: whether to use the on-disk cache of compiled kernels
      (overrides ``JT_DIST_DISK_CACHE``).
    cache_dir: the on-disk cache's directory (overrides
      ``JT_DIST_CACHE_DIR``).
    memory_entries: how many compiled kernels the in-process cache keeps.
    dispatch_entries: how many eager call signatures, and how many compiled
      XLA executables of calls, are kept (each an LRU; 256 by default).
      Every distinct call signature, and on GPUs every distinct scalar
      value, holds an executable until it is evicted.

  Raises:
    TypeError: an argument has the wrong type.
    ValueError: ``memory_entries`` or ``dispatch_entries`` is below 1, or
      ``cache_dir`` is empty or holds a NUL character.
  """
  if dispatch_entries is not None:
    if not isinstance(dispatch_entries, int) or isinstance(
        dispatch_entries, bool):
      raise TypeError(
          f"configure_cache: dispatch_entries={dispatch_entries!r} of type"
          f" {type(dispatch_entries).__name__} must be an int, e.g. 256.")
    if dispatch_entries < 1:
      raise ValueError(
          f"configure_cache: dispatch_entries={dispatch_entries!r} must be"
          " at least 1 (the number of eager call signatures and compiled"
          " calls kept in memory).")
  _cache.configure(disk_cache=disk_cache, cache_dir=cache_dir,
                   memory_entries=memory_entries)
  if dispatch_entries is not None:
    entries.resize(dispatch_entries)
    executables.resize(dispatch_entries)


def invalidate() -> None:
  """Forgets every entry and executable (a lowering-time choice changed)."""
  _generation[0] += 1
  entries.clear()
  executables.clear()
  _kernels.clear()


def _bind(*args, spec):
  return _primitive.triton_call_p.bind(*args, spec=spec)


def executable(spec) -> Callable[..., Any]:
  """The ``jax.jit`` callable that runs ``spec`` (one per spec, bounded)."""
  # An autotuned call's config is chosen when it is lowered, from settings
  # the spec does not hold.
  key = (spec, _env_key(True)) if spec.info.layers else spec
  fn = executables.get(key)
  if fn is None:
    fn = jax.jit(functools.partial(_bind, spec=spec))
    executables.put(key, fn)
  return fn


def _jax_array_type() -> type:
  if not _array_type:
    _array_type.append(type(jax.numpy.zeros((), np.float32)))
  return _array_type[0]


def _scalar_key(value: Any, exact: bool):
  """What of a scalar the binding depends on: its value, or its class.

  The class is Triton's type and, for integers, the two facts Triton
  specialises on: equality to 1 and divisibility by 16.
  """
  kind = type(value)
  if exact or kind is bool or kind is np.bool_:
    return value
  if kind in _INT_TYPES:
    return (_types.scalar_type(value), value == 1, value % 16 == 0)
  return _types.scalar_type(value)


def _leaf_key(leaf: Any):
  if type(leaf) is jax.ShapeDtypeStruct:  # pylint: disable=unidiomatic-typecheck
    return leaf
  return (type(leaf), tuple(leaf.shape), leaf.dtype)


def _out_key(out_shape: Any):
  if type(out_shape) is jax.ShapeDtypeStruct:  # pylint: disable=unidiomatic-typecheck
    # Its own __hash__ is Python; a tuple of these hashes in C.
    return (out_shape.shape, out_shape.dtype, out_shape.sharding,
            out_shape.weak_type)
  leaves, tree = jax.tree_util.tree_flatten(
      out_shape, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
  return tree, tuple(_leaf_key(leaf) for leaf in leaves)


def _typed(values: Sequence[Any]) -> tuple:
  # 1, 1.0 and True are equal and hash alike; their types tell them apart.
  return tuple(values) + tuple(map(type, values))


def _env_key(autotuned: bool) -> tuple:
  """The environment read at lowering or launch that no spec records.

  ``JT_DIST_BOUNDS_CHECK`` is not here: the CPU launch reads it each time.
  """
  env = os.environ
  if autotuned:
    return tuple(env.get(name) for name in _ENV_VARS)
  return env.get(_gpu_faults.SYNC_ENV_VAR)


# id(kernel) -> (kernel, what binding reads of scalar values, autotuned?).
# The kernel is held, so that its id is not reused while the entry lives.
_kernels: dict[int, tuple] = {}


def _kernel_facts(kernel: Any):
  facts = _kernels.get(id(kernel))
  if facts is None or facts[0] is not kernel:
    info = _kernel.kernel_info(kernel)
    facts = (kernel, info.value_positions, bool(info.layers))
    if len(_kernels) >= entries.max_entries:
      _kernels.clear()  # Bounded; refilled one lookup per kernel.
    _kernels[id(kernel)] = facts
  return facts


def _grid_key(grid: Any):
  if callable(grid):
    # An inline lambda is a new object per call, with the same code; the
    # entry evaluates the grid again and compares (see Entry.matches).
    return getattr(grid, "__code__", grid)
  if isinstance(grid, (tuple, list)):
    return (type(grid), _typed(grid))
  return (type(grid), grid)


def _arg_key(arg: Any, exact: bool):
  """An argument's part of the signature; None where there is no fast path."""
  kind = type(arg)
  if kind is _jax_array_type():
    return (arg.shape, arg.dtype, arg.sharding, arg.committed)
  if kind in _SCALAR_TYPES:
    return (kind, _scalar_key(arg, exact))
  if kind is np.ndarray:
    return (kind, arg.shape, arg.dtype)
  if kind is _shard_size.ShardSize:
    return arg
  return None


_SYNC_ENV_VAR = _gpu_faults.SYNC_ENV_VAR


def signature(args: Sequence[Any], kernel: Any, out_shape: Any, grid: Any,
              options: tuple, metaparams: dict, exact_all: bool) -> Any:
  """The key of an eager call, or None when it has no fast path.

  It runs on every eager call, so it is written for speed: one tuple, few
  calls, and the common argument (a ``jax.Array``) tested first.

  Args:
    args: the positional arguments.
    kernel: the kernel object.
    out_shape: as given.
    grid: as given.
    options: every other keyword of the call, in a fixed order.
    metaparams: the metaparams.
    exact_all: whether every scalar's value is in the key; otherwise only
      those the binding reads (constexprs, declared types, heuristics and
      autotuning, a callable grid) are, and the others' classes.
  """
  if not _compat.at_top_level():
    return None
  try:
    _, exact, autotuned = _kernel_facts(kernel)
    everything = exact_all or exact == "all" or callable(grid)
    array_type = _array_type[0] if _array_type else _jax_array_type()
    arg_parts = []
    for i, arg in enumerate(args):
      if type(arg) is array_type:  # pylint: disable=unidiomatic-typecheck
        arg_parts.append((arg.shape, arg.dtype, arg.sharding, arg.committed))
        continue
      part = _arg_key(arg, everything or i in exact)
      if part is None:
        return None
      arg_parts.append(part)
    values = tuple(metaparams.values())
    # 1, 1.0 and True are equal and hash alike; their types tell them apart.
    kind = type(grid)
    return (id(kernel), _out_key(out_shape),
            (kind, grid, tuple(map(type, grid))) if kind is tuple
            else _grid_key(grid), options,
            tuple(map(type, options)),
            _env_key(True) if autotuned
            else os.environ.get(_SYNC_ENV_VAR),
            _generation[0], jax.config.jax_default_device, tuple(arg_parts),
            tuple(metaparams), values, tuple(map(type, values)))
  except Exception:  # pylint: disable=broad-except
    # Not a kernel, or odd input: the slow path reports it.
    return None


@dataclasses.dataclass(eq=False)
class Entry:
  """How to run one signature: a compiled callable and its operands.

  Attributes:
    fn: the jitted callable for ``values``.
    spec: the call's ``CallSpec`` (for fault messages and new values).
    array_positions: where the array operands are among the arguments.
    scalar_positions: per scalar operand, its position among the arguments,
      or None for a value fixed by the signature (a ``shard_size``).
    values: the scalar operands' values ``fn`` was made for.
    runtime: whether ``fn`` takes the scalars as a runtime operand.
    put_positions / target: uncommitted arrays to move to ``device=``.
    out_tree: the structure of ``out_shape``.
    grid: a callable grid and what it returned, per launch, to check again.
    source: the kernel's Triton function and its source when bound.
    sync: whether to wait for the outputs (``JT_DIST_SYNC_LAUNCHES``).
  """

  fn: Callable[..., Any]
  spec: Any
  array_positions: tuple[int, ...]
  scalar_positions: tuple[int | None, ...]
  values: tuple
  runtime: bool
  put_positions: tuple[int, ...]
  target: Any
  out_tree: Any
  grid: Any
  grid_checks: tuple
  source: tuple
  sync: bool
  kernel: Any = None  # Held: the key has its id.
  layout: Any = None  # The scalars' struct, when ``runtime``.
  single: bool = False  # Whether out_shape is one leaf.
  # Set when there is nothing to do but pick the arrays and call ``fn``:
  # no scalars, no moves, no sync. Picks the arrays from the arguments.
  pick: Callable[[Sequence[Any]], tuple] | None = None

  def matches(self, grid: Any) -> bool:
    """Whether what the key cannot see is as it was when bound."""
    jit_fn, src = self.source
    if getattr(jit_fn, "src", None) is not src:
      return False
    if self.grid_checks and grid is not self.grid:
      for named, expected in self.grid_checks:
        try:
          if _evaluate(grid, named) != expected:
            return False
        except Exception:  # pylint: disable=broad-except
          return False
    return True

  def __call__(self, args: Sequence[Any]) -> Any:
    if self.pick is not None:  # The common case, with the least Python.
      try:
        outs = self.fn(*self.pick(args))
      except Exception as e:  # pylint: disable=broad-except
        self._raise(e)
      if self.single:
        return outs[0]
      return jax.tree_util.tree_unflatten(self.out_tree, outs)
    arrays = [args[i] for i in self.array_positions]
    for k in self.put_positions:
      arrays[k] = jax.device_put(arrays[k], self.target)
    fn = self.fn
    if self.scalar_positions:
      values = tuple(v if i is None else args[i] for i, v in
                     zip(self.scalar_positions, self.values))
      if self.runtime:
        arrays.append(np.frombuffer(self.layout.pack(*values), np.uint32))
      elif values != self.values:
        fn = executable(_binding.with_scalar_values(self.spec, values))
    try:
      outs = fn(*arrays)
      if self.sync:
        jax.block_until_ready(outs)
    except Exception as e:  # pylint: disable=broad-except
      self._raise(e)
    if self.single:
      return outs[0]  # One output, not in a container: no unflattening.
    return jax.tree_util.tree_unflatten(self.out_tree, outs)

  def _raise(self, e: Exception):
    """Raises a failed launch's error, in jt_dist's words where it can."""
    _cpu_lowering.raise_host_fault(e)
    if _gpu_faults.is_device_fault(e):
      raise _gpu_faults.launch_fault(e, self.spec) from e
    raise  # The handler calling this is still handling ``e``.


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple]:
  """A function of the arguments that returns those at ``positions``."""
  if len(positions) >= 2:
    return operator.itemgetter(*positions)  # Returns a tuple, in C.
  return lambda args: tuple(args[i] for i in positions)


def _evaluate(grid, named):
  return _as_tuple(grid(dict(named)))


def _on_cpu(arrays: Sequence[Any]) -> bool:
  """Whether the call runs on the CPU, judged from its placed operands."""
  devices = set()
  for a in arrays:
    if not isinstance(a, jax.Array):
      return False
    devices |= a.sharding.device_set
  return bool(devices) and all(d.platform == "cpu" for d in devices)


class GridRecorder:
  """A grid callable that remembers what it was given and what it returned.

  An entry evaluates the caller's grid again on each hit (an inline lambda
  is a new object each time, and may close over new values) and compares.
  """

  def __init__(self, grid):
    self.grid = grid
    self.seen = []
    # Error notes name the caller's function and line, not this wrapper.
    functools.update_wrapper(self, grid, updated=())
    if hasattr(grid, "__code__"):
      self.__code__ = grid.__code__

  def __call__(self, named):
    value = self.grid(named)
    self.seen.append((tuple(named.items()), _as_tuple(value)))
    return value


def _as_tuple(value):
  return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def make_entry(args, resolved_args, arrays, spec, out_tree, grid,
               device_target, device) -> Entry:
  """The entry of an eager call just bound.

  Args:
    args: the positional arguments as given.
    resolved_args: the same with every ``shard_size`` resolved.
    arrays: the placed array operands.
    spec: the bound ``CallSpec``.
    out_tree: the outputs' structure.
    grid: the grid as given, or its ``GridRecorder``.
    device_target: the device ``device=`` resolved to, or None.
    device: ``device=`` as given.
  """
  array_positions = tuple(i for i, a in enumerate(resolved_args)
                          if not _types.is_scalar(a))
  info = spec.info
  positions = [
      None if isinstance(args[i], _shard_size.ShardSize) else i
      for i, (a, param) in enumerate(zip(resolved_args, info.params))
      if _types.is_scalar(a) and not param.is_constexpr]
  values = tuple(op.value for op in spec.operands if op.kind == "scalar")
  runtime = bool(values) and _cpu_scalars.supported(spec) and _on_cpu(arrays)
  fn = executable(_cpu_scalars.runtime_spec(spec) if runtime else spec)
  puts = () if device is None or device_target is None else tuple(
      k for k, i in enumerate(array_positions)
      if not (isinstance(args[i], jax.Array) and args[i].committed))
  recorder = grid if isinstance(grid, GridRecorder) else None
  sync = _gpu_faults.sync_launches()
  plain = not puts and not positions and not sync
  return Entry(
      fn=fn, spec=spec, array_positions=array_positions,
      scalar_positions=tuple(positions), values=values, runtime=runtime,
      put_positions=puts, target=device_target, out_tree=out_tree,
      grid=None if recorder is None else recorder.grid,
      grid_checks=() if recorder is None else tuple(recorder.seen),
      source=source_of(info), sync=sync,
      kernel=spec.kernel, pick=_picker(array_positions) if plain else None,
      layout=_cpu_scalars.layout(spec) if runtime else None,
      single=out_tree.num_leaves == 1 and out_tree.num_nodes == 1)


def source_of(info) -> tuple:
  """The kernel's Triton function and its source text, to check on hits."""
  jit_fn = _compat.jit_function_of(info.fn)
  return (jit_fn, getattr(jit_fn, "src", None))


@dataclasses.dataclass(eq=False)
class ReplayEntry:
  """A call run once per shard: a jitted ``shard_map`` and its operands.

  ``targets`` holds, per array operand, the sharding it is moved to, or
  None where it is laid out already (the key holds its sharding, so that
  is so on every call with this signature).
  """

  fn: Callable[..., Any]
  array_positions: tuple[int, ...]
  targets: tuple
  out_tree: Any
  grid: Any
  source: tuple
  kernel: Any  # Held: the key has its id.
  moves: bool = True  # Whether any target is not None.
  single: bool = False  # Whether out_shape is one leaf.

  def matches(self, grid: Any) -> bool:
    jit_fn, src = self.source
    return getattr(jit_fn, "src", None) is src and (
        not callable(grid) or grid is self.grid)

  def __call__(self, args: Sequence[Any]) -> Any:
    if self.moves:
      arrays = [args[i] if target is None else jax.device_put(args[i], target)
                for i, target in zip(self.array_positions, self.targets)]
    else:  # Laid out already: one call of the jitted ``shard_map``.
      arrays = [args[i] for i in self.array_positions]
    outs = self.fn(*arrays)
    if self.single:
      return outs[0]
    return jax.tree_util.tree_unflatten(self.out_tree, list(outs))


def _replay_target(x: Any, spec: Any, mesh: Any) -> Any:
  """Where a per-shard call's operand must move: None if it may stay.

  An operand whose sharding lays it out as ``spec`` does over ``mesh``
  (one device's array on a mesh of that one device, say) is passed as it
  is: the jitted ``shard_map`` takes it without a ``device_put`` per call.
  Not where ``spec`` names an explicit mesh axis: ``shard_map`` then
  checks the operand's type, which only a move gives that axis.
  """
  target = _specs.move_target(x, spec, mesh)
  if target is None:
    return None
  try:
    named = {axis for entry in spec if entry is not None
             for axis in ((entry,) if isinstance(entry, str) else entry)}
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    current = x.sharding
    # An array typed on another mesh keeps that mesh in its type.
    other_mesh = (isinstance(current, jax.sharding.NamedSharding)
                  and current.mesh != mesh)
    if not other_mesh and all(
        types[axis] != jax.sharding.AxisType.Explicit for axis in named) and (
            current.is_equivalent_to(target, x.ndim)):
      return None
  except Exception:  # pylint: disable=broad-except
    pass  # Not comparable: moving it is always right.
  return target


def replay_recorder(key, kernel, grid):
  """A function that files a per-shard call's entry and returns its jit.

  The partitioning code calls it with the call's arguments, the array
  positions, their specs, the mesh, the ``shard_map``-ed function and the
  outputs' structure, once the operands have been laid out (so that a
  layout that cannot be made has raised already).
  """

  def record(args, positions, in_specs, mesh, mapped, out_tree):
    fn = jax.jit(mapped)
    targets = tuple(_replay_target(args[i], spec, mesh)
                    for i, spec in zip(positions, in_specs))
    entries.put(key, ReplayEntry(
        fn=fn, array_positions=tuple(positions), targets=targets,
        out_tree=out_tree, grid=grid,
        source=source_of(_kernel.kernel_info(kernel)), kernel=kernel,
        moves=any(t is not None for t in targets),
        single=out_tree.num_leaves == 1 and out_tree.num_nodes == 1))
    return fn

  return record


def lookup(key, grid):
  """``(entry, key)``: the entry for ``key`` if it is still good, else None.

  The key comes back None when it cannot be hashed (an unhashable
  metaparam, say): such a call takes the slow path, which reports it.
  """
  if key is None:
    return None, None
  try:
    entry = entries.get(key)
  except TypeError:
    return None, None
  if entry is None or not entry.matches(grid):
    return None, key
  return entry, key
