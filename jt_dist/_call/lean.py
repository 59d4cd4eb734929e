"""The cheapest eager hit: arrays only, default options, placement left to jit.

Most repeated eager calls look alike: every operand a ``jax.Array`` passed
by position, a ``ShapeDtypeStruct`` out_shape, a tuple grid, metaparams by
keyword, and no other option. For those, the full signature
(``jt_dist._call.dispatch``) spends most of its time on the arrays'
shardings: a sharding's ``__hash__`` and ``__eq__`` run in Python. The
entry's executable is a ``jax.jit`` callable, whose C++ dispatch compares
every array's shape, dtype, sharding and committed-ness before it runs, so
this key leaves the shardings out and keeps only the arrays' shapes, dtypes
and types.

What jit then decides where the full key would have missed:

- the arrays moved to another single device: jit compiles for that device,
  as the full path's executable (the same one) would;
- the arrays are on several devices, or on different ones: jit, or the
  kernel's lowering, refuses before anything runs (a ValueError); the call
  is then made again through the full path, which checks where its inputs
  live and raises the device-validation layer's own error.

Only entries with nothing else to do qualify (``Entry.direct``: the
operands are the arguments, no scalars, no moves, no sync); a callable grid
never does. Autotuned kernels do: the key holds the autotuning settings,
and pinning or forgetting a choice empties the lean entries with the rest.

``hit`` is the whole lookup: the key, the entry, the call. Where jt_dist was
installed with a C compiler it is ``jt_dist/_call/lean_hit/`` (the module
``_lean_hit``), which builds the same keys and also keeps its last hits,
matched field by field without building a key; the Python here is its
reference and its fallback, and ``use_compiled`` picks either.
"""

# Exact types on purpose: a subclass takes the full path.
# pylint: disable=unidiomatic-typecheck

from __future__ import annotations

import os
from typing import Any, Sequence

import jax

from jt_dist import _compat
from jt_dist._core import call_cache as _call_cache
from jt_dist._cpu import lowering as _cpu_lowering
from jt_dist._gpu import faults as _gpu_faults

try:
  # Built from lean_hit/*.c where a compiler was at hand (setup.py); the
  # Python below is the same logic, and the reference.
  from jt_dist._call import _lean_hit as _c_lean_hit  # pylint: disable=g-import-not-at-top
except ImportError:
  _c_lean_hit = None

MISS = object()  # ``call``'s answer when the call has no lean entry.


class Miss:
  """``hit``'s answer when it did not run the call: the full path does.

  Attributes:
    key: the call's lean key, under which the full path files its entry, or
      None where the call has none (an option named, a scalar operand, a
      trace).
  """

  __slots__ = ("key",)

  def __init__(self, key: Any = None):
    self.key = key


_SDS = jax.ShapeDtypeStruct
_entries = _call_cache.lean_entries
# The settings read when a call is lowered or launched: the sync setting for
# a plain kernel, and the autotuning ones too for any other (an autotuned or
# heuristics-wrapped kernel, or one of another type: it reads them all).
_sync_env = _call_cache.sync_env
_env = _call_cache.autotune_env
_plain_kernel = _compat.JITFunction
_top_level = _call_cache.top_level
_array_type = _call_cache.array_type


def key(args: Sequence[Any], kernel: Any, out_shape: Any, grid: Any,
        metaparams: dict) -> Any:
  """The lean key of a call whose options are all defaults, or None.

  None under a trace too. Raises nothing: an argument that is not a
  concrete ``jax.Array`` (a scalar, a Ref, a tuple), a grid that is not a
  tuple, or an out_shape that is not one ``ShapeDtypeStruct`` gives None.
  """
  if type(grid) is not tuple or type(out_shape) is not _SDS:
    return None
  if not (_array_type or _call_cache.eager_ready()) or not _top_level[0]():
    return None  # Under a trace: the full path binds into it.
  array_type = _array_type[0]
  # List comprehensions: cheaper than map() here, and inlined on 3.12.
  arrays = tuple([(a.shape, a.dtype) for a in args if type(a) is array_type])
  if len(arrays) != len(args):
    return None  # A scalar, a Ref, a tuple: the full path.
  try:
    return (id(kernel), arrays,
            out_shape.shape, out_shape.dtype, out_shape.sharding,
            out_shape.weak_type,
            # 1, 1.0 and True are equal and hash alike: their types differ.
            grid, tuple([type(g) for g in grid]),
            tuple([(k, v, type(v)) for k, v in metaparams.items()]),
            _sync_env() if type(kernel) is _plain_kernel else _env())
  except Exception:  # pylint: disable=broad-except
    return None


def sharded_key(args: Sequence[Any], kernel: Any, out_shape: Any,
                grid: Any, specs: tuple, kwargs: dict) -> Any:
  """``key`` for an eager ``sharded_triton_call``, or None.

  ``specs`` are its mesh, in_specs, out_specs, out_reduce and
  sharding_rule as given, and other options are among ``kwargs``. Only a
  call that names its mesh and in_specs qualifies: otherwise they come
  from the arguments' shardings, which this key leaves out. The ambient
  mesh is in the key all the same.
  """
  if specs[0] is None or specs[1] is None:
    return None
  common = key(args, kernel, out_shape, grid, kwargs)
  if common is None:
    return None
  try:
    return ("sharded", specs, jax.sharding.get_abstract_mesh()) + common
  except Exception:  # pylint: disable=broad-except
    return None


