"""Math functions that refuse an operand's dtype, refused by name.

Triton's math functions (``tl.exp``, ``tl.log``, ``tl.sqrt``, ``tl.sin``,
``tl.erf``, ``tl.floor``, ...) take float32 or float64 operands only, as
libdevice does: compiling one on bfloat16, float16 or float8 fails with
"Expected dtype ['fp32', 'fp64'] but got bf16", and the interpreter raises
the same ``ValueError``, which reaches the caller wrapped in an
``InterpreterError`` that names neither the function nor the fix. For one
launch (the caller holds the interpreter lock) such a refusal is a
``KernelTypeError`` naming the kernel, the function, the dtype and the
cast that fixes it. ``tl.sigmoid`` calls ``tl.exp`` and is refused as it.
"""

from __future__ import annotations

import contextlib
import re

import triton.language as tl

from jt_dist import _compat
from jt_dist import _errors

# "Expected dtype ['fp32', 'fp64'] but got bf16", from Triton's
# ``math._check_dtype``.
_MESSAGE = re.compile(r"Expected dtype \[(?P<accepted>[^\]]*)\] but got"
                      r" (?P<got>\w+)")
# Language names of Triton's type names, for the suggested cast.
_LANGUAGE_NAMES = {"fp16": "float16", "fp32": "float32", "fp64": "float64",
                   "bf16": "bfloat16"}
# Read before any launch patches ``tl.math``.
_CHECKED = _compat.math_functions_checking_dtype()


def _refusal(kernel: str, name: str, found) -> _errors.KernelTypeError:
  accepted = re.findall(r"'(\w+)'", found["accepted"])
  first = _LANGUAGE_NAMES.get(accepted[0], accepted[0]) if accepted else ""
  return _errors.KernelTypeError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_compat.interpreter_program_id()}: tl.{name} on {found['got']}"
      f" operands. It takes {' or '.join(accepted)} operands only, and"
      f" compiling it for a GPU fails too (\"{found.group(0)}\"). Cast"
      f" the operands first, e.g. `x.to(tl.{first})`, and the result back"
      " with `.to(...)` where a narrower one is wanted.")


def _refusing(kernel: str, name: str, function):
  def call(*args, **kwargs):
    try:
      return function(*args, **kwargs)
    except ValueError as e:
      found = _MESSAGE.fullmatch(str(e))
      if found is None:
        raise
      raise _refusal(kernel, name, found) from None
  return call


@contextlib.contextmanager
def math_dtypes_refused_by_name(kernel: str):
  """Makes the math functions' dtype refusals ``KernelTypeError``s.

  Enter inside ``_compat.interpreter_language_patched()``: this wraps the
  functions it installed, wherever a kernel reaches them (``tl.exp``,
  ``tl.math.exp``, ``x.exp()``).

  Args:
    kernel: the kernel's name, for the messages.
  """
  with contextlib.ExitStack() as stack:
    for owner in (tl, tl.math, tl.core.tensor):
      replacements = {name: _refusing(kernel, name, vars(owner)[name])
                      for name in _CHECKED if name in vars(owner)}
      stack.enter_context(_compat.attributes_replaced(owner, replacements))
    yield
