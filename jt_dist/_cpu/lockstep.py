"""Masked lockstep: program-dependent control flow over all programs at once.

What ``lockstep_rewrite``'s code calls. The builder's ``Masks`` stack holds
the active programs, an entry per narrowing region and per function frame
(so a ``return`` taken by some retires them). Where the programs agree, or
one runs at a time, calls act as plain Python. Masked programs compute on
but write, assert and take atomics nowhere (``vector_builder``).
"""

from __future__ import annotations

import builtins

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist._cpu import vector_reviewed as _reviewed

TensorHandle = _interpreter.TensorHandle
Unsupported = _reviewed.Unsupported
_MISSING = object()


class Masks:
  """Which programs of a chunk are active: a stack of masks (None: all)."""

  def __init__(self):
    self.stack: list = []
    self.frames: list[int] = []  # Stack index of each function's entry.

  @property
  def current(self):
    return self.stack[-1] if self.stack else None


def _masks():
  return getattr(_interpreter.builder(), "masks", None)


def _programs() -> int:
  return _interpreter.builder().programs


def _lanes(value):
  """A scalar's values, (programs,) or (1,); None for a block."""
  if isinstance(value, tl.constexpr):
    value = value.value
  if not isinstance(value, tl.tensor):
    return None
  data = np.asarray(value.handle.data)
  if data.ndim != 1 or data.shape[0] not in (1, _programs()):
    return None
  return data


def _uniform(values, active) -> bool:
  chosen = values if active is None else values[active]
  return chosen.size == 0 or bool((chosen == chosen[0]).all())


def _first(values, active):
  chosen = values if active is None else values[active]
  return (chosen if chosen.size else values)[0]


def merge(mask, new, old, name: str):
  """Per program, ``new`` where ``mask`` holds and ``old`` elsewhere."""
  if new is old or (type(new) is type(old)  # pylint: disable=unidiomatic-typecheck
                    and isinstance(new, (int, float, bool, str))
                    and new == old):
    return new
  if new is _MISSING or old is _MISSING:
    raise Unsupported(f"{name!r} is not assigned on every program's path")
  every = np.ones(mask.shape, bool)
  if _python_int(new) and _python_int(old):
    # A loop index after its loop: as if the programs' indices differed.
    return _loop_index(np.where(mask, new, old), every)
  if _python_int(new) and isinstance(old, tl.tensor) and old.type == tl.int32:
    new = _loop_index(np.full(mask.shape, new), every)
  if _python_int(old) and isinstance(new, tl.tensor) and new.type == tl.int32:
    old = _loop_index(np.full(mask.shape, old), every)
  if isinstance(new, tl.tensor) and isinstance(old, tl.tensor):
    new_data = np.asarray(new.handle.data)
    old_data = np.asarray(old.handle.data)
    if new.type != old.type or new_data.dtype != old_data.dtype:
      raise Unsupported(f"{name!r} changes type ({old.type} to {new.type})")
    where = mask.reshape((-1,) + (1,) * (new_data.ndim - 1))
    data = np.where(where, new_data, old_data)
    return tl.tensor(TensorHandle(data, new.handle.dtype), new.type)
  if type(new) is tuple and type(old) is tuple and len(new) == len(old):  # pylint: disable=unidiomatic-typecheck
    return tuple(merge(mask, n, o, name) for n, o in zip(new, old))
  raise Unsupported(f"{name!r} holds values lockstep cannot merge")


class _Region:
  """A loop or ``if`` that may narrow the active programs."""

  def __init__(self, names):
    self.masks = _masks()
    self.names = names
    self.depth = None if self.masks is None else len(self.masks.stack)
    self.saved: dict = {}

  def _push(self, mask):
    """Narrows the active programs by ``mask``; returns those on entry."""
    del self.masks.stack[self.depth:]
    entry = self.masks.current
    self.masks.stack.append(mask if entry is None else entry & mask)
    return entry

  def done(self) -> None:
    if self.masks is not None:
      del self.masks.stack[self.depth:]


