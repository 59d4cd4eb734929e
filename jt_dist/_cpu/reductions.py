"""Reductions and scans on bfloat16 and float8 values, as GPUs run them.

Upstream reduces bf16 and float8 with NumPy on their raw bits. Here the
fast paths (sum, min/max with indices, argmin/argmax, cumsum, cumprod) run
on values, one program at a time and vectorised alike: bf16 rounding each
partial result as a GPU's lane tree does; float8 refused, as GPUs compile
none of them. A combine function changing its operands' types is refused
(``CheckedCombine``).
"""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np
import triton.language as tl
from triton.language import core as tl_core
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._cpu import bfloat16 as _bf16
from jt_dist._cpu import float8 as _float8

TensorHandle = _interpreter.TensorHandle


def _narrow(scalar) -> bool:
  return _bf16.is_bfloat16(scalar) or scalar.is_fp8()


def _refuse_float8(kernel: str, what: str, scalar) -> None:
  if scalar.is_fp8():
    raise _float8.refusal(kernel, what, scalar)


def _tree_sum(bits, axis: int) -> np.ndarray:
  """The bf16 sum of ``bits`` along ``axis``, each partial sum rounded."""
  vals = np.moveaxis(_bf16.values(bits), axis, -1)
  if vals.shape[-1] == 0:
    return _bf16.to_bits(np.zeros(vals.shape[:-1], np.float32))
  while vals.shape[-1] > 1:
    half = vals.shape[-1] // 2
    pairs = _bf16.values(_bf16.to_bits(vals[..., :half]
                                       + vals[..., half:2 * half]))
    vals = (pairs if vals.shape[-1] == 2 * half
            else np.concatenate([pairs, vals[..., 2 * half:]], axis=-1))
  return _bf16.to_bits(vals[..., 0])


def sum_along(data, axis: int, scalar, kernel: str) -> np.ndarray:
  """``np.sum`` of storage ``data`` as a GPU's ``tl.sum`` adds ``scalar``."""
  if _bf16.is_bfloat16(scalar):
    return _tree_sum(data, axis)
  _refuse_float8(kernel, "tl.sum", scalar)
  return np.sum(data, axis=axis)


def scan_along(what: str, data, axis: int, scalar, kernel: str) -> np.ndarray:
  """``tl.cumsum`` or ``tl.cumprod`` (``what``), as ``sum_along``."""
  scan = np.cumsum if what == "tl.cumsum" else np.cumprod
  if _bf16.is_bfloat16(scalar):
    # ml_dtypes adds (multiplies) in float32 and rounds each step to bf16.
    steps = scan(np.asarray(data).view(ml_dtypes.bfloat16), axis=axis)
    return steps.view(np.uint16)
  _refuse_float8(kernel, what, scalar)
  return scan(data, axis=axis)


def _retyped(tensor, scalar, data):
  ty = (tl.block_type(scalar, list(tensor.type.shape))
        if tensor.type.is_block() else scalar)
  return tl_core.tensor(TensorHandle(data, scalar), ty)


# The ``tl`` function behind a ``nan_ignoring`` index (else value) reduction.
_MIN_MAX_NAMES = {np.nanargmin: "tl.argmin", np.nanargmax: "tl.argmax",
                  np.nanmin: "tl.min", np.nanmax: "tl.max"}


class CheckedCombine:
  """``combine_fn`` refusing a change of its operands' types, as compiling
  does (upstream would store floats into bf16 bits)."""

  def __init__(self, combine_fn, kernel: str, what: str):
    self.combine_fn = combine_fn
    self.kernel = kernel
    self.what = what  # "tl.reduce" or "tl.associative_scan".

  def fn(self, *args):
    returned = self.combine_fn.fn(*args)
    results = returned if isinstance(returned, tuple) else (returned,)
    for result, operand in zip(results, args):
      # Python numbers are left to upstream, as it leaves them.
      if isinstance(result, tl_core.tensor) and result.dtype != operand.dtype:
        op = "tt.reduce" if self.what == "tl.reduce" else "tt.scan"
        raise _errors.KernelTypeError(
            f"triton_call: kernel {self.kernel!r}, program id"
            f" {_interpreter.program_id()}: {self.what} on"
            f" {operand.dtype.name} operands whose combine function returns"
            f" {result.dtype.name} values. A combine function must return its"
            f" operands' types: Triton's compiler refuses it (\"'{op}' op type"
            " mismatch on combine operation\"), and the CPU interpreter would"
            f" store the values into {operand.dtype.name} as they are. Cast"
            " what it returns, e.g. `tl.maximum(a, b).to(a.dtype)` (Triton"
            " 3.6's tl.minimum, tl.maximum and tl.clamp return float32 for"
            " bfloat16 operands).")
    return returned


class KernelNamed:
  """A reduction or scan knowing its kernel's name."""

  def __init__(self, *args, kernel: str = "?", **kwargs):
    super().__init__(*args, **kwargs)
    self.kernel = kernel


