"""Bounds and initialisation checks for kernels run through the interpreter.

Unchecked, a kernel past its buffer reads garbage or kills the process. Pointer
parameter ``k`` gets the *tagged* address ``(k + 1) << 40`` plus half a region,
so any derived pointer still names ``k`` (top bits) and its offset; an access
reaches real memory only once its enabled lanes are checked. Outputs carry a
byte map of what was written, so reading an unwritten byte raises too.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from typing import NamedTuple

import numpy as np
import triton

from jt_dist import _errors
from jt_dist import _settings
from jt_dist._cpu import interpreter as _interpreter
from jt_dist._cpu import host_memory as _host_memory

_REGION_BITS = 40
_HALF_REGION = 1 << (_REGION_BITS - 1)
# Tagged addresses keep the real low bits: alignment checks see the same.
_ALIGN_MASK = 0xFFF
_SHOWN_OFFSETS = 8


class Buffer(NamedTuple):
  """One pointer parameter's buffer."""

  param: str
  role: str
  array: np.ndarray
  # Byte map of what the launch wrote; None where all starts defined.
  written: np.ndarray | None = None


class MemoryChecker:
  """Checks, then performs, the interpreter's accesses for one launch."""

  def __init__(self, kernel: str, buffers: list[Buffer]):
    self.kernel = kernel
    self.buffers = buffers
    self._count = len(buffers)
    real = [b.array.ctypes.data for b in buffers] or [0]
    self._real = np.array(real, np.uint64)
    self._nbytes = np.array([b.array.nbytes for b in buffers] or [0], np.int64)
    tags = np.arange(1, len(real) + 1, dtype=np.uint64) << _REGION_BITS
    self._tagged = (tags + np.uint64(_HALF_REGION)
                    + (self._real & np.uint64(_ALIGN_MASK)))
    self._tracks_writes = any(b.written is not None for b in buffers)

  def tagged_address(self, k: int) -> int:
    return int(self._tagged[k])

  def real(self, k: int, offsets) -> np.ndarray:
    return self._real[k] + offsets.view(np.uint64)

  def translate_lanes(self, op, ptrs, mask, itemsize, reads, writes):
    """Real addresses, each enabled lane checked and tracked on its own
    (several buffers, or an access to describe as an error)."""
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    on = np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
    index = (ptrs >> np.uint64(_REGION_BITS)).astype(np.int64) - 1
    known = (index >= 0) & (index < self._count)
    index = np.where(known, index, 0)
    offset = ptrs.view(np.int64) - self._tagged[index].view(np.int64)
    inside = known & (offset >= 0) & (offset + itemsize <= self._nbytes[index])
    bad = on & ~inside
    if bad.any():
      raise self._out_of_bounds(op, index, known, offset, bad, on, itemsize)
    if self._tracks_writes:
      self._track(op, index, offset, on, itemsize, reads, writes)
    return self._real[index] + np.where(inside, offset, 0).astype(np.uint64)

  def locate(self, op: str, ptrs, mask, itemsize: int, *, reads: bool,
             writes: bool):
    """``(k, byte offsets)`` where all lanes name buffer ``k`` and enabled
    ones are inside (disabled ones get offset 0), checked and tracked; else
    None, for ``translate_lanes``."""
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    if not ptrs.size:
      return None
    lo, hi = int(ptrs.min()), int(ptrs.max())
    k = (lo >> _REGION_BITS) - 1
    if k != (hi >> _REGION_BITS) - 1 or not 0 <= k < self._count:
      return None
    on = np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
    base = int(self._tagged[k])
    offset = ptrs.view(np.int64) - np.int64(base)
    last = int(self._nbytes[k]) - itemsize
    if lo - base < 0 or hi - base > last:  # Else no pass over the lanes.
      if on.all():
        return None
      inside = (offset >= 0) & (offset <= last)
      if (on & ~inside).any():
        return None
      offset = np.where(inside, offset, 0)
    if self.buffers[k].written is not None:
      starts = offset.reshape(-1) if on.all() else offset[on]
      self._track_buffer(op, k, starts, on, itemsize, reads, writes)
    return k, offset

  def _track(self, op, index, offset, on, itemsize, reads, writes):
    for k in np.unique(index[on]):
      if self.buffers[k].written is None:
        continue
      lanes = on & (index == k)
      self._track_buffer(op, k, offset[lanes], on, itemsize, reads, writes)

  def _track_buffer(self, op, k, starts, on, itemsize, reads, writes):
    """Checks and records the written bytes at byte offsets ``starts``."""
    written = self.buffers[k].written
    if (itemsize in (2, 4, 8) and written.size % itemsize == 0 and starts.size
        and not int(np.bitwise_or.reduce(starts, axis=None)) & (itemsize - 1)):
      # Aligned: one word of the byte map per element, all ones where
      # written. (Shifts: NumPy's integer division is several times slower.)
      table = written.view(np.dtype(f"<u{itemsize}"))
      index = starts >> (itemsize.bit_length() - 1)
      full = int.from_bytes(b"\x01" * itemsize, "little")
      unwritten = (table[index] != full) if reads else None
    else:
      table, full = written, True
      index = starts[:, None] + np.arange(itemsize)
      unwritten = ~written[index].all(axis=1) if reads else None
    if reads and unwritten.any():
      raise self._unwritten(op, k, starts[unwritten], on, itemsize)
    if writes:
      table[index] = full

  def unwritten_outputs(self) -> list[tuple[int, np.ndarray]]:
    """``(k, element offsets)`` of each output left partly unwritten."""
    # The whole map first: one fast pass where all was written.
    return [(k, np.flatnonzero(~b.written.reshape(b.array.size, -1).all(1)))
            for k, b in enumerate(self.buffers)
            if b.written is not None and b.array.size and not b.written.all()]

  def unwritten_message(self, k: int, elements: np.ndarray) -> str:
    return (
        f"triton_call: kernel {self.kernel!r} left {elements.size} of"
        f" {self.buffers[k].array.size} elements of {self.describe(k)}"
        f" unwritten: element offsets {_first(elements)}. The buffer"
        f" {self._extent(k)}. They come back as 0xFF bytes (NaN for floats)"
        " on the CPU, and as whatever the memory held on a GPU. Check that"
        " the grid and the block size cover the output (a row of n"
        " elements needs a block of triton.next_power_of_2(n) lanes, or a"
        " loop over blocks), or pass zeroed_outputs= (starts at zero) or"
        " input_output_aliases= (starts as the input) if the rest is meant"
        " to keep its start."
    )

  def describe(self, k: int) -> str:
    b = self.buffers[k]
    return f"{b.param!r} ({b.role})"

  def _where(self, op: str) -> str:
    pid = _interpreter.program_id()
    return f"kernel {self.kernel!r}, program id {pid}: {op} through"

  def _extent(self, k: int) -> str:
    a = self.buffers[k].array
    return (f"holds {a.size} {a.dtype.name} elements ({a.nbytes} bytes,"
            f" shape {tuple(a.shape)})")

  def _out_of_bounds(self, op, index, known, offset, bad, on, itemsize):
    k = int(index[bad][0])
    if not known[bad][0]:
      return _errors.OutOfBoundsAccessError(
          f"{self._where(op)} a pointer that points into no buffer of the"
          f" call ({int(bad.sum())} lanes; {_mask_text(on)}). Pointers must be"
          " derived from a pointer parameter by adding offsets."
          f"{_stack_location()}"
      )
    lanes = bad & (index == k)
    elements = offset[lanes] // itemsize
    size = self.buffers[k].array.nbytes // itemsize
    hint = (" Negative offsets are what 32-bit offset arithmetic gives when"
            " it wraps past 2**31 - 1: compute offsets in int64, e.g."
            " `tl.program_id(0).to(tl.int64) * BLOCK`."
            if (elements < 0).any() else "")
    return _errors.OutOfBoundsAccessError(
        f"{self._where(op)} {self.describe(k)} reaches {elements.size}"
        f" element(s) outside the buffer: element offsets"
        f" {_first(elements)} (in {itemsize}-byte elements). The buffer"
        f" {self._extent(k)}, so offsets must lie in [0, {size}). Mask in"
        f" force: {_mask_text(on)}. Mask the access (e.g. `mask=offsets < n`)"
        f" or shrink the grid.{hint} Set {_settings.BOUNDS_CHECK}=0 to run"
        " unchecked."
        f"{_stack_location()}"
    )

  def _unwritten(self, op, k, starts, on, itemsize):
    return _errors.UnwrittenOutputReadError(
        f"{self._where(op)} {self.describe(k)} reads {starts.size}"
        f" element(s) that the kernel has not written: element offsets"
        f" {_first(starts // itemsize)} (in {itemsize}-byte elements). The"
        f" buffer {self._extent(k)}. Mask in force: {_mask_text(on)}. An"
        " output starts undefined on a GPU: write it before reading it, or"
        " pass zeroed_outputs= (starts at zero) or input_output_aliases="
        f" (starts as the input). Set {_settings.BOUNDS_CHECK}=0 to run"
        " unchecked."
        f"{_stack_location()}"
    )


