"""The caches of eager calls, below every layer that fills or empties them.

Three bounded stores live here, so that the layers under ``jt_dist._call``
(the primitive's eager ``_impl``, the per-shard replay of
``jt_dist._sharding``, autotuning's pin and forget) can use them without
importing the front door:

- ``entries``: an eager call's signature -> how to run it (an ``Entry`` of
  ``jt_dist._call`` or a ``ReplayEntry`` of ``jt_dist._sharding``);
- ``executables``: a ``CallSpec`` -> its ``jax.jit`` callable;
- the per-kernel facts the signature needs (``kernel_facts``).

``invalidate`` empties all three whenever a choice made at lowering time may
change (pinning or forgetting an autotuning choice), and bumps
``generation``, which every signature holds.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from jt_dist import _compat
from jt_dist._core import kernel as _kernel
from jt_dist._core import primitive as _primitive
from jt_dist._gpu import cache as _cache
from jt_dist._gpu import faults as _gpu_faults

DEFAULT_ENTRIES = 256
# Environment variables read when an autotuned call is lowered or launched;
# flipping one makes every signature of an autotuned kernel miss once.
AUTOTUNE_ENV_VARS = (_gpu_faults.SYNC_ENV_VAR, "JT_DIST_AUTOTUNE_PIN",
                     "JT_DIST_AUTOTUNE", "JT_DIST_AUTOTUNE_CPU")

entries = _cache.LRUCache(DEFAULT_ENTRIES)
executables = _cache.LRUCache(DEFAULT_ENTRIES)
# The lean index of ``entries`` (``jt_dist._call.lean``): a plain dict,
# bounded by ``entries``' size and emptied with it.
lean_entries: dict = {}
# Called whenever lean_entries loses or replaces entries: the compiled lean
# hit's memo of last hits holds entries of its own.
lean_forgetters: list[Callable[[], Any]] = []


def clear_lean() -> None:
  """Empties ``lean_entries`` and every memo of them."""
  lean_entries.clear()
  for forget in lean_forgetters:
    forget()
# One element, so that readers that imported the list see every bump.
generation = [0]
# Found once, at the first eager call at top level (``eager_ready``): jax's
# "no trace is active" check, and the concrete ``jax.Array`` type. One
# element each, shared by every eager key (``jt_dist._call``).
top_level: list[Callable[[], bool]] = []
array_type: list[type] = []
# The environment a signature holds: exact (os.environ's own values), and
# cheaper than ``os.environ.get`` (which encodes and decodes each time).
sync_env = _compat.environ_reader((_gpu_faults.SYNC_ENV_VAR,))
autotune_env = _compat.environ_reader(AUTOTUNE_ENV_VARS)


class KernelFacts(NamedTuple):
  """What a signature needs to know of a kernel, found once per kernel.

  Attributes:
    kernel: the kernel, held so that its id is not reused while cached.
    exact: the argument positions whose scalar values binding reads (a
      frozenset), or "all" (autotuned and heuristic kernels).
    autotuned: whether the kernel has autotuning or heuristics layers.
    operands: the names of its non-constexpr parameters (keyword operands).
  """

  kernel: Any
  exact: Any
  autotuned: bool
  operands: frozenset


_kernels: dict[int, KernelFacts] = {}


def kernel_facts(kernel: Any) -> KernelFacts:
  """The facts of ``kernel``; raises TypeError if it is not a kernel."""
  facts = _kernels.get(id(kernel))
  if facts is None or facts.kernel is not kernel:
    info = _kernel.kernel_info(kernel)
    facts = KernelFacts(
        kernel, info.value_positions, bool(info.layers),
        frozenset(p.name for p in info.params if not p.is_constexpr))
    if len(_kernels) >= entries.max_entries:
      _kernels.clear()  # Bounded; refilled one lookup per kernel.
    _kernels[id(kernel)] = facts
  return facts


def eager_ready() -> bool:
  """Finds ``top_level`` and ``array_type`` once; False under a trace.

  The array type is that of a concrete array, which a first call under a
  trace would not make (``jnp.zeros`` there gives a tracer); it comes from
  ``jax.device_put``, which compiles nothing.
  """
  if not top_level:
    top_level.append(_compat.top_level_probe())
  if not top_level[0]():
    return False
  if not array_type:
    array_type.append(type(jax.device_put(np.zeros((), np.float32))))
  return True


def resize(max_entries: int) -> None:
  entries.resize(max_entries)
  executables.resize(max_entries)
  clear_lean()


def invalidate() -> None:
  """Forgets every entry and executable (a lowering-time choice changed)."""
  generation[0] += 1
  entries.clear()
  executables.clear()
  clear_lean()
  _kernels.clear()


def _bind(*args, spec):
  return _primitive.triton_call_p.bind(*args, spec=spec)


def executable(spec) -> Callable[..., Any]:
  """The ``jax.jit`` callable that runs ``spec`` (one per spec, bounded)."""
  # An autotuned call's config is chosen when it is lowered, from settings
  # the spec does not hold.
  key = (spec, autotune_env()) if spec.info.layers else spec
  fn = executables.get(key)
  if fn is None:
    fn = jax.jit(functools.partial(_bind, spec=spec))
    executables.put(key, fn)
  return fn


def source_of(info) -> tuple:
  """The kernel's Triton function and its source text, to check on hits."""
  jit_fn = _compat.jit_function_of(info.fn)
  return (jit_fn, getattr(jit_fn, "src", None))
