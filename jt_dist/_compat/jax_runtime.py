"""JAX facts a call needs at run time, across JAX releases."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
# Private; read per eager call by at_top_level, so imported once here.
from jax._src import core as _jax_core  # pylint: disable=g-bad-import-order


def jit_cache_context(default: Any = None) -> Any:
  """A context in JAX's tracing and lowering cache keys (jax 0.6+)."""
  return jax.make_user_context(default_value=default)


def platform_version(device: Any) -> str:
  """The runtime a device's backend reports (e.g. its CUDA version)."""
  return str(getattr(getattr(device, "client", None), "platform_version",
                     "unknown"))


def primitive_impl(primitive) -> Callable[..., Any]:
  """jax's eager implementation of primitives (private in every release)."""
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  return functools.partial(dispatch.apply_primitive, primitive)


def at_top_level() -> bool:
  """Whether no trace is under way (private in every release)."""
  return _jax_core.trace_state_clean()


def is_ref_view(x: Any) -> bool:
  """Whether ``x`` is a view of a Ref (``ref.at[...]``), known by its
  private class's name and ``ref`` (jax 0.10.2 and 0.12)."""
  if type(x).__name__ != "TransformedRef":
    return False
  try:
    return isinstance(x.ref, jax.Ref)
  except Exception:  # pylint: disable=broad-except
    return False


def distributed_client():
  """jax.distributed's coordination client (a private module), or None:
  its key-value store passes values between processes without collectives."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def host_buffer_callback():
  """``jax.experimental.buffer_callback.buffer_callback`` (in every jax).

  It passes the host buffers as they are; ``jax.pure_callback`` copies big
  ones (102,400+ bytes, jaxlib 0.10) on the devices' thread pool, which a
  collective after the callback can deadlock (XLA then aborts).
  """
  from jax.experimental import buffer_callback  # pylint: disable=g-import-not-at-top
  return buffer_callback.buffer_callback
