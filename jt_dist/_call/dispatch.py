"""Eager calls from a cache: the signature of a call, and its lookup.

An eager ``triton_call`` first binds its arguments (``_binding``), checks
where they live (``_placement``) and builds its static ``CallSpec``. None of
that changes between two calls with the same *signature*: the kernel (and
its source), the operands' shapes, dtypes, shardings and committed-ness,
the scalars' Triton types (and their values where they are specialised on),
the metaparams, the grid, the options, and the settings that change
lowering. So the first call with a signature records an entry
(``jt_dist._call.entries``): a compiled ``jax.jit`` callable and where to
find its operands among the arguments. A later call computes its key from
the arguments as given, before any of them is checked or converted, and
calls the entry, which goes through jax.jit's C++ dispatch.

The key is a tuple of hashable facts; no array is ever kept in it. It is
computed on every eager call, so it is written for speed: per-kernel facts
found once (``call_cache.kernel_facts``), the usual all-default options
keyed by one comparison, and the environment read without ``os.environ``'s
encoding. The caches are bounded LRUs (``configure_cache``), emptied
whenever a choice made at lowering time may change (``invalidate``).
"""

# Exact types on purpose: a subclass takes the slow path.
# pylint: disable=unidiomatic-typecheck

from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import jax
import numpy as np

from jt_dist._call import lean as _lean
from jt_dist._call import operands as _operands
from jt_dist._call import tensordesc as _tensordesc
from jt_dist._core import call_cache as _call_cache
from jt_dist._core import types as _types
from jt_dist._gpu import cache as _cache
from jt_dist._sharding import shard_size as _shard_size

# Shared with the layers below (re-exported for tests and benchmarks).
DEFAULT_ENTRIES = _call_cache.DEFAULT_ENTRIES
entries = _call_cache.entries
executables = _call_cache.executables
invalidate = _call_cache.invalidate
executable = _call_cache.executable

MISS = object()  # ``cached``'s answer when the call has no entry.

_INT_TYPES = frozenset((int, np.int8, np.int16, np.int32, np.int64, np.uint8,
                        np.uint16, np.uint32, np.uint64))
# Exact types only: a subclass of int (an IntEnum) takes the slow path.
_SCALAR_TYPES = _INT_TYPES | {bool, float, np.bool_, np.float16, np.float32,
                              np.float64}
_ARRAY_TYPE = _call_cache.array_type
_SDS = jax.ShapeDtypeStruct
_is_top_level = _call_cache.top_level
_init = _call_cache.eager_ready
_generation = _call_cache.generation
_sync_env = _call_cache.sync_env
_autotune_env = _call_cache.autotune_env
_kernels = _call_cache._kernels  # pylint: disable=protected-access
_kernel_facts = _call_cache.kernel_facts

# triton_call's options, in the order ``options_of`` lists them, as they
# are when not given; positions of those whose type, not only value,
# matters (False == 0, True == 1).
DEFAULT_OPTIONS = ("", None, None, None, None, None, True, None, None, (),
                   False, b"", None, None, None, False, None)
RULE = 14  # sharding_rule's position.


class _NoFastPath(Exception):
  """An argument the signature cannot key: the call takes the slow path."""


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
    _call_cache.resize(dispatch_entries)


def _frozen(option: Any) -> Any:
  """A mapping or list option as a hashable key part, its values' types too."""
  if isinstance(option, collections.abc.Mapping):
    return (type(option), tuple((k, v, type(v)) for k, v in option.items()))
  if isinstance(option, list):
    return (list, tuple(option), tuple(map(type, option)))
  return option


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


def _other_key(arg: Any, exact: bool):
  """The key part of an argument that is not a ``jax.Array``."""
  kind = type(arg)
  if kind in _SCALAR_TYPES:
    return (kind, _scalar_key(arg, exact))
  if kind is np.ndarray:
    return (kind, arg.shape, arg.dtype)
  if kind is _shard_size.ShardSize:
    return arg
  if kind is _tensordesc.TensorDescriptor:
    base = arg.base
    if type(base) is not _ARRAY_TYPE[0]:
      raise _NoFastPath
    return (kind, base.shape, base.dtype, base.sharding, base.committed,
            _tensordesc.static_fields(arg))
  raise _NoFastPath  # Refs, tuples, tracers, subclasses: the slow path.


