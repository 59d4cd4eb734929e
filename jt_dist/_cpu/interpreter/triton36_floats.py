"""Where Triton 3.6 treats floats otherwise than 3.9 (remove with 3.6).

Remove when Triton 3.6 support ends: each function here then reduces to
Triton 3.9's behaviour (the backport to nothing, the mapping to identity).

jt_dist evens out two differences of the interpreter:

* ``tl.minimum``, ``tl.maximum`` and ``tl.clamp`` with ``propagate_nan``
  NONE lower to ``minnumf``/``maxnumf``, which return the other operand
  where one is NaN, on GPUs and in Triton 3.9's interpreter (``np.fmin``,
  ``np.fmax``). Triton 3.6's interpreter computes ``np.minimum``,
  ``np.maximum`` and ``np.clip``, which return NaN.
  ``builder_backported`` puts 3.9's forms in place for a launch.
* ``tl.argmin``, ``tl.argmax`` (and ``tl.min``/``tl.max`` with indices)
  reach the interpreter's reductions as ``np.min``/``np.argmin`` in 3.6 and
  as the NaN-ignoring ``np.nanmin``/``np.nanargmin`` in 3.9:
  ``nan_ignoring`` maps the first to the second.

Two differences of Triton's language stay, as compiled kernels have them:
Triton 3.6's ``tl.minimum``, ``tl.maximum`` and ``tl.clamp`` widen bfloat16
operands to float32, and its ``tl.math.fdiv`` divides bfloat16 operands in
bfloat16 (3.9 in float32).
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
  """``np.nanmin`` for ``np.min`` and so on, as Triton 3.9 picks.

  ``reduce_op``: what upstream's ``ReduceOps.apply_impl`` hands ``min_max``
  (``np.min``, ``np.argmin``, ... in Triton 3.6), or None; others unchanged.
  """
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
  """The builder methods that return NaN for a NaN operand, with fixes.

  Read from upstream's own methods on a NaN, once; they are fine wherever
  a Triton release computes as 3.9 does.
  """
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
  """Triton 3.9's NaN-ignoring minimum, maximum and clamp, for one launch.

  Enter before any other patch of the interpreter's builder, so that those
  wrap these (the caller holds the interpreter lock).
  """
  with LANGUAGE_LOCK, attributes_replaced(_interpreter.InterpreterBuilder,
                                          _backports()):
    yield
