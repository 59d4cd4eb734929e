"""Undoing a chunk of a vectorised launch that gives way.

Each write keeps the bytes (and written-byte map) it replaces: a slice
where dense, else the elements alone; never a whole buffer.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from jt_dist._cpu import interpreter as _interpreter

# A write spanning at most this many times its bytes (plus a page) is
# saved as one slice: a copy instead of a gather.
_DENSE = 2
_PAGE = 4096


def _dense(first: int, last: int, lanes: int, itemsize: int) -> bool:
  return last - first <= _DENSE * lanes * itemsize + _PAGE


class Window(NamedTuple):
  """A buffer as the kernel addresses it: ``base`` is its first byte,
  ``written`` its byte map or None; ``name`` names it in errors."""

  array: np.ndarray
  base: int
  name: str
  written: np.ndarray | None = None


def windows_of(args, arg_names, checker) -> list[Window] | None:
  """The launch's buffers as windows, or None where a pointer has no array."""
  if checker is not None:
    return [Window(b.array, checker.tagged_address(k), checker.describe(k),
                   b.written) for k, b in enumerate(checker.buffers)]
  pointers = [(getattr(p, "buffer", None), name)
              for p, name in zip(map(_pointer_of, args), arg_names)
              if p is not None]
  if any(not isinstance(b, np.ndarray) for b, _ in pointers):
    return None
  return [Window(b, b.ctypes.data, repr(name)) for b, name in pointers]


def _pointer_of(arg):
  if hasattr(arg, "data_ptr"):
    return arg
  base = getattr(arg, "base", None)
  return base if hasattr(base, "data_ptr") else None


def writable_bytes(array: np.ndarray) -> np.ndarray:
  """``array``'s bytes, writable (by address: inputs may be read-only)."""
  if not array.nbytes:
    return np.zeros(0, np.uint8)
  raw = (ctypes.c_uint8 * array.nbytes).from_address(array.ctypes.data)
  return np.ctypeslib.as_array(raw)


class WriteJournal:
  """The memory module, keeping what each write replaces for ``restore``."""

  def __init__(self, windows: list[Window]):
    self._inner = _interpreter.native_memory()
    self._windows = windows
    self._bytes = [writable_bytes(w.array) for w in windows]
    # (buffer, byte slice or byte indices, old bytes, old written bytes).
    self._saved: list[tuple] = []

  def __getattr__(self, name):
    return getattr(self._inner, name)

  def store(self, ptrs, values, mask):
    self._save(ptrs, mask, values)
    return self._inner.store(ptrs, values, mask)

  def atomic_rmw(self, op, ptrs, values, mask, sem):
    self._save(ptrs, mask, values)
    return self._inner.atomic_rmw(op, ptrs, values, mask, sem)

  def atomic_cas(self, ptrs, cmp, values, sem):
    self._save(ptrs, None, values)
    return self._inner.atomic_cas(ptrs, cmp, values, sem)

  def _save(self, ptrs, mask, values) -> None:
    itemsize = np.asarray(values).dtype.itemsize
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
      on = np.broadcast_to(np.asarray(mask, dtype=bool), ptrs.shape)
      if not on.all():
        ptrs = ptrs[on]
    ptrs = ptrs.reshape(-1)
    if not ptrs.size:
      return
    lo, hi = int(ptrs.min()), int(ptrs.max())
    for k, w in enumerate(self._windows):
      first, last = lo - w.base, hi - w.base + itemsize
      if (0 <= first and last <= w.array.nbytes
          and _dense(first, last, ptrs.size, itemsize)):
        # The usual write: one block of one buffer.
        self._keep(k, slice(first, last))
      elif hi >= w.base and lo < w.base + w.array.nbytes:
        self._save_lanes(k, ptrs, itemsize)

  def _keep(self, k: int, where) -> None:
    w = self._windows[k]
    old_written = None if w.written is None else w.written[where].copy()
    self._saved.append((k, where, self._bytes[k][where].copy(), old_written))

  def _save_lanes(self, k: int, ptrs, itemsize: int) -> None:
    w = self._windows[k]
    offsets = ptrs.view(np.int64) - np.int64(w.base)
    # Lanes outside the buffer write nothing of it (checked or not).
    inside = (offsets >= 0) & (offsets <= w.array.nbytes - itemsize)
    if not inside.all():
      offsets = offsets[inside]
    if not offsets.size:
      return
    first, last = int(offsets.min()), int(offsets.max()) + itemsize
    if _dense(first, last, offsets.size, itemsize):
      self._keep(k, slice(first, last))
    else:
      self._keep(k, (offsets[:, None] + np.arange(itemsize)).reshape(-1))

  def restore(self) -> None:
    # Latest first: where two writes overlap, the earlier's bytes win.
    for k, where, old, old_written in reversed(self._saved):
      self._bytes[k][where] = old
      if old_written is not None:
        self._windows[k].written[where] = old_written
    self._saved.clear()

  def clear(self) -> None:
    self._saved.clear()
