"""Where Triton 3.6's interpreter treats floats otherwise than 3.9's.

Remove when Triton 3.6 support ends (the backport then is empty, the
mapping the identity). ``tl.minimum``, ``tl.maximum`` and ``tl.clamp`` with
``propagate_nan`` NONE return the other operand where one is NaN on GPUs
and in 3.9 (``np.fmin``, ``np.fmax``); 3.6 returns NaN. ``tl.argmin`` and
``tl.argmax`` reduce with ``np.argmin`` in 3.6, with the NaN-ignoring
``np.nanargmin`` in 3.9. Language differences stay, as compiled kernels
have them (3.6 widens bf16 in ``tl.minimum``, divides bf16 in bf16).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _interpreter

from jt_dist._compat import attributes_replaced
from jt_dist._compat.triton_api import LANGUAGE_LOCK

TensorHandle = _interpreter.TensorHandle

# Triton 3.6's interpreter reductions -> Triton 3.9's.
_NAN_IGNORING = {np.min: np.nanmin, np.max: np.nanmax,
                 np.argmin: np.nanargmin, np.argmax: np.nanargmax}


def nan_ignoring(reduce_op):
  """``np.nanmin`` for ``np.min`` and so on (others unchanged), as Triton
  3.9 picks for ``ReduceOps.apply_impl``'s ``min_max``."""
  return _NAN_IGNORING.get(reduce_op, reduce_op)


def _minnumf(self, lhs, rhs):
  return self.binary_op(lhs, rhs, np.fmin)


def _maxnumf(self, lhs, rhs):
  return self.binary_op(lhs, rhs, np.fmax)


def _clampf(self, arg, lo, hi, propagate_nans):
  # As Triton 3.9: a maximum then a minimum, each ignoring a NaN operand.
  if propagate_nans == tl.PropagateNan.NONE:
    return self.binary_op(self.binary_op(arg, lo, np.fmax), hi, np.fmin)
  return self.ternary_op(arg, lo, hi, np.clip)


def _scalar(value) -> TensorHandle:
  return TensorHandle(np.array([value], np.float32), tl.float32)


@functools.cache
def _backports() -> dict:
  """The builder methods that return NaN for a NaN operand, with fixes
  (none where upstream computes as Triton 3.9 does)."""
  builder = _interpreter.InterpreterBuilder()
  nan, one = _scalar(np.nan), _scalar(1.0)
  results = {
      "create_minnumf": (lambda: builder.create_minnumf(nan, one), _minnumf),
      "create_maxnumf": (lambda: builder.create_maxnumf(nan, one), _maxnumf),
      "create_clampf": (lambda: builder.create_clampf(
          nan, one, one, tl.PropagateNan.NONE), _clampf),
  }
  backports = {}
  with np.errstate(all="ignore"):
    for name, (run, fixed) in results.items():
      if np.isnan(run().data).any():
        backports[name] = fixed
  return backports


@contextlib.contextmanager
def builder_backported():
  """Triton 3.9's NaN-ignoring minimum, maximum and clamp, for one launch
  (entered before other patches of the builder, which wrap these)."""
  with LANGUAGE_LOCK, attributes_replaced(_interpreter.InterpreterBuilder,
                                          _backports()):
    yield
