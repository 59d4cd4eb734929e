"""Naming the kernel behind a device fault that jaxlib reports.

jaxlib's error for an illegal address or a failed launch names no kernel;
an eager ``triton_call`` can. Launches are asynchronous, so a fault surfaces
later unless ``JT_DIST_SYNC_LAUNCHES=1`` makes each eager call wait.
"""

from __future__ import annotations

import re

from jt_dist import _errors
from jt_dist import _settings

_DEVICE_FAULT = re.compile(
    r"ILLEGAL_ADDRESS|illegal memory access|illegal address|LAUNCH_FAILED"
    r"|launch failure|unspecified launch|hipErrorLaunchFailure"
    r"|hipErrorIllegalAddress|misaligned address|MISALIGNED_ADDRESS",
    re.IGNORECASE)


def is_device_fault(error: BaseException) -> bool:
  """Whether ``error`` reads as an illegal address or a failed launch."""
  return bool(_DEVICE_FAULT.search(str(error)))


def launch_fault(error: BaseException,
                 call: str) -> _errors.KernelLaunchError:
  """A KernelLaunchError naming ``call`` (kernel, grid, options) at fault."""
  synced = _settings.sync_launches()
  where = ("this call's kernel" if synced else
           "this call, or a kernel launched before it (launches are"
           " asynchronous)")
  hint = ("" if synced else
          f" Set {_settings.SYNC_LAUNCHES}=1 to make each eager call wait for"
          " its kernel, so that the fault is reported by the call that"
          " caused it.")
  return _errors.KernelLaunchError(
      f"The device reported a fault in {where}. The call: {call}."
      f" Run the kernel on the CPU (jax.default_device(jax.devices('cpu')[0]))"
      f" to have its out-of-bounds accesses named.{hint} Device error:"
      f" {error}")

