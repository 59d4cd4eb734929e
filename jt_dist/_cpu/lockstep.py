"""Masked lockstep: program-dependent control flow over all programs at once.

What ``lockstep_rewrite``'s code calls. The builder's ``Masks`` stack holds
the active programs, an entry per narrowing region and per function frame
(so a ``return`` taken by some retires them). Where the programs agree, or
one runs at a time, calls act as plain Python, but for loop indices:
scalars of their bounds' type, as compiled. Masked programs compute on but
write, assert and take atomics nowhere (``vector_builder``).
"""

from __future__ import annotations

import builtins
import sys

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter
from jt_dist._cpu import interrupts as _interrupts

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
  # One program at a time, upstream's builder has no ``programs``.
  return getattr(_interpreter.builder(), "programs", 1)


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
  # A Python int meets a value as the constant Triton would make of it.
  if _python_int(new):
    new = _int_constant(new, mask.shape, name)
  if _python_int(old):
    old = _int_constant(old, mask.shape, name)
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

  def loop(self, static, fn, *args, **kwargs):
    """The loop's values (``static``: a ``tl.static_range``, whose values
    are Python ints); per program trip counts run masked. As Triton's code
    generator types it, a loop index is a scalar of its bounds' promoted
    type, on every program and one program at a time alike."""
    found = None if static else _range_bounds(fn, args, kwargs)
    if found is None:
      return _trips(fn(*args, **kwargs))
    bounds, dtype = found
    if self.masks is not None:
      lanes = [np.broadcast_to(b, (_programs(),)) for b in bounds]
      if not all(_uniform(b, self.masks.current) for b in lanes):
        return self._masked(*lanes, dtype)
    return _trips(_scalar(np.array([i]), dtype) for i in fn(*args, **kwargs))

  def _masked(self, lo, hi, step, dtype):
    if (step == 0).any():
      raise ValueError("range() arg 3 must not be zero")
    trips = np.maximum(-((lo - hi) // step), 0)  # As len(range(lo, hi, step)).
    if (active := self.masks.current) is not None:
      trips = np.where(active, trips, 0)
    shared = _uniform(lo, active) and _uniform(step, active)
    for k in range(int(trips.max(initial=0))):
      _interrupts.check()
      entry = self._push(k < trips)
      self.mask = self.masks.current
      self.narrow = bool((~self.mask if entry is None
                          else entry & ~self.mask).any())
      if shared:
        index = np.array([_first(lo, active) + k * _first(step, active)])
      else:
        index = np.where(self.mask, lo + k * step, 0)
      yield _scalar(index, dtype)

  def save(self, local_names) -> None:
    if self.narrow:
      self.saved = {n: local_names.get(n, _MISSING) for n in self.names}

  def narrowed(self) -> bool:
    return self.narrow

  def pick(self, name, local_names):
    return merge(self.mask, local_names.get(name, _MISSING),
                 self.saved[name], name)


def _trips(indices):
  """A loop's indices, each trip a point where an interrupt stops it."""
  for index in indices:
    _interrupts.check()
    yield index


def _python_int(value) -> bool:
  return type(value) is int  # pylint: disable=unidiomatic-typecheck


def _range_bounds(fn, args, kwargs):
  """((lo, hi, step) as int64 arrays, the index's type) of a range, or None."""
  if fn is builtins.range and not kwargs:
    bound = list(args)
  elif fn is tl.range and "step" not in kwargs:
    bound = list(args[:3])
  elif fn is tl.range and len(args) >= 2:
    bound = [*args[:2], kwargs["step"]]
  else:
    return None
  bound = [b.value if isinstance(b, tl.constexpr) else b for b in bound]
  bound = {1: [0] + bound + [1], 2: bound + [1], 3: bound}.get(len(bound))
  if bound is None:
    return None
  out, types = [], []
  for b in bound:
    if isinstance(b, bool) or b is None:
      return None
    if isinstance(b, int):
      out.append(np.array([b], dtype=np.int64))
      types.append(_int_type(b))
      continue
    data = _lanes(b)
    if data is None or not b.dtype.is_int() or data.dtype == np.uint64:
      return None
    out.append(data.astype(np.int64))
    types.append(b.dtype)
  promote = _interpreter.TritonSemantic.integer_promote_impl
  dtype = promote(None, promote(None, types[0], types[1]), types[2])
  return out, dtype


def _int_type(value: int):
  """The type Triton gives a Python int constant (``to_tensor``)."""
  for dtype in (tl.int32, tl.uint32, tl.int64):
    info = np.iinfo(_interpreter.np_dtype(dtype))
    if info.min <= value <= info.max:
      return dtype
  return tl.uint64


def _scalar(values, dtype):
  """A scalar of ``dtype`` holding ``values`` (one per program, or one)."""
  data = values.astype(_interpreter.np_dtype(dtype))
  return tl.tensor(TensorHandle(data, dtype), dtype)


def _int_constant(value: int, shape, name: str):
  if not -2**31 <= value < 2**31:
    # Triton's int64 constant meets the other path's int32 as a type error.
    raise Unsupported(f"{name!r} holds an int outside int32 on one path")
  return _scalar(np.full(shape, value), tl.int32)


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


def _run_time(value) -> bool:
  """A run-time value, as Triton's code generator tells one from a
  compile-time one (a constexpr, a Python value or a tuple)."""
  return isinstance(value, tl.core.base_value) and not isinstance(
      value, (tl.constexpr, tl.core.tuple))


def boolean(method: str, *operands):
  """``a and b`` (``method`` "logical_and") or ``a or b``, each operand a
  thunk, as Triton's code generator lowers them: a compile-time operand
  that decides the result ends it, and the run-time ones combine
  elementwise, right to left. Python's truthiness would compare nothing."""
  deciding = method == "logical_or"
  combined, value = [], None
  for operand in operands:
    value = operand()
    if _run_time(value):
      combined.append(value)
    elif bool(value) is deciding:
      return value
  while len(combined) >= 2:
    rhs = combined.pop()
    combined.append(getattr(combined.pop(), method)(rhs))
  return combined[0] if combined else value


def negation(value):
  """``not value``: elementwise on a run-time value, as compiled."""
  return value.__not__() if _run_time(value) else not value


def language(builtin):
  """``builtin`` as its module holds it now: a launch's patched form."""
  module = sys.modules.get(builtin.__module__)
  return getattr(module, builtin.__name__, builtin) if module else builtin
