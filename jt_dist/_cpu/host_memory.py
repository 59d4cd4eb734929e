"""Loads and stores on the launch's own buffers as NumPy gathers/scatters.

Triton's interpreter reaches memory through its native module, which
visits one address at a time: about 30 ms per million elements, where a
NumPy gather takes about 1 ms. Once the bounds checker has translated an
access to real addresses inside one of the launch's buffers, the access is
a gather from (or a scatter into) that buffer viewed as the element type.
Anything else (several buffers, misaligned addresses, stores that hit one
element twice, where the native module's lane order decides) goes to the
native module as before.
"""

from __future__ import annotations

import numpy as np


class HostMemory:
  """The interpreter's native memory module, faster on known buffers."""

  def __init__(self, native, arrays):
    self._native = native
    self._arrays = arrays
    self._starts = [a.ctypes.data for a in arrays]

  def __getattr__(self, name):
    # Atomics, enums (MEM_SEMANTIC, RMW_OP) and anything else pass through.
    return getattr(self._native, name)

  def _elements(self, ptrs, dtype):
    """(flat view of the buffer as ``dtype``, element indices), or None."""
    itemsize = dtype.itemsize
    if ptrs.size == 0 or itemsize not in (1, 2, 4, 8):
      return None
    lo, hi = int(ptrs.min()), int(ptrs.max())
    for array, start in zip(self._arrays, self._starts):
      end = start + array.nbytes
      if start <= lo and hi + itemsize <= end:
        break
    else:
      return None
    if array.nbytes % itemsize or start % itemsize:
      return None
    # The buffer's start is aligned, so every address is where the OR of
    # them all is: one pass, with no temporary array.
    if itemsize > 1 and int(np.bitwise_or.reduce(ptrs, axis=None)) & (
        itemsize - 1):
      return None
    offsets = ptrs - np.uint64(start)
    offsets >>= np.uint64(itemsize.bit_length() - 1)
    flat = array.reshape(-1).view(np.uint8).view(dtype)
    return flat, offsets.view(np.int64)

  def load(self, ptrs, mask, other, dtype):
    ptrs = np.asarray(ptrs)
    found = self._elements(ptrs, np.dtype(dtype))
    if found is None:
      return self._native.load(ptrs, mask, other, dtype)
    flat, elements = found
    # A C-ordered result, as the native module returns: NumPy's reductions
    # group their sums by memory order.
    result = np.ascontiguousarray(flat[elements])
    mask = np.asarray(mask, dtype=bool)
    if not mask.all():
      np.copyto(result, other, where=~mask)
    return result

  def store(self, ptrs, values, mask):
    ptrs, values = np.asarray(ptrs), np.asarray(values)
    found = self._elements(ptrs, values.dtype)
    if found is None or not found[0].flags.writeable:
      return self._native.store(ptrs, values, mask)
    flat, elements = found
    mask = np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
    elements = elements[mask]
    if elements.size > 1 and not (np.diff(elements) > 0).all():
      # One element written twice: the last lane must win, as natively.
      return self._native.store(ptrs, values, mask)
    flat[elements] = np.broadcast_to(values, ptrs.shape)[mask]
    return None
