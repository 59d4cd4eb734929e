"""Math functions that refuse an operand's dtype, refused by name.

Triton's math functions (``tl.exp``, ``tl.log``, ``tl.sqrt``, ``tl.sin``,
``tl.erf``, ``tl.floor``, ...) take float32 or float64 operands only, as
libdevice does: compiling one on bfloat16, float16 or float8 fails with
"Expected dtype ['fp32', 'fp64'] but got bf16", and the interpreter raises
the same ``ValueError``, which reaches the caller wrapped in an
``InterpreterError`` that names neither the function nor the fix. Such a
refusal becomes a ``KernelTypeError`` naming the kernel, the function, the
dtype and the cast that fixes it. ``tl.sigmoid`` calls ``tl.exp`` and is
refused as it. The refusal is read from the error when it happens, so that
launches pay nothing for it.
"""

from __future__ import annotations

import re

from jt_dist import _errors
from jt_dist._cpu import interpreter as _interpreter

# "Expected dtype ['fp32', 'fp64'] but got bf16", from Triton's
# ``math._check_dtype``.
_MESSAGE = re.compile(r"Expected dtype \[(?P<accepted>[^\]]*)\] but got"
                      r" (?P<got>\w+)")
# Language names of Triton's type names, for the suggested cast.
_LANGUAGE_NAMES = {"fp16": "float16", "fp32": "float32", "fp64": "float64",
                   "bf16": "bfloat16"}


def refusal(error: BaseException | None,
            kernel: str) -> _errors.KernelTypeError | None:
  """The ``KernelTypeError`` for a math function's dtype refusal, or None
  where ``error`` (the ``InterpreterError``'s cause) is no such refusal."""
  found = (_MESSAGE.fullmatch(str(error)) if isinstance(error, ValueError)
           else None)
  name = None if found is None else _interpreter.dtype_refusing_function(
      error.__traceback__)
  if name is None:
    return None
  accepted = re.findall(r"'(\w+)'", found["accepted"])
  first = _LANGUAGE_NAMES.get(accepted[0], accepted[0]) if accepted else ""
  return _errors.KernelTypeError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_interpreter.program_id()}: tl.{name} on {found['got']}"
      f" operands. It takes {' or '.join(accepted)} operands only, and"
      f" compiling it for a GPU fails too (\"{found.group(0)}\"). Cast"
      f" the operands first, e.g. `x.to(tl.{first})`, and the result back"
      " with `.to(...)` where a narrower one is wanted.")
