"""Kernel asserts on Triton's interpreter, as ``debug=True`` promises.

Upstream's builder skips device asserts and a failure is a bare
``AssertionError``; here the builder takes the call's ``debug`` and a failure
raises ``KernelAssertionError`` naming kernel, program id and message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import numpy as np
import triton.language as tl
from triton.language import core as tl_core
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._cpu import bounds as _bounds


def _launch_options(options, debug: bool):
  """Without ``debug`` no ``sanitize_overflow``: its no-op device assert is
  dead work on every int32 ``+``, ``-``, ``*`` (compiled kernels drop it)."""
  changes = {"debug": debug}
  if not debug and getattr(options, "sanitize_overflow", False):
    changes["sanitize_overflow"] = False
  return dataclasses.replace(options, **changes)


def _failure(kernel: str, which: str, message, detail: str = ""):
  text = message.value if isinstance(message, tl.constexpr) else message
  return _errors.KernelAssertionError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_interpreter.program_id()}: {which} failed{detail}:"
      f" {text!s}")


def _static_assert_location(caller) -> str:
  """Where a static assert ran, and the kernel line that reached it."""
  own = _bounds.source_line(caller.f_code.co_filename, caller.f_lineno)
  kernel_line = _bounds.running_kernel_location()
  if not kernel_line or kernel_line == own:
    return f" at {own}"
  return f" at {own}, reached from the kernel's line {kernel_line}"


@contextlib.contextmanager
def kernel_asserts(kernel: str, debug: bool):
  """Device asserts on with ``debug``, failures named; enter inside
  ``_interpreter.language_patched()``, whose ``static_assert`` this replaces."""
  builder = _interpreter.builder()

  def create_assert(self, condition, message):
    del self
    holds = np.asarray(condition.data, dtype=bool)
    if not holds.all():
      detail = f" in {int((~holds).sum())} of {holds.size} lanes"
      raise _failure(kernel, "tl.device_assert", message, detail)

  def static_assert(cond, msg="", **kwargs):
    del kwargs
    if not cond:  # A constexpr's truth is its value's.
      where = _static_assert_location(sys._getframe(1))  # pylint: disable=protected-access
      raise _failure(kernel, "tl.static_assert", msg or "(no message)", where)

  options = _launch_options(builder.options, bool(debug))
  with (_compat.attributes_replaced(builder, {"options": options}),
        _compat.attributes_replaced(_interpreter.InterpreterBuilder,
                                    {"create_assert": create_assert}),
        _compat.attributes_replaced(tl, {"static_assert": static_assert}),
        _compat.attributes_replaced(tl_core,
                                    {"static_assert": static_assert})):
    yield