class ReduceOnValues(KernelNamed, _interpreter.ReduceOps):
  """Upstream's reductions, bf16 on values (min/max ignoring NaN, as 3.9),
  float8 refused; blocks follow ``LEAD`` program axes (1 vectorised)."""

  LEAD = 0

  def _flat(self, data):
    """``data`` and the axis to reduce (the block flattened if None)."""
    if self.axis is None:
      return data.reshape(data.shape[:self.LEAD] + (-1,)), self.LEAD
    return data, int(self.axis) + self.LEAD

  def _shaped(self, out, ndim: int):
    """``out`` of an ``ndim`` input, reduced dims kept if ``keep_dims``."""
    if not self.keep_dims:
      return out
    if self.axis is None:
      return out.reshape(out.shape[:self.LEAD] + (1,) * (ndim - self.LEAD))
    return np.expand_dims(out, int(self.axis) + self.LEAD)

  def min_max(self, input, val_reduce_op, idx_reduce_op=None):  # pylint: disable=redefined-builtin
    input = input[0] if isinstance(input, tuple) else input
    if _narrow(input.dtype):
      val_reduce_op = _interpreter.nan_ignoring(val_reduce_op)
      idx_reduce_op = _interpreter.nan_ignoring(idx_reduce_op)
      _refuse_float8(self.kernel,
                     _MIN_MAX_NAMES[idx_reduce_op or val_reduce_op],
                     input.dtype)
      wide = _retyped(input, tl.float32, _bf16.values(input.handle.data))
      out = self.min_max(wide, val_reduce_op, idx_reduce_op)
      outs = out if isinstance(out, tuple) else (out,)
      # The extreme value is one of the inputs: back to bf16 exactly.
      outs = tuple(
          _retyped(o, tl.bfloat16, _bf16.to_bits(o.handle.data))
          if o.dtype == tl.float32 else o for o in outs)
      return outs if isinstance(out, tuple) else outs[0]
    data = np.asarray(input.handle.data)
    flat, axis = self._flat(data)
    outs = [self.to_tensor(self._shaped(op(flat, axis=axis), data.ndim), dt)
            for op, dt in ((val_reduce_op, input.dtype),
                           (idx_reduce_op, tl.int32)) if op]
    return outs[0] if len(outs) == 1 else tuple(outs)

  def sum(self, input):  # pylint: disable=redefined-builtin
    if not _narrow(input.dtype) and not self.LEAD:
      return super().sum(input)  # Upstream's, one program at a time.
    data = np.asarray(input.handle.data)
    out = sum_along(*self._flat(data), input.dtype, self.kernel)
    return self.to_tensor(self._shaped(out, data.ndim), input.dtype)

  def generic_reduce(self, input):  # pylint: disable=redefined-builtin
    self.combine_fn = CheckedCombine(self.combine_fn, self.kernel, "tl.reduce")
    return super().generic_reduce(input)


class ScanOnValues(KernelNamed, _interpreter.ScanOps):
  """Upstream's one-program scans, on values."""

  def generic_scan(self, input):  # pylint: disable=redefined-builtin
    self.combine_fn = CheckedCombine(self.combine_fn, self.kernel,
                                     "tl.associative_scan")
    return super().generic_scan(input)

  def _scan(self, what, input, upstream):  # pylint: disable=redefined-builtin
    if not _narrow(input.dtype):
      return upstream(input)
    out = scan_along(what, input.handle.data, int(self.axis), input.dtype,
                     self.kernel)
    return [self.to_tensor(out, input.dtype)]

  def cumsum(self, input):  # pylint: disable=redefined-builtin
    return self._scan("tl.cumsum", input, super().cumsum)

  def cumprod(self, input):  # pylint: disable=redefined-builtin
    return self._scan("tl.cumprod", input, super().cumprod)


def language_functions(kernel: str, reduce_ops, scan_ops) -> dict:
  """``tl.reduce`` and ``tl.associative_scan`` run by these classes."""
  def reduce(input, axis, combine_fn, keep_dims=False, **_):  # pylint: disable=redefined-builtin
    return reduce_ops(axis, combine_fn, keep_dims, kernel=kernel).apply(input)

  def scan(input, axis, combine_fn, reverse=False, **_):  # pylint: disable=redefined-builtin
    return scan_ops(axis, combine_fn, reverse, kernel=kernel).apply(input)

  return {"reduce": reduce, "associative_scan": scan}


@contextlib.contextmanager
def reductions_on_values(kernel: str):
  """``tl.reduce``/``tl.associative_scan`` on values; enter inside
  ``_interpreter.language_patched()``."""
  replacements = language_functions(kernel, ReduceOnValues, ScanOnValues)
  with _compat.attributes_replaced(tl, replacements), \
      _compat.attributes_replaced(tl_core, replacements):
    yield
