"""Where Triton 3.6's interpreter treats floats otherwise than 3.9's.

Remove when Triton 3.6 support ends. 3.6's minimum, maximum and clamp
return NaN for a NaN operand (GPUs and 3.9 the other one), and its
argmin/argmax do not ignore NaN. Language differences stay, as compiled.
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
  """``np.nanmin`` for ``np.min`` and so on, as Triton 3.9's ``min_max``."""
  return _NAN_IGNORING.get(reduce_op, reduce_op)


def _clampf(self, arg, lo, hi, propagate_nans):
  # As Triton 3.9: a maximum then a minimum, each ignoring a NaN operand.
  if propagate_nans == tl.PropagateNan.NONE:
    return self.binary_op(self.binary_op(arg, lo, np.fmax), hi, np.fmin)
  return self.ternary_op(arg, lo, hi, np.clip)


@functools.cache
def _backports() -> dict:
  """Fixes of the builder methods that return NaN for a NaN operand."""
  nan, one = (TensorHandle(np.array([v], np.float32), tl.float32)
              for v in (np.nan, 1.0))
  fixes = {  # name: (fix, a probe's arguments)
      "create_minnumf": (lambda self, a, b: self.binary_op(a, b, np.fmin),
                         (nan, one)),
      "create_maxnumf": (lambda self, a, b: self.binary_op(a, b, np.fmax),
                         (nan, one)),
      "create_clampf": (_clampf, (nan, one, one, tl.PropagateNan.NONE)),
  }
  builder = _interpreter.InterpreterBuilder()
  with np.errstate(all="ignore"):
    return {name: fix for name, (fix, probe) in fixes.items()
            if np.isnan(getattr(builder, name)(*probe).data).any()}


@contextlib.contextmanager
def builder_backported():
  """3.9's NaN-ignoring minimum, maximum and clamp for one launch; enter
  before the builder patches that wrap them."""
  with LANGUAGE_LOCK, attributes_replaced(_interpreter.InterpreterBuilder,
                                          _backports()):
    yield