def _out_key(out_shape: Any):
  if type(out_shape) is _SDS:
    # Its own __hash__ is Python; a tuple of these hashes in C.
    return (out_shape.shape, out_shape.dtype, out_shape.sharding,
            out_shape.weak_type)
  leaves, tree = jax.tree_util.tree_flatten(
      out_shape, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
  return tree, tuple(
      leaf if type(leaf) is _SDS
      else (type(leaf), tuple(leaf.shape), leaf.dtype) for leaf in leaves)


def _grid_key(grid: Any):
  kind = type(grid)
  if kind is tuple or kind is list:
    # 1, 1.0 and True are equal and hash alike; their types tell them apart.
    return kind, tuple(grid), tuple(map(type, grid))
  if callable(grid):
    # An inline lambda is a new object per call, with the same code; the
    # entry evaluates the grid again and compares (see Entry.matches).
    return getattr(grid, "__code__", grid)
  return kind, grid


def key(args: Sequence[Any], kernel: Any, out_shape: Any, grid: Any,
        options: Any, metaparams: dict, exact_all: bool):
  """``(key, args)`` of an eager call, or None when it has no fast path.

  Args:
    args: the positional arguments, as given.
    kernel: the kernel object.
    out_shape: as given.
    grid: as given.
    options: every other keyword of the call, as a hashable key part.
    metaparams: the metaparams, as given; keyword operands among them are
      moved into ``args`` first (the ``args`` returned).
    exact_all: whether every scalar's value is in the key; otherwise only
      those the binding reads (constexprs, declared types, heuristics and
      autotuning, a callable grid) are, and the others' classes.
  """
  if not (_ARRAY_TYPE or _init()) or not _is_top_level[0]():
    return None
  array_type = _ARRAY_TYPE[0]
  try:
    facts = _kernels.get(id(kernel))
    if facts is None or facts.kernel is not kernel:
      facts = _kernel_facts(kernel)
    if not facts.operands.isdisjoint(metaparams):
      args, metaparams = _operands.merge_keywords(kernel, args, metaparams)
    exact = facts.exact
    everything = exact_all or exact == "all" or callable(grid)
    values = tuple(metaparams.values())
    return (id(kernel), _generation[0], jax.config.jax_default_device,
            _autotune_env() if facts.autotuned else _sync_env(), options,
            # The usual out_shape and grid inline, the rest in functions.
            (out_shape.shape, out_shape.dtype, out_shape.sharding,
             out_shape.weak_type)
            if type(out_shape) is _SDS else _out_key(out_shape),
            # 1, 1.0 and True are equal and hash alike: their types differ.
            (grid, tuple(map(type, grid))) if type(grid) is tuple
            else _grid_key(grid),
            tuple([(a.shape, a.dtype, a.sharding, a.committed)
                   if type(a) is array_type
                   else _other_key(a, everything or i in exact)
                   for i, a in enumerate(args)]),
            tuple(metaparams), values, tuple(map(type, values))), args
  except Exception:  # pylint: disable=broad-except
    # Not a kernel, or odd input: the slow path reports it.
    return None


def lookup(signature, grid):
  """The entry filed under ``signature`` if it is still good, else None."""
  try:
    entry = entries.hit(signature)
  except TypeError:  # An unhashable part: the slow path reports it.
    return None
  if entry is None or (entry.checks or entry.jit_fn.src is not entry.src
                       ) and not entry.matches(grid):
    return None
  return entry


def all_defaults(options: tuple) -> bool:
  """Whether triton_call's options (``DEFAULT_OPTIONS``' order) are as not given.

  False == 0 and True == 1, so the options whose type matters are compared
  by identity too.
  """
  return options == DEFAULT_OPTIONS and options[6] is True and (
      options[10] is False and options[15] is False)


def options_key(options: tuple) -> Any:
  """The key part of triton_call's options (``DEFAULT_OPTIONS``' order)."""
  if all_defaults(options):
    return None
  return tuple(map(_frozen, options)), tuple(map(type, options))


def cached(args: Sequence[Any], kernel: Any, out_shape: Any, grid: Any,
           options: tuple, metaparams: dict, defaults: bool,
           lean_key: Any = None) -> Any:
  """Runs an eager ``triton_call`` from its entry; ``MISS`` if it has none.

  ``options`` are triton_call's other keywords, in ``DEFAULT_OPTIONS``'
  order, as given, and ``defaults`` is ``all_defaults(options)``. A hit is
  filed under ``lean_key`` too (when not None), for the next call's
  ``jt_dist._call.lean`` lookup. Written for speed: ``lookup`` inline.
  """
  try:
    found = key(
        args, kernel, out_shape, grid,
        None if defaults else options_key(options), metaparams,
        options[RULE] is not None)
    if found is None:
      return MISS
    entry = entries.hit(found[0])
    if entry is None or (entry.checks or entry.jit_fn.src is not entry.src
                         ) and not entry.matches(grid):
      return MISS
  except Exception:  # pylint: disable=broad-except
    return MISS  # An option or part that cannot be compared or hashed.
  if lean_key is not None:
    _lean.register(lean_key, entry, len(args))
  return entry(found[1])