_TRITON_DIR = os.path.dirname(os.path.abspath(triton.__file__)) + os.sep
_CPU_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Where kernels are called from: Triton's grid loop, or vector_launch's.
_GRID_LOOPS = (_TRITON_DIR, _CPU_DIR + "vector_launch.py")
_INTERPRETER_DIRS = (
    _TRITON_DIR, os.path.dirname(os.path.abspath(np.__file__)) + os.sep,
    _CPU_DIR)


def kernel_location(frames) -> str:
  """The kernel's ``"FILE:LINE (`SOURCE`)"`` or "": the deepest of
  ``frames`` (``(frame, lineno)``, outermost first) below a grid loop and
  outside Triton, NumPy and jt_dist._cpu."""
  found, inside = None, False
  for frame, lineno in frames:
    filename = frame.f_code.co_filename
    path = os.path.abspath(filename)
    if path.startswith(_GRID_LOOPS):
      inside = True
    elif inside and not path.startswith(_INTERPRETER_DIRS):
      found = (filename, lineno)
  return "" if found is None else source_line(*found)


def source_line(filename: str, lineno: int) -> str:
  """``"FILE:LINE (`SOURCE`)"``, the source where found."""
  source = linecache.getline(filename, lineno).strip()
  return f"{filename}:{lineno}" + (f" (`{source}`)" if source else "")


