"""A boundary around compiled code that gives back a kernel's own error.

Under a caller's ``jax.jit`` a CPU kernel's fault reaches the caller as
jax's ``JaxRuntimeError``, whose message opens with the fault's own type,
kernel and words. Around the code that runs the jitted function, and waits
for its result, ``kernel_errors`` raises the fault as its own type instead,
as equinox's ``filter_jit`` does for its runtime errors.
"""

from __future__ import annotations

import contextlib

from jt_dist._core import host_faults as _host_faults


class kernel_errors(contextlib.ContextDecorator):  # pylint: disable=invalid-name
  """Re-raises kernel faults out of compiled code as jt_dist's own errors.

  A kernel fault inside a function the caller compiled (``jax.jit``, a
  ``shard_map``, a ``lax.scan`` body) leaves as ``jax.errors.JaxRuntimeError``
  whose first line is the fault's: ``jt_dist.OutOfBoundsAccessError: kernel
  'k', program id (0, 0, 0): ...``. Inside this context, or a function it
  decorates, that error is raised as the original exception
  (``jt_dist.OutOfBoundsAccessError``, ``jt_dist.KernelAssertionError``,
  ...), so it can be caught by its type. Calls that jt_dist dispatches
  itself (an eager ``triton_call``) raise the original already.

  Dispatch is asynchronous: wait for the results inside the boundary
  (``jax.block_until_ready``), where a fault surfaces.

  Example:
    >>> with jt_dist.kernel_errors():  # doctest: +SKIP
    ...   jax.block_until_ready(step(params, batch))
  """

  def __enter__(self) -> "kernel_errors":
    return self

  def __exit__(self, kind, error, traceback) -> bool:
    del kind, traceback
    if isinstance(error, KeyboardInterrupt):
      _host_faults.abandon_launches()  # The computation's launches stop.
    elif isinstance(error, Exception):
      _host_faults.raise_original(error)
    return False