def _py_hit(args: tuple, kernel: Any, out_shape: Any, grid: Any,
            kwargs: dict) -> Any:
  """``hit`` in Python: the reference for ``lean_hit/*.c``, and its fallback."""
  if not _option_names[0].isdisjoint(kwargs):
    return Miss()
  lean_key = key(args, kernel, out_shape, grid, kwargs)
  if lean_key is None:
    return Miss()
  outs = call(lean_key, args)
  return Miss(lean_key) if outs is MISS else outs


def call(lean_key: Any, args: Sequence[Any]) -> Any:
  """Runs the call from its lean entry; ``MISS`` if it has none or jit refused.

  Args:
    lean_key: ``key``'s answer (not None).
    args: the positional arguments, as given.
  """
  try:
    entry = _entries.get(lean_key)
  except TypeError:  # An unhashable metaparam: the full path reports it.
    return MISS
  if entry is None or entry.jit_fn.src is not entry.src:
    return MISS
  try:
    outs = entry.fn(*args)
  except Exception as e:  # pylint: disable=broad-except
    return _failed(entry, e)
  if entry.single:
    return outs[0]
  return jax.tree_util.tree_unflatten(entry.out_tree, outs)


def _failed(entry: Any, e: Exception) -> Any:
  """``MISS`` where the entry's executable refused its arguments; else raises.

  Raised before the kernel ran, a ValueError or TypeError means misplaced
  arrays (jit's device check, or the lowering's refusal of several
  devices): the full path checks placement itself and raises the
  validation layer's error. A kernel's own fault on the CPU is raised as
  itself, and a device fault on a GPU as jt_dist's.
  """
  _cpu_lowering.raise_host_fault(e)
  if isinstance(e, (ValueError, TypeError)):
    return MISS
  spec = getattr(entry, "spec", None)
  if spec is not None and _gpu_faults.is_device_fault(e):
    raise _gpu_faults.launch_fault(e, spec) from e
  raise e


def _found_eager() -> tuple[type, Any] | None:
  """The concrete array type and how to probe for top level, for the C hit.

  The probe is what the probe in Python compares where that is known (C
  reads it without a Python frame), else the probe itself. None under a
  trace.
  """
  if not _call_cache.eager_ready():
    return None
  return _array_type[0], _compat.top_level_states() or _top_level[0]


def _environ_parts() -> tuple | None:
  """``os`` and what the settings' readers read, for the C hit to read alike."""
  sync = _compat.environ_parts((_gpu_faults.SYNC_ENV_VAR,))
  every = _compat.environ_parts(_call_cache.AUTOTUNE_ENV_VARS)
  if sync is None or every is None:
    return None
  return vars(os), sync[0], sync[1], sync[2], every[2]


_option_names: list[frozenset] = [frozenset()]
hit = _py_hit


def configure(option_names: frozenset) -> None:
  """Sets ``triton_call``'s option names, and ``hit`` to the C one if built.

  Args:
    option_names: every keyword of ``triton_call`` that is an option (not
      a metaparam): a call naming one is never a lean hit.
  """
  _option_names[0] = option_names
  use_compiled(True)


def use_compiled(compiled: bool) -> bool:
  """Makes ``hit`` the C one (where built) or the Python one.

  Args:
    compiled: False takes the Python ``hit`` even where the C one is built
      (the tests run both).

  Returns:
    Whether ``hit`` is now the C one.
  """
  global hit
  hit = _py_hit
  if compiled and _c_lean_hit is not None:
    if _c_lean_hit.forget not in _call_cache.lean_forgetters:
      _call_cache.lean_forgetters.append(_c_lean_hit.forget)
    _c_lean_hit.configure(Miss, _SDS, _plain_kernel, _entries, _found_eager,
                          _sync_env, _env, _failed,
                          jax.tree_util.tree_unflatten, _environ_parts())
    hit = _c_lean_hit.hit
  return hit is not _py_hit


def compiled() -> bool:
  """Whether eager calls take the C hit (``lean_hit/*.c`` built and chosen)."""
  return hit is not _py_hit


def register(lean_key: Any, entry: Any, n_args: int) -> None:
  """Files ``entry`` under ``lean_key`` if it has nothing to do but run.

  Args:
    lean_key: ``key``'s or ``sharded_key``'s answer, or None.
    entry: the entry the full path found or made for the same call.
    n_args: how many positional arguments the call was given: an entry
      whose operands are more (keyword operands merged in) is not filed.
  """
  if (lean_key is None or not entry.direct or entry.checks
      or len(entry.array_positions) != n_args):
    return
  if len(_entries) >= _call_cache.entries.max_entries:
    _call_cache.clear_lean()  # Bounded; refilled by the next full-path hits.
  try:
    _entries[lean_key] = entry
  except TypeError:
    return  # An unhashable metaparam or spec: never a lean hit.
  for forget in _call_cache.lean_forgetters:
    forget()  # The key may have had another entry.
