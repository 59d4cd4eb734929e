"""Float ``tl.atomic_max``/``tl.atomic_min`` in program order, vectorised.

Triton lowers a float atomic max to two integer atomics on the value's bits:
a signed max for the lanes whose sign bit is clear, then an unsigned min
for the others (a min the other way round), and returns each lane's old
value from the one that ran it. One program at a time, program 0 runs both
before program 1 runs either. A vectorised launch would run the first for
every program, then the second, so a lane's old value would miss the
updates of earlier programs' other half. Here the pair runs program after
program, through the interpreter's own atomics, where both halves have
lanes; where only one has, one pass over all programs keeps that order
already.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist._cpu import vector_builder as _vb

TensorHandle = _interpreter.TensorHandle
_OP = _interpreter.ATOMIC_OP
# (op on the lanes with the sign bit clear, op on the others), as Triton's
# semantic lowers a float atomic max and min.
_HALVES = {"max": (_OP.MAX, _OP.UMIN), "min": (_OP.MIN, _OP.UMAX)}
# Float type -> its bits as (NumPy, Triton) types, signed then unsigned.
_FLOATS = {"fp32": ((np.int32, tl.int32), (np.uint32, tl.uint32)),
           "fp64": ((np.int64, tl.int64), (np.uint64, tl.uint64))}


def _programs_in_order(builder, which, ptr, val, mask, sem, scope):
  """Old values of a float atomic ``which`` over all programs, in order."""
  (signed, signed_ty), (unsigned, unsigned_ty) = _FLOATS[val.dtype.scalar.name]
  ptrs, vals, on = _vb._with_programs(  # pylint: disable=protected-access
      [ptr.data, val.data, builder.active(mask.data)], builder.programs)
  on = on.astype(bool)
  negative = (vals.view(unsigned) >> (8 * vals.itemsize - 1)).astype(bool)
  halves = ((_HALVES[which][0], signed, signed_ty, on & ~negative),
            (_HALVES[which][1], unsigned, unsigned_ty, on & negative))
  run = _interpreter.InterpreterBuilder.create_atomic_rmw
  olds = [np.zeros(vals.shape, signed), np.zeros(vals.shape, unsigned)]
  both = all(half[-1].any() for half in halves)
  rows = ([slice(p, p + 1) for p in range(builder.programs)] if both
          else [slice(None)])
  for row in rows:
    for old, (op, bits, bits_ty, lanes) in zip(olds, halves):
      if lanes[row].any():
        old[row] = run(
            builder, op, TensorHandle(ptrs[row], ptr.dtype),
            TensorHandle(vals[row].view(bits), bits_ty),
            TensorHandle(lanes[row], tl.int1), sem, scope).data
  old = np.where(negative, olds[1].view(signed), olds[0])
  return TensorHandle(old.view(vals.dtype), val.dtype.scalar)


def _ordered(which: str, original):
  def atomic(self, ptr, val, mask, sem, scope):
    builder = self.builder
    element = getattr(getattr(ptr, "type", None), "scalar", None)
    element = getattr(element, "element_ty", None)
    if (not isinstance(builder, _vb.VectorBuilder)
        or getattr(element, "name", None) not in _FLOATS):
      return original(self, ptr, val, mask, sem, scope)
    ptr, val, mask = self.atom_red_typechecking_impl(ptr, val, mask, which)
    handle = _programs_in_order(builder, which, ptr.handle, val.handle,
                                mask.handle, self._str_to_sem(sem),  # pylint: disable=protected-access
                                self._str_to_scope(scope))  # pylint: disable=protected-access
    return tl.tensor(handle, val.type)
  return atomic


def patch(scope) -> None:
  """Installs the ordered float atomics in the launch's ``scope``."""
  semantic = _interpreter.TritonSemantic
  for which in _HALVES:
    name = f"atomic_{which}"
    scope.set_attr(semantic, name, _ordered(which, getattr(semantic, name)))
