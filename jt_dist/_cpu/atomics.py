"""Atomics as GPUs run them, in the programs' order.

Float atomics the interpreter's native module lacks: a float exchange swaps
bits as same-width integers; a bf16 add is a 16-bit compare-and-swap per
lane, in lane order. Both go through the (checked, journalled) memory
module. ``AtomicOrder`` finds where a vectorised chunk's atomics would leave
the programs' order.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist._cpu import bfloat16 as _bf16
from jt_dist._cpu import vector_reviewed as _reviewed

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


class _Taken:
  """Addresses some atomic calls took: sorted, each with the last program
  that took it (``lanes`` computes them when first asked)."""

  def __init__(self, lanes):
    self._lanes = lanes  # () -> (addresses, first programs, last programs).
    self._done = None

  def lanes(self):
    if self._done is None:
      self._done, self._lanes = self._lanes(), None
    return self._done

  def last(self):
    """(Sorted distinct addresses, the last program taking each)."""
    addresses, _, last = self.lanes()
    order = np.lexsort((last, addresses))
    addresses, last = addresses[order], last[order]
    final = np.ones(addresses.shape, bool)
    final[:-1] = addresses[1:] != addresses[:-1]
    return addresses[final], last[final]

  def span(self):
    addresses = self.lanes()[0]
    return ((int(addresses.min()), int(addresses.max())) if addresses.size
            else (1, 0))


class AtomicOrder:
  """Where a chunk's atomics went, to keep the programs' order.

  Vectorised, a chunk's atomic calls run one after another, each over all
  programs in order; one program at a time, each program makes all its
  calls before the next. The orders agree unless a call takes an address
  for a program earlier than one an earlier call took it for (a ticket
  taken twice, a float sum over two statements or loop trips): there the
  launch gives way and runs one program at a time.
  """

  def __init__(self):
    self._taken: list[_Taken] = []

  def take(self, ptrs, on) -> None:
    """A call's lanes: ``ptrs`` and ``on`` with the program axis first."""
    def lanes():
      rows = np.broadcast_to(
          np.arange(ptrs.shape[0]).reshape((-1,) + (1,) * (ptrs.ndim - 1)),
          ptrs.shape)
      where = np.broadcast_to(np.asarray(on, bool), ptrs.shape)
      programs = rows[where]
      return np.asarray(ptrs)[where].astype(np.uint64), programs, programs
    self._add(_Taken(lanes))

  def take_shared(self, addresses, programs: int) -> None:
    """A call every program makes on the same ``addresses``."""
    addresses = np.asarray(addresses, np.uint64).reshape(-1)
    self._add(_Taken(lambda: (addresses, np.zeros(addresses.shape, np.int64),
                              np.full(addresses.shape, programs - 1))))

  def _add(self, taken: _Taken) -> None:
    if not self._taken:
      self._taken.append(taken)  # The usual launch: nothing to compare.
      return
    lo, hi = taken.span()
    kept, met = [], [taken]
    for earlier in self._taken:
      first, last = earlier.span()
      if first > hi or last < lo:
        kept.append(earlier)
        continue
      _refuse_reordered(earlier, taken)
      met.append(earlier)
    if len(met) > 1:
      merged = _merged(met)
      taken = _Taken(lambda: merged)
    kept.append(taken)
    self._taken = kept


def _refuse_reordered(earlier: _Taken, later: _Taken) -> None:
  addresses, last = earlier.last()
  ptrs, first, _ = later.lanes()
  at = np.minimum(np.searchsorted(addresses, ptrs), addresses.size - 1)
  hit = addresses[at] == ptrs
  if (last[at][hit] > first[hit]).any():
    raise _reviewed.Unsupported("an atomic on an address an earlier atomic took for a"
                      " later program (program order would differ)")


def _merged(met):
  parts = [t.last() for t in met]
  addresses = np.concatenate([a for a, _ in parts])
  last = np.concatenate([p for _, p in parts])
  return addresses, last, last
