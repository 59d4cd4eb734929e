"""bfloat16 on Triton's interpreter: computed on values, as GPUs compute it.

Upstream computes on bf16's raw uint16 bits. For one launch builder
operations on bf16 compute in float32 (``tl.fma`` in float64, rounding
once) and round to nearest even, as GPUs do; so do conversions and
constants. Bit moves (selects, loads, stores, ``tl.abs``) are left alone.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat

_CONVERTIBLE = ("fp16", "fp32", "fp64", "int1", "int8", "int16", "int32",
                "int64", "uint8", "uint16", "uint32", "uint64")


def is_bfloat16(scalar) -> bool:
  return scalar == tl.bfloat16


def values(bits) -> np.ndarray:
  """bf16 ``bits`` (uint16) as float32 values."""
  return np.asarray(bits).view(ml_dtypes.bfloat16).astype(np.float32)


def to_bits(vals) -> np.ndarray:
  """Float ``vals`` rounded to bf16 (nearest even), as uint16 bits."""
  return np.asarray(vals).astype(ml_dtypes.bfloat16).view(np.uint16)


def _as_float32(handle):
  """A bf16 handle's values as float32 (other handles' data unchanged)."""
  bf16 = is_bfloat16(handle.dtype.scalar)
  return values(handle.data) if bf16 else handle.data


def _any_bf16(*handles) -> bool:
  return any(is_bfloat16(h.dtype.scalar) for h in handles)


def _cast_impl(original):
  # Upstream truncates fp32 and ``astype``s the raw bits of the rest.
  def cast_impl(self, src, dst_type):
    src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
    if is_bfloat16(dst_ty) and src_ty.name in _CONVERTIBLE:
      return _interpreter.TensorHandle(to_bits(src.data), dst_ty)
    if is_bfloat16(src_ty) and dst_ty.name in _CONVERTIBLE:
      data = np.asarray(src.data).view(ml_dtypes.bfloat16).astype(
          _interpreter.np_dtype(dst_ty))  # pylint: disable=protected-access
      return _interpreter.TensorHandle(data, dst_ty)
    return original(self, src, dst_type)
  return cast_impl


def _constant(self, value):
  # Triton 3.9's interpreter rounds a bf16 constant through float32 too.
  del self
  return _interpreter.TensorHandle(to_bits(np.float32(value)).reshape(1),
                                   tl.bfloat16)


def _dot(original):
  # Compiled kernels multiply bf16 values exactly and accumulate in fp32.
  def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    if not _any_bf16(a, b):
      return original(self, a, b, d, input_precision, max_num_imprecise_acc)
    out = np.matmul(_as_float32(a), _as_float32(b), dtype=np.float32)
    result = (out + _as_float32(d)).astype(np.float32)
    if is_bfloat16(d.dtype.scalar):
      result = to_bits(result)
    return _interpreter.TensorHandle(result, d.dtype.scalar)
  return create_dot


def _on_values(original, typed_by_last=False):
  """``*_op`` on bf16 values (a select moves bits), typed bf16, int1 or
  (``typed_by_last``) as the last operand."""
  def method(self, *args):
    *handles, op = args
    if op is np.where or not _any_bf16(*handles):
      return original(self, *args)
    result = op(*map(_as_float32, handles))
    if result.dtype == np.bool_:
      return _interpreter.TensorHandle(result, tl.int1)
    result_type = handles[-1].dtype.scalar if typed_by_last else tl.bfloat16
    return _interpreter.TensorHandle(to_bits(result), result_type)
  return method


def _odd_float32(x, y, z):
  """``x * y + z`` (float64 bf16 values) rounded to float32 "to odd" (24 >=
  8 + 2 bits), so rounding it to bf16 rounds the exact result once, as a
  GPU's fma does (rounding to nearest twice could land on a false tie)."""
  with np.errstate(all="ignore"):
    product = x * y  # Exact: two 8-bit significands.
    total = product + z
    back = total - product
    error = (product - (total - back)) + (z - back)  # exact = total + error
    nearest = total.astype(np.float32)
    # Sign of (nearest - exact); the first difference is exact in float64.
    over = (nearest.astype(np.float64) - total) - error
    finite = np.isfinite(total)
    overshoots = finite & (over * np.sign(nearest) > 0)
    cut = np.where(overshoots, np.nextafter(nearest, np.float32(0)), nearest)
    bits = np.asarray(cut, np.float32).view(np.uint32)
    bits = np.where(finite & (over != 0), bits | np.uint32(1), bits)
  return bits.view(np.float32)


def _fma(original):
  def create_fma(self, x, y, z):
    if not _any_bf16(x, y, z):
      return original(self, x, y, z)
    wide = [np.asarray(_as_float32(h), np.float64) for h in (x, y, z)]
    return _interpreter.TensorHandle(to_bits(_odd_float32(*wide)),
                                     z.dtype.scalar)
  return create_fma


def printing_values(original, values_of):
  """``create_print`` printing ``values_of(handle)`` (None: as is) as a GPU
  does; a hex print shows the bits."""
  def create_print(self, prefix, hex, handles, isSigned):  # pylint: disable=redefined-builtin,invalid-name
    if not hex:
      handles = [h if (v := values_of(h)) is None
                 else _interpreter.TensorHandle(v, tl.float32)
                 for h in handles]
    return original(self, prefix, hex, handles, isSigned)
  return create_print


def _bf16_values(handle):
  return values(handle.data) if is_bfloat16(handle.dtype.scalar) else None


def bfloat16_like_compiled():
  """bf16 on values for one launch."""
  builder = _interpreter.InterpreterBuilder
  return _compat.attributes_replaced(builder, {
      "cast_impl": _cast_impl(builder.cast_impl),
      "create_dot": _dot(builder.create_dot),
      "binary_op": _on_values(builder.binary_op),
      "unary_op": _on_values(builder.unary_op),
      "ternary_op": _on_values(builder.ternary_op, typed_by_last=True),
      "create_fma": _fma(builder.create_fma),
      "create_print": printing_values(builder.create_print, _bf16_values),
      "get_bf16": _constant})
