"""JAX facts a call needs at run time, across JAX releases.

Eager primitive dispatch, Refs, the cache-key context, devices' runtime
versions, jax.distributed's key-value store and host buffer callbacks.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
# Private; read per eager call by at_top_level, so imported once here.
from jax._src import core as _jax_core  # pylint: disable=g-bad-import-order


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


def primitive_impl(primitive) -> Callable[..., Any]:
  """The eager implementation jax gives its own primitives: jit and cache.

  jax has no public name for it (``jax.ffi`` uses the same private
  ``dispatch.apply_primitive``); present in every supported release.
  """
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  return functools.partial(dispatch.apply_primitive, primitive)


def at_top_level() -> bool:
  """Whether no trace is under way (an eager call, not inside a jit).

  jax has no public name for it; ``core.trace_state_clean`` is in every
  supported release. A call with no traced operand can still be inside the
  caller's trace (arrays closed over, scalars only).
  """
  return _jax_core.trace_state_clean()


def is_ref_view(x: Any) -> bool:
  """Whether ``x`` is a view of a Ref (``ref.at[...]``): jax's TransformedRef.

  jax has no public name for it, so it is recognised by its class name and
  its ``ref`` attribute, both of which jax 0.10.2 and 0.12 have.
  """
  if type(x).__name__ != "TransformedRef":
    return False
  try:
    return isinstance(x.ref, jax.Ref)
  except Exception:  # pylint: disable=broad-except
    return False


def distributed_client():
  """The client of jax.distributed's coordination service, or None.

  Its key-value store lets process 0 hand a value to the others without a
  collective, in whatever order the processes get there; JAX exposes it only
  through a private module.
  """
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def host_buffer_callback():
  """``jax.experimental.buffer_callback.buffer_callback``.

  It hands the callback the computation's own host buffers (every supported
  jax has it). ``jax.pure_callback`` instead
  ``device_put``s every operand to CPU device 0 before calling back; on
  jaxlib 0.10 an operand of 102,400 bytes or more is then copied
  asynchronously on the thread pool that runs the devices' programs, and
  with a collective after the callback every thread of that pool can end up
  waiting (XLA aborts the process after its rendezvous timeout).
  """
  from jax.experimental import buffer_callback  # pylint: disable=g-import-not-at-top
  return buffer_callback.buffer_callback