def running_kernel_location() -> str:
  """``kernel_location`` of the current stack."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  return kernel_location(reversed(list(traceback.walk_stack(frame))))


def _stack_location() -> str:
  where = running_kernel_location()
  return f" The access is at {where}." if where else ""


def _first(values: np.ndarray) -> str:
  shown = ", ".join(str(int(v)) for v in values[:_SHOWN_OFFSETS])
  more = f", ... ({values.size} in all)" if values.size > _SHOWN_OFFSETS else ""
  return f"[{shown}{more}]"


def _mask_text(on: np.ndarray) -> str:
  total, enabled_lanes = on.size, int(on.sum())
  if enabled_lanes == total:
    return f"all {total} lanes on (no mask, or a mask that is all true)"
  return f"{enabled_lanes} of {total} lanes on"


class CheckedMemory:
  """The native memory module, checked, for one launch."""

  def __init__(self, native, checker: MemoryChecker):
    self._native = native
    self._checker = checker
    # HostMemory takes an access inside one buffer by offsets.
    self._direct = isinstance(native, _host_memory.HostMemory)

  def __getattr__(self, name):
    # Enums (MEM_SEMANTIC, RMW_OP) and anything else pass through.
    return getattr(self._native, name)

  def _checked(self, op, ptrs, mask, itemsize):
    """``((k, offsets), None)`` for HostMemory's loads and stores, else
    ``(None, real addresses)``."""
    reads, writes = op != "store", op != "load"
    found = self._checker.locate(op, ptrs, mask, itemsize, reads=reads,
                                 writes=writes)
    if found is None:
      return None, self._checker.translate_lanes(op, ptrs, mask, itemsize,
                                                 reads, writes)
    if self._direct and op in ("load", "store"):
      return found, None
    return None, self._checker.real(*found)

  def load(self, ptrs, mask, other, dtype):
    found, real = self._checked("load", ptrs, mask, np.dtype(dtype).itemsize)
    if found is not None:
      return self._native.load_at(*found, mask, other, dtype)
    return self._native.load(real, mask, other, dtype)

  def store(self, ptrs, values, mask):
    found, real = self._checked("store", ptrs, mask,
                                np.asarray(values).dtype.itemsize)
    if found is not None:
      return self._native.store_at(*found, values, mask)
    return self._native.store(real, values, mask)

  def atomic_rmw(self, op, ptrs, values, mask, sem):
    _, real = self._checked("atomic", ptrs, mask,
                            np.asarray(values).dtype.itemsize)
    return self._native.atomic_rmw(op, real, values, mask, sem)

  def atomic_cas(self, ptrs, cmp, values, sem):
    _, real = self._checked("atomic_cas", ptrs, True,
                            np.asarray(values).dtype.itemsize)
    return self._native.atomic_cas(real, cmp, values, sem)
