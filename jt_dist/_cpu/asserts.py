"""Kernel asserts on Triton's interpreter, as ``debug=True`` promises.

Triton compiles ``tl.device_assert`` only in debug mode, and fails a
compilation at a false ``tl.static_assert`` whatever the mode. The
interpreter's builder always runs with ``debug=False``, so upstream a
device assert is skipped, and a failing assert of either kind surfaces as a
bare ``AssertionError`` wrapped in an ``InterpreterError``. For one launch
(the caller holds the interpreter lock) the builder takes the call's
``debug`` flag, and a failing assert raises ``KernelAssertionError`` naming
the kernel, the program id and the assert's message; a static assert's
also names its line and the kernel's line that reached it (an assert in a
library function, such as ``tl.rand``'s on its seed, has no message).
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
  """The builder's options for one launch: ``debug``, and overflow checks.

  Triton's integer-overflow check (``sanitize_overflow``) ends in a device
  assert, which is a no-op unless ``debug``; without ``debug`` the check's
  int64 arithmetic, comparisons and masks are dead work on every ``+``,
  ``-`` and ``*`` of int32 values, in every launch. Compiled kernels drop it
  the same way.
  """
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
  """" at FILE:LINE (`SOURCE`)" of a static assert's line ``caller``, then
  the kernel's line that reached it where that differs (a helper's assert)."""
  own = _bounds.source_line(caller.f_code.co_filename, caller.f_lineno)
  kernel_line = _bounds.running_kernel_location()
  if not kernel_line or kernel_line == own:
    return f" at {own}"
  return f" at {own}, reached from the kernel's line {kernel_line}"


@contextlib.contextmanager
def kernel_asserts(kernel: str, debug: bool):
  """Turns device asserts on with the call's ``debug`` and names failures.

  Enter inside ``_interpreter.language_patched()``: the
  ``static_assert`` it installs replaces the interpreter's.
  """
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