class Loop(_Region):
  """A ``for`` over ``range``/``tl.range`` whose trip count may differ."""

  mask = None  # The programs of the current trip.
  narrow = False  # Whether the current trip leaves some programs out.

  def loop(self, fn, *args, **kwargs):
    """The loop's values; per program trip counts run masked."""
    bounds = None if self.masks is None else _range_bounds(fn, args, kwargs)
    if bounds is not None:
      lanes = [np.broadcast_to(b, (_programs(),)) for b in bounds]
      if not all(_uniform(b, self.masks.current) for b in lanes):
        return self._masked(*lanes)
    return fn(*args, **kwargs)

  def _masked(self, lo, hi, step):
    if (step == 0).any():
      raise ValueError("range() arg 3 must not be zero")
    trips = np.maximum(-((lo - hi) // step), 0)  # As len(range(lo, hi, step)).
    if (active := self.masks.current) is not None:
      trips = np.where(active, trips, 0)
    shared = _uniform(lo, active) and _uniform(step, active)
    for k in range(int(trips.max(initial=0))):
      entry = self._push(k < trips)
      self.mask = self.masks.current
      self.narrow = bool((~self.mask if entry is None
                          else entry & ~self.mask).any())
      if shared:
        yield int(_first(lo, active) + k * _first(step, active))
      else:
        yield _loop_index(lo + k * step, self.mask)

  def save(self, local_names) -> None:
    if self.narrow:
      self.saved = {n: local_names.get(n, _MISSING) for n in self.names}

  def narrowed(self) -> bool:
    return self.narrow

  def pick(self, name, local_names):
    return merge(self.mask, local_names.get(name, _MISSING),
                 self.saved[name], name)


def _python_int(value) -> bool:
  return type(value) is int  # pylint: disable=unidiomatic-typecheck


def _range_bounds(fn, args, kwargs):
  """(lo, hi, step) of a range as int64 arrays, or None."""
  triton_range = fn is tl.range or fn is tl.static_range
  if fn is builtins.range and not kwargs:
    bound = list(args)
  elif triton_range and "step" not in kwargs:
    bound = list(args[:3])
  elif triton_range and len(args) >= 2:
    bound = [*args[:2], kwargs["step"]]
  else:
    return None
  bound = [b.value if isinstance(b, tl.constexpr) else b for b in bound]
  bound = {1: [0] + bound + [1], 2: bound + [1], 3: bound}.get(len(bound))
  if bound is None:
    return None
  out = []
  for b in bound:
    if isinstance(b, bool) or b is None:
      return None
    if isinstance(b, int):
      out.append(np.array([b], dtype=np.int64))
      continue
    data = _lanes(b)
    if data is None or not b.dtype.is_int() or data.dtype == np.uint64:
      return None
    out.append(data.astype(np.int64))
  return out


def _loop_index(values, active):
  """Per-program loop indices as the int32 scalar a Python int would give."""
  chosen = values[active]
  if chosen.size and (chosen.min() < 0 or chosen.max() >= 2**31):
    raise Unsupported("a per-program loop index outside [0, 2**31)")
  data = np.where(active, values, 0).astype(np.int32)
  return tl.tensor(TensorHandle(data, tl.int32), tl.int32)


class Branch(_Region):
  """An ``if`` whose condition may differ between programs."""

  def __init__(self, test, names, else_names):
    super().__init__(names)
    self.else_names = else_names
    self.cond = None  # Per program where the programs disagree.
    self.value = None
    self.then_values: dict = {}
    values = None if self.masks is None else _lanes(test)
    if values is None or values.size == 1:
      self.value = bool(test)
      return
    values = values.astype(bool)
    if _uniform(values, self.masks.current):
      self.value = bool(_first(values, self.masks.current))
    else:
      self.cond = values

  def then(self, local_names) -> bool:
    if self.cond is None:
      return self.value
    self.saved = {n: local_names.get(n, _MISSING) for n in self.names}
    self._push(self.cond)
    return True

  def otherwise(self, local_names, has_else: bool) -> bool:
    if self.cond is None:
      return not self.value
    self.then_values = {n: local_names.get(n, _MISSING) for n in self.names}
    self.done()
    if has_else:
      self._push(~self.cond)
    return has_else

  def diverged(self) -> bool:
    return self.cond is not None

  def old(self, name, local_names):
    """A name's value before the ``if`` branch, for ``else``."""
    del local_names
    value = self.saved[name]
    if value is _MISSING:
      raise Unsupported(f"{name!r} is read in an else branch before it is"
                        " assigned")
    return value

  def merging(self) -> bool:
    if self.cond is None:
      return False
    self.done()
    return True

  def pick(self, name, local_names):
    else_value = (local_names.get(name, _MISSING) if name in self.else_names
                  else self.saved[name])
    return merge(self.cond, self.then_values[name], else_value, name)


# What rewritten kernels call, as ``_jt_ls.enter()`` and so on.


def enter():
  """A function frame, whose returns retire programs from it."""
  if (masks := _masks()) is None:
    return None
  masks.stack.append(masks.current)
  masks.frames.append(len(masks.stack) - 1)
  return masks.frames[-1]


def leave(frame) -> None:
  masks = _masks()
  if frame is not None and masks is not None:
    del masks.stack[frame:]
    del masks.frames[masks.frames.index(frame):]


def returns(has_value: bool) -> bool:
  """Whether to return; else the active programs retire from the frame."""
  masks = _masks()
  if (masks is None or not masks.frames
      or len(masks.stack) == masks.frames[-1] + 1):
    return True
  frame = masks.frames[-1]
  if has_value:
    raise Unsupported("a return with a value taken by some programs only")
  current = masks.current
  retired = ~(np.ones(_programs(), bool) if current is None else current)
  masks.stack[frame:] = [retired if m is None else m & retired
                         for m in masks.stack[frame:]]
  return False
