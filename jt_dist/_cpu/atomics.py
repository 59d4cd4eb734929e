"""Float atomics the interpreter's native module lacks, as GPUs run them.

A float exchange swaps bits as same-width integers; a bf16 add is a 16-bit
compare-and-swap per lane, in lane order. Both go through the (checked,
journalled) memory module.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist._cpu import bfloat16 as _bf16

TensorHandle = _interpreter.TensorHandle
_OP = _interpreter.ATOMIC_OP
# Float types the native module cannot exchange -> integers of their width.
_EXCHANGED_AS = {np.dtype(np.float32): (np.int32, tl.int32),
                 np.dtype(np.float64): (np.int64, tl.int64)}


def _ranks(addresses) -> np.ndarray:
  """How many earlier lanes go to each lane's address (one stable sort)."""
  order = np.argsort(addresses, kind="stable")
  ordered = addresses[order]
  starts = np.ones(ordered.shape, bool)
  starts[1:] = ordered[1:] != ordered[:-1]
  first = np.maximum.accumulate(np.where(starts, np.arange(ordered.size), 0))
  ranks = np.empty(ordered.shape, np.int64)
  ranks[order] = np.arange(ordered.size) - first
  return ranks


def _bf16_add(ptr, val, mask, sem) -> TensorHandle:
  """``tl.atomic_add`` on bf16; each address takes its lanes in order."""
  ptrs, vals, on = np.broadcast_arrays(
      np.asarray(ptr.data), np.asarray(val.data),
      np.asarray(mask.data, dtype=bool))
  shape = ptrs.shape
  ptrs, vals, on = (np.ravel(a) for a in (ptrs, vals, on))
  old = np.zeros(ptrs.shape, np.uint16)
  lanes = np.flatnonzero(on)
  ranks = _ranks(ptrs[lanes])
  memory = _interpreter.native_memory()
  sem = _interpreter.InterpreterBuilder.ir_sem_to_interpreter_sem[sem]
  # Round r takes the r-th lane of every address.
  for rank in range(int(ranks.max()) + 1 if lanes.size else 0):
    chosen = lanes[ranks == rank]
    at = ptrs[chosen]
    # A swap of a value for itself reads the memory without changing it.
    probe = np.zeros(at.shape, np.uint16)
    current = np.asarray(memory.atomic_cas(at, probe, probe, sem))
    total = _bf16.to_bits(_bf16.values(current) + _bf16.values(vals[chosen]))
    memory.atomic_cas(at, current, np.ascontiguousarray(total), sem)
    old[chosen] = current
  return TensorHandle(old.reshape(shape), tl.bfloat16)


def _atomic_rmw(original):
  def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):  # pylint: disable=invalid-name
    data = np.ascontiguousarray(val.data)
    if rmwOp == _OP.XCHG and data.dtype in _EXCHANGED_AS:
      bits, bits_type = _EXCHANGED_AS[data.dtype]
      old = original(self, rmwOp, ptr, TensorHandle(data.view(bits), bits_type),
                     mask, sem, scope)
      return TensorHandle(np.asarray(old.data).view(data.dtype),
                          val.dtype.scalar)
    if rmwOp == _OP.FADD and _bf16.is_bfloat16(val.dtype.scalar):
      return _bf16_add(ptr, val, mask, sem)
    return original(self, rmwOp, ptr, val, mask, sem, scope)
  return create_atomic_rmw


def float_atomics_on_values():
  """Float exchanges and bf16 adds for one launch."""
  builder = _interpreter.InterpreterBuilder
  return _compat.attributes_replaced(builder, {
      "create_atomic_rmw": _atomic_rmw(builder.create_atomic_rmw)})
