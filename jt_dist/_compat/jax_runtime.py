"""JAX facts a call needs at run time, across JAX releases.

Whether a call runs eagerly, Refs, the cache-key context, devices' runtime
versions, jax.distributed's key-value store and host buffer callbacks.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

import jax


def jit_cache_context(default: Any = None) -> Any:
  """A context whose value is part of JAX's tracing and lowering cache keys.

  ``jax.make_user_context`` (public since jax 0.6): a value changed inside
  ``with ctx(value):`` makes ``jit`` trace and lower again, where a plain
  context variable would let it reuse a lowering made under another value.
  """
  return jax.make_user_context(default_value=default)


def platform_version(device: Any) -> str:
  """The runtime a device's backend reports (e.g. its CUDA version)."""
  try:
    return str(device.client.platform_version)
  except AttributeError:
    return "unknown"


def at_top_level() -> bool:
  """Whether a call runs eagerly: no ``jax.jit``, vmap or grad trace is on.

  JAX has no public query for this. An all-concrete call inside a trace
  (arrays closed over by a jitted function) must not take the eager fast
  path, whose executable may be lowered for another platform there. Where
  jax's trace context is not found, this answers False: the slow path is
  always right.
  """
  try:
    return bool(_trace_context().is_top_level())
  except Exception:  # pylint: disable=broad-except
    return False


@functools.cache
def top_level_probe() -> Callable[[], bool]:
  """``at_top_level`` as one cheap call, for the eager fast path.

  Found once; where jax's trace context is not found, the probe answers
  False (the slow path is always right).
  """
  try:
    probe = _trace_context().is_top_level
    probe()
  except Exception:  # pylint: disable=broad-except
    return lambda: False
  return probe


@functools.cache
def top_level_states() -> tuple[tuple[Any, Any], ...] | None:
  """What ``top_level_probe`` compares, for a probe in C; None if unsure.

  jax's ``is_top_level`` holds where each state's ``value`` is its partner
  (the eval trace, the empty axis environment). Checked once against the
  probe itself, at top level and under a trace; None where jax differs, and
  the caller then calls the probe.
  """
  try:
    from jax._src import core as _core  # pylint: disable=g-import-not-at-top
    pairs = ((_core.trace_state_strong_ref, _core.eval_trace),
             (_core.axis_env_state, _core.top_axis_env))
    holds = lambda: all(state.value is want for state, want in pairs)
    probe = top_level_probe()
    seen = []
    jax.make_jaxpr(lambda: seen.append((holds(), probe())))()
  except Exception:  # pylint: disable=broad-except
    return None
  if seen != [(False, False)] or not holds() or not probe():
    return None
  return pairs


def _trace_context() -> Any:
  from jax._src import core as _core  # pylint: disable=g-import-not-at-top
  return _core.trace_ctx


def is_ref(x: Any) -> bool:
  """Whether ``x`` is a ``jax.Ref`` (``jax.new_ref``), concrete or traced.

  jax 0.10.2 and 0.12 both export ``jax.Ref``, and a tracer of a Ref is an
  instance of it; a Ref view (``ref.at[...]``) is not.
  """
  ref_type = getattr(jax, "Ref", None)
  return ref_type is not None and isinstance(x, ref_type)


def is_ref_view(x: Any) -> bool:
  """Whether ``x`` is a view of a Ref (``ref.at[...]``): jax's TransformedRef.

  jax has no public name for it, so it is recognised by its class name and
  its ``ref`` attribute, both of which jax 0.10.2 and 0.12 have.
  """
  if type(x).__name__ != "TransformedRef":
    return False
  try:
    return is_ref(x.ref)
  except Exception:  # pylint: disable=broad-except
    return False


def distributed_client():
  """The client of jax.distributed's coordination service, or None.

  Its key-value store lets process 0 hand a value to the others without a
  collective, in whatever order the processes get there; JAX exposes it only
  through a private module.
  """
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return getattr(distributed.global_state, "client", None)


def key_value_set(client, key: str, value: str) -> None:
  """Sets ``key``, replacing an earlier value where jaxlib allows it."""
  try:
    client.key_value_set(key, value, allow_overwrite=True)
  except TypeError:  # Older jaxlibs take no allow_overwrite.
    client.key_value_set(key, value)


@functools.lru_cache(maxsize=None)
def host_buffer_callback():
  """``jax.experimental.buffer_callback.buffer_callback``, or None.

  It hands the callback the computation's own host buffers (jax >= 0.7;
  the support floor, 0.10.2, has it). ``jax.pure_callback`` instead
  ``device_put``s every operand to CPU device 0 before calling back; on
  jaxlib 0.10 an operand of 102,400 bytes or more is then copied
  asynchronously on the thread pool that runs the devices' programs, and
  with a collective after the callback every thread of that pool can end up
  waiting (XLA aborts the process after its rendezvous timeout).

  Returns:
    The function, or None where this jax lacks it (callers fall back to
    ``jax.pure_callback``).
  """
  try:
    module = importlib.import_module("jax.experimental.buffer_callback")
  except ImportError:
    return None
  fn = getattr(module, "buffer_callback", None)
  return fn if callable(fn) else None
