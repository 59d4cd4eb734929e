"""Float8 on Triton's interpreter: computed on values, or refused by name.

Upstream computes on float8's raw uint8 bits. GPU backends refuse float8
arithmetic, comparisons and math, so for one launch these raise
``KernelTypeError``; conversions to float8 round to nearest even and
saturate as NVIDIA's ``cvt.rn.satfinite``; conversions from it, ``tl.dot``
and ``tl.device_print`` take the values. Bit moves are left alone.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._cpu import bfloat16 as _bf16

# Triton's float8 types with a NumPy twin, by Triton name.
_VALUE_TYPES = {
    "fp8e4nv": ml_dtypes.float8_e4m3fn,
    "fp8e5": ml_dtypes.float8_e5m2,
    "fp8e4b8": ml_dtypes.float8_e4m3fnuz,
    "fp8e5b16": ml_dtypes.float8_e5m2fnuz,
}
# Float types that hold every float8 value, converted through float32/64.
_FLOAT_SOURCES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16,
                  "fp32": np.float32, "fp64": np.float64}
_ANY_FLOAT = {**_FLOAT_SOURCES, **_VALUE_TYPES}
# How a kernel spells the refused operations.
_SPELLING = {
    "add": "+", "subtract": "-", "multiply": "*", "divide": "/",
    "fmod": "%", "less": "<", "greater": ">", "less_equal": "<=",
    "greater_equal": ">=", "equal": "==", "not_equal": "!=",
    "negative": "unary -", "minimum": "tl.minimum", "maximum": "tl.maximum",
    "fmin": "tl.minimum", "fmax": "tl.maximum", "clip": "tl.clamp",
}


def refusal(kernel: str, what: str, scalar) -> _errors.KernelTypeError:
  """Refuses ``what`` (a ufunc's name, or "tl.sum" etc.) on float8."""
  spelled = _SPELLING.get(what)
  op = f"`{spelled}` ({what})" if spelled else f"{what}"
  twin = _VALUE_TYPES.get(scalar.name)
  type_name = scalar.name + (f" ({np.dtype(twin).name})" if twin else "")
  # fp8e5 is spelled tl.float8e5.
  language_name = scalar.name.replace("fp8", "float8", 1)
  return _errors.KernelTypeError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_interpreter.program_id()}: {op} on {type_name}"
      " operands. Triton does not compile arithmetic, comparisons, minimum,"
      " maximum or math functions on float8 values for GPUs, nor the"
      " reductions and scans made of them, and the CPU interpreter would"
      " apply them to the raw bits. Cast to a wider type first, e.g."
      " `x.to(tl.float32)`, and back with"
      f" `.to(tl.{language_name})` for a float8 result.")


def _values(handle, twins=_VALUE_TYPES):
  """A handle's values as float32 (fp64: float64), or None where ``twins``
  (by default, the float8 types) has none for its type."""
  name = handle.dtype.scalar.name
  if name not in twins:
    return None
  values = np.asarray(handle.data).view(twins[name])
  return values if name == "fp64" else values.astype(np.float32)


def _to_float8(values, scalar):
  """Float ``values`` as bits of ``scalar``, a float8 type with a twin."""
  twin = _VALUE_TYPES[scalar.name]
  largest = float(ml_dtypes.finfo(twin).max)
  # NaN stays NaN; anything beyond the largest finite value becomes it.
  clipped = np.clip(values, -largest, largest)
  bits = np.asarray(clipped).astype(twin).view(np.uint8)
  return _interpreter.TensorHandle(bits, scalar)


def _constant(scalar):
  """A float8 constant on values (3.6 has none; 3.9 truncates float32)."""
  def get(self, value):
    del self
    return _to_float8(np.array([value], np.float32), scalar)
  return get


def _conversion(src, dst_type, narrowing: bool):
  """``src`` converted to float8 (if ``narrowing``) as NVIDIA GPUs convert,
  or from float8 exactly; else None."""
  dst = dst_type.scalar
  if dst.name in _VALUE_TYPES:
    values = _values(src, _ANY_FLOAT) if narrowing else None
    return None if values is None else _to_float8(values, dst)
  values = _values(src)
  if values is None or dst.name not in _FLOAT_SOURCES:
    return None
  data = values.astype(_FLOAT_SOURCES[dst.name])
  if dst.name == "bf16":
    data = data.view(np.uint16)
  return _interpreter.TensorHandle(data, dst)


def _converting(original):
  # Upstream ``astype``s the bits or the number (a constant 1.5 became the
  # bits 0x01); ``create_fp_to_fp`` narrows to float8 only rounding RTNE.
  def convert(self, src, dst_type, *rounding_mode):
    narrowing = not rounding_mode or getattr(
        rounding_mode[0], "name", None) == "RTNE"
    converted = _conversion(src, dst_type, narrowing)
    # A handle's truth is its data's: compared with None, not `or`ed.
    return (original(self, src, dst_type, *rounding_mode)
            if converted is None else converted)
  return convert


def _dot(original):
  # Upstream widens float8 operands' bits, as its casts do.
  def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    a_values, b_values = _values(a), _values(b)
    if a_values is None or b_values is None:
      return original(self, a, b, d, input_precision, max_num_imprecise_acc)
    acc = np.asarray(d.data)
    out = np.matmul(a_values, b_values, dtype=acc.dtype) + acc
    return _interpreter.TensorHandle(out, d.dtype.scalar)
  return create_dot


def _refusing(kernel, original, operands: int, what=None):
  """``original`` refusing float8 in its first ``operands`` arguments (not
  in a select, which moves bits), named ``what`` or by the ufunc."""
  def method(self, *args):
    scalar = next((h.dtype.scalar for h in args[:operands]
                   if h.dtype.scalar.is_fp8()), None)
    if scalar is None or args[-1] is np.where:
      return original(self, *args)
    raise refusal(kernel, what or args[-1].__name__, scalar)
  return method


def float8_like_compiled(kernel: str):
  """Float8 on values, or refused, for one launch."""
  builder = _interpreter.InterpreterBuilder
  # A clamp is refused as such, before upstream splits it in two.
  return _compat.attributes_replaced(builder, {
      "binary_op": _refusing(kernel, builder.binary_op, 2),
      "unary_op": _refusing(kernel, builder.unary_op, 1),
      "ternary_op": _refusing(kernel, builder.ternary_op, 3),
      "create_fma": _refusing(kernel, builder.create_fma, 3, "tl.fma"),
      "create_clampf": _refusing(kernel, builder.create_clampf, 3, "clip"),
      "create_fp_to_fp": _converting(builder.create_fp_to_fp),
      "create_fp_trunc": _converting(builder.create_fp_trunc),
      "create_dot": _dot(builder.create_dot),
      "create_print": _bf16.printing_values(builder.create_print, _values),
      **{f"get_{name}": _constant(tl.dtype(name)) for name in _VALUE_TYPES}})
