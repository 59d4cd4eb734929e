"""Naming the kernel behind a device fault that jaxlib reports.

jaxlib reports an illegal address or a failed launch as a bare runtime error
that does not say which kernel caused it; an eager ``triton_call`` can.
Launches are asynchronous, so a fault usually surfaces at a later
synchronisation, unless ``JT_DIST_SYNC_LAUNCHES=1`` makes each eager call
wait for its kernel.
"""

from __future__ import annotations

import re

from jt_dist import _errors
from jt_dist import _settings

_DEVICE_FAULT = re.compile(
    r"ILLEGAL_ADDRESS|illegal memory access|illegal address|LAUNCH_FAILED"
    r"|launch failure|unspecified launch|hipErrorLaunchFailure"
    r"|hipErrorIllegalAddress|misaligned address|MISALIGNED_ADDRESS",
    re.IGNORECASE,
)


def is_device_fault(error: BaseException) -> bool:
  """Whether ``error`` reads as an illegal address or a failed launch."""
  return bool(_DEVICE_FAULT.search(str(error)))


def launch_fault(error: BaseException,
                 call: str) -> _errors.KernelLaunchError:
  """A KernelLaunchError naming the call behind the device fault ``error``.

  ``call`` describes the call: its kernel, grid and options.
  """
  synced = _settings.sync_launches()
  where = ("this call's kernel" if synced else
           "this call, or a kernel launched before it (launches are"
           " asynchronous)")
  hint = ("" if synced else
          f" Set {_settings.SYNC_LAUNCHES}=1 to make each eager call wait for"
          " its kernel, so that the fault is reported by the call that"
          " caused it.")
  return _errors.KernelLaunchError(
      f"The device reported a fault in {where}. The call:"
      f" {call}."
      f" Run the kernel on the CPU (jax.default_device(jax.devices('cpu')[0]))"
      f" to have its out-of-bounds accesses named.{hint} Device error:"
      f" {error}"
  )

