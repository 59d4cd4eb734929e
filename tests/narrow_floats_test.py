"""bfloat16 and float8 operations on the CPU: on values, or refused by name.

Triton's interpreter keeps bfloat16 and float8 values as raw bits. Every
``tl`` operation that takes floats (``tests/float_op_kernels.py``) runs here
on bfloat16, float8_e4m3fn and float8_e5m2 blocks of fresh random values
(the seed is in every failure message), vectorised and one program at a
time (``JT_DIST_VECTORIZE=0``), against a float64 NumPy reference computed
on the same values. Each result must be

* exact: data moves, selects, comparisons, maxima, minima and indices;
* rounded once: ``+``, ``-``, ``*``, ``tl.fma`` on bf16 (within one unit in
  the last place);
* float32's: what Triton computes in float32 (``/``, ``%``, ``fdiv``,
  ``tl.softmax``, ``tl.dot``, ``tl.sum(..., dtype=tl.float32)``; Triton 3.6
  divides bf16 in bf16 with ``fdiv``, rounding once);
* accumulated: bf16 sums, scans and products round every partial result,
  as a GPU does, so they stay within ``depth`` roundings of the running
  value;

or refused with ``KernelTypeError`` naming the operation and the dtype,
where Triton does not compile it for a GPU: float8 arithmetic, comparisons,
reductions and scans, math functions on either dtype, and (Triton 3.6,
whose ``tl.maximum`` returns float32 for bf16) a bf16 ``tl.reduce`` whose
combine function returns float32. Both paths give the same bits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
from typing import Any, Callable
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import triton

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import float_op_kernels as K  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16
_PROGRAMS = 3
# (dtype, Triton's name for it).
_DTYPES = ((jnp.bfloat16, "bf16"), (jnp.float8_e4m3fn, "fp8e4nv"),
           (jnp.float8_e5m2, "fp8e5"))


@dataclasses.dataclass(frozen=True)
class Op:
  """An operation, its reference, and how close its result must come.

  Attributes:
    kernel: the ``@triton.jit`` function applying it.
    reference: NumPy on float64 values ``(x, y, z, cols)`` of shape
      (program, row, column); None where every dtype here is refused.
    error: "exact", "once", "float32", or (kind, depth, magnitude): a result
      of ``depth`` roundings of a running value, in the dtype ("sums",
      "products") or in float32 ("float32 sums"); ``magnitude(x, y)``
      bounds a sum's partial results (a product's is its own).
    float8: the refusal's spelling of the operation on float8, or None
      where float8 computes on values.
    refused: the refusal's spelling on every dtype here (math functions).
    divides: float8 divides in float32 (Triton 3.9) or is refused with the
      ``float8`` spelling (Triton 3.6, which divides the float8 values).
    narrowed: the result is rounded to the dtype (its reference too).
  """
  kernel: Any
  reference: Callable[..., np.ndarray] | None
  error: Any = "exact"
  float8: str | None = None
  refused: str | None = None
  divides: bool = False
  narrowed: bool = False


_ADD = r"`\+` \(add\)"
_MAX = r"`tl\.maximum` \((fmax|maximum)\)"
_MIN = r"`tl\.minimum` \((fmin|minimum)\)"
_CLAMP = r"`tl\.clamp` \(clip\)"
# Triton 3.6 negates by subtracting from zero.
_NEG = r"(`unary -` \(negative\)|`-` \(subtract\))"
_ROW = 2  # The block's axis 1, after the program axis.


def _row_magnitude(x, y):
  del y
  return np.abs(x).sum(_ROW, keepdims=True)


_SUMS = ("sums", 4, _row_magnitude)  # A tree of 16 values: 4 deep.
_STEPS = ("sums", _BLOCK - 1, _row_magnitude)  # One after another.


def _softmax(x):
  e = np.exp(x - x.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def _reverse_cumsum(x):
  return np.flip(np.cumsum(np.flip(x, _ROW), _ROW), _ROW)


def _with_index(values, indices, cols):
  return np.where(cols == 0, values, indices)


_MATH = ("exp", "exp2", "log", "log2", "sin", "cos", "sqrt", "sqrt_rn",
         "rsqrt", "erf", "floor", "ceil")
_OPS = {
    "add": Op(K.add, lambda x, y, z, c: x + y, "once", _ADD),
    "add_scalar": Op(K.add_scalar, lambda x, y, z, c: x + 1.5, "once", _ADD),
    "sub": Op(K.sub, lambda x, y, z, c: x - y, "once", r"`-` \(subtract\)"),
    "mul": Op(K.mul, lambda x, y, z, c: x * y, "once", r"`\*` \(multiply\)"),
    "div": Op(K.div, lambda x, y, z, c: x / y, "float32",
              r"`/` \(divide\)", divides=True),
    "mod": Op(K.mod, lambda x, y, z, c: np.fmod(x, y), "float32",
              r"`%` \(fmod\)", divides=True),
    "fdiv": Op(K.fdiv, lambda x, y, z, c: x / y, "float32",
               r"`/` \(divide\)", divides=True),
    "div_rn": Op(K.div_rn, None, refused=r"tl\.div_rn"),
    "neg": Op(K.neg, lambda x, y, z, c: -x, "exact", _NEG),
    "abs": Op(K.abs_, lambda x, y, z, c: np.abs(x)),
    "less": Op(K.less, lambda x, y, z, c: x < y, "exact", r"`<` \(less\)"),
    "equal": Op(K.equal, lambda x, y, z, c: x == np.where(c % 2 == 0, x, y),
                "exact", r"`==` \(equal\)"),
    "maximum": Op(K.maximum, lambda x, y, z, c: np.fmax(x, y), "exact", _MAX),
    "minimum": Op(K.minimum, lambda x, y, z, c: np.fmin(x, y), "exact", _MIN),
    "maximum_nan": Op(K.maximum_nan, lambda x, y, z, c: np.maximum(x, y),
                      "exact", _MAX),
    "minimum_nan": Op(K.minimum_nan, lambda x, y, z, c: np.minimum(x, y),
                      "exact", _MIN),
    "clamp": Op(K.clamp, lambda x, y, z, c: np.fmin(np.fmax(x, y), z),
                "exact", _CLAMP),
    "clamp_nan": Op(K.clamp_nan, lambda x, y, z, c: np.clip(x, y, z),
                    "exact", _CLAMP),
    "fma": Op(K.fma, lambda x, y, z, c: x * y + z, "once", r"tl\.fma"),
    "where": Op(K.where, lambda x, y, z, c: np.where(c % 3 == 0, x, y)),
    "round_trip": Op(K.round_trip, lambda x, y, z, c: x * 3.0,
                     narrowed=True),
    "sigmoid": Op(K.sigmoid, None, refused=rf"(tl\.exp|{_NEG})"),
    "softmax": Op(K.softmax, lambda x, y, z, c: _softmax(x), "float32"),
    "sum": Op(K.sum_, lambda x, y, z, c: x.sum(_ROW, keepdims=True), _SUMS,
              r"tl\.sum"),
    "sum_all": Op(K.sum_all, lambda x, y, z, c: x.sum((1, 2), keepdims=True),
                  ("sums", 8, lambda x, y: np.abs(x).sum((1, 2),
                                                         keepdims=True)),
                  r"tl\.sum"),
    "sum_float32": Op(K.sum_float32,
                      lambda x, y, z, c: x.sum(_ROW, keepdims=True),
                      ("float32 sums", _BLOCK - 1, _row_magnitude)),
    "max": Op(K.max_, lambda x, y, z, c: x.max(_ROW, keepdims=True)),
    "min": Op(K.min_, lambda x, y, z, c: x.min(_ROW, keepdims=True)),
    "max_with_index": Op(K.max_with_index, lambda x, y, z, c: _with_index(
        x.max(_ROW, keepdims=True), x.argmax(_ROW, keepdims=True), c),
                         "exact", r"tl\.argmax"),
    "min_with_index": Op(K.min_with_index, lambda x, y, z, c: _with_index(
        x.min(_ROW, keepdims=True), x.argmin(_ROW, keepdims=True), c),
                         "exact", r"tl\.argmin"),
    "argmax": Op(K.argmax, lambda x, y, z, c: x.argmax(_ROW, keepdims=True),
                 "exact", r"tl\.argmax"),
    "argmin": Op(K.argmin, lambda x, y, z, c: x.argmin(_ROW, keepdims=True),
                 "exact", r"tl\.argmin"),
    "reduce_add": Op(K.reduce_add,
                     lambda x, y, z, c: x.sum(_ROW, keepdims=True), _STEPS,
                     _ADD),
    "reduce_max": Op(K.reduce_max,
                     lambda x, y, z, c: x.max(_ROW, keepdims=True), "exact",
                     _MAX),
    "cumsum": Op(K.cumsum, lambda x, y, z, c: np.cumsum(x, _ROW), _STEPS,
                 r"tl\.cumsum"),
    "cumsum_reverse": Op(K.cumsum_reverse,
                         lambda x, y, z, c: _reverse_cumsum(x), _STEPS,
                         r"tl\.cumsum"),
    "cumprod": Op(K.cumprod, lambda x, y, z, c: np.cumprod(x, _ROW),
                  ("products", _BLOCK - 1, None), r"tl\.cumprod"),
    "scan_add": Op(K.scan_add, lambda x, y, z, c: np.cumsum(x, _ROW), _STEPS,
                   _ADD),
    "sort": Op(K.sort, lambda x, y, z, c: np.sort(x, _ROW), "exact",
               r"`>` \(greater\)"),
    "flip": Op(K.flip, lambda x, y, z, c: np.flip(x, _ROW)),
    "trans": Op(K.trans, lambda x, y, z, c: np.swapaxes(x, 1, 2)),
    "join_split": Op(K.join_split,
                     lambda x, y, z, c: np.where(c % 2 == 0, x, y)),
    "permute": Op(K.permute, lambda x, y, z, c: x.reshape(
        -1, 4, _BLOCK // 4, _BLOCK).transpose(0, 2, 1, 3).reshape(x.shape)),
    "gather": Op(K.gather, lambda x, y, z, c: x[..., (c * 5) % _BLOCK]),
    "dot": Op(K.dot, lambda x, y, z, c: x @ y,
              ("float32 sums", _BLOCK, lambda x, y: np.abs(x) @ np.abs(y))),
    **{name: Op(getattr(K, name), None, refused=rf"tl\.{name}")
       for name in _MATH},
}


# The installed Triton's (major, minor) release.
_TRITON_VERSION = tuple(
    int(v) for v in re.findall(r"\d+", triton.__version__)[:2])


def _as_triton_defines(name: str, op: Op, triton_name: str) -> Op:
  """``op`` on ``triton_name`` as the installed Triton defines it.

  Triton before 3.9 (3.6 to 3.8; remove when 3.6 support ends) divides
  bf16 in bf16 with ``tl.math.fdiv``, and its ``tl.maximum`` returns
  float32 for bf16, which ``tl.reduce`` refuses from a combine function.
  """
  if triton_name != "bf16" or _TRITON_VERSION >= (3, 9):
    return op
  if name == "fdiv":
    return dataclasses.replace(op, error="once")
  if name == "reduce_max":
    return dataclasses.replace(op, refused=r"tl\.reduce")
  return op


# Operations whose result tells a NaN operand from a number.
_NAN_SENSITIVE = ("maximum", "minimum", "maximum_nan", "minimum_nan", "clamp",
                  "clamp_nan")


def _narrowed(values, dtype):
  """``values`` in ``dtype``, as NVIDIA GPUs convert (saturating float8)."""
  largest = float(ml_dtypes.finfo(dtype).max)
  if np.dtype(dtype).itemsize == 1:
    values = np.clip(values, -largest, largest)
  return np.asarray(values, np.float32).astype(dtype).astype(np.float64)


class NarrowFloatsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the sweep checks the CPU interpreter; GPUs compile"
                    " these kernels themselves")

  def _inputs(self, name, dtype):
    """x, y <= z in ``dtype`` (y away from 0, a NaN in x where it tells)."""
    shape = (_PROGRAMS, _BLOCK, _BLOCK)
    x = self.np_rng.uniform(-2, 2, shape)
    if name in _NAN_SENSITIVE:
      x[0, self.np_rng.integers(_BLOCK), self.np_rng.integers(_BLOCK)] = np.nan
    y = self.np_rng.choice([-1.0, 1.0], shape) * self.np_rng.uniform(
        0.25, 2, shape)
    y = y.astype(np.float32).astype(dtype)
    z = (y.astype(np.float64) + self.np_rng.uniform(0, 2, shape)).astype(
        np.float32).astype(dtype)
    return x.astype(np.float32).astype(dtype), y, z

  def _call(self, op, inputs):
    """The kernel's result, or the KernelTypeError it raised."""
    try:
      out = jt_dist.triton_call(
          *(jnp.asarray(a) for a in inputs), kernel=K.float_op_kernel,
          out_shape=jax.ShapeDtypeStruct(inputs[0].shape, jnp.float32),
          grid=(_PROGRAMS,), OP=op.kernel, BLOCK=_BLOCK, TAG=self.seed)
      return np.asarray(out)
    except jt_dist.KernelTypeError as e:
      return e

  def _both(self, op, inputs):
    """(vectorised, one program at a time) outcomes; checks the first ran
    vectorised (or faulted there)."""
    with self.assertLogs("jt_dist", level="DEBUG") as logs:
      vectorised = self._call(op, inputs)
    if not isinstance(vectorised, Exception):
      how = "runs vectorised"
    elif "compiling it for a GPU fails too" in str(vectorised):
      # A math function's refusal is Triton's own ValueError until the
      # one-program run reports it, so the vectorised attempt gave way.
      how = "runs one program at a time"
    else:
      how = "faulted vectorised"
    self.assertTrue(any(how in line for line in logs.output), logs.output)
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "0"}):
      one_at_a_time = self._call(op, inputs)
    return vectorised, one_at_a_time

  def assertRefused(self, outcome, spelled, triton_name, path):
    self.assertIsInstance(outcome, jt_dist.KernelTypeError,
                          f"{path}: computed instead (seed {self.seed})")
    self.assertRegex(
        str(outcome), rf"kernel 'float_op_kernel', program id \(0, 0, 0\):"
        rf" {spelled} on {triton_name}\b")

  def assertMatches(self, out, op, inputs, dtype):
    wide = [np.asarray(a).astype(np.float64) for a in inputs]
    cols = np.arange(_BLOCK)
    reference = np.broadcast_to(op.reference(*wide, cols), out.shape)
    if op.narrowed:
      reference = _narrowed(reference, dtype)
    msg = f"seed {self.seed}"
    eps = float(ml_dtypes.finfo(dtype).eps)
    if op.error == "exact":
      np.testing.assert_array_equal(out, reference, err_msg=msg)
    elif op.error == "once":
      np.testing.assert_allclose(out, reference, rtol=eps, atol=1e-30,
                                 err_msg=msg)
    elif op.error == "float32":
      np.testing.assert_allclose(out, reference, rtol=1e-5, atol=1e-6,
                                 err_msg=msg)
    else:
      kind, depth, magnitude = op.error
      if kind == "float32 sums":
        eps = float(np.finfo(np.float32).eps)
      scale = (np.abs(reference) if magnitude is None
               else magnitude(*wide[:2]))
      excess = np.abs(out - reference) - depth * eps * scale
      self.assertLessEqual(float(np.max(excess)), 1e-30,
                           f"{out} against {reference} ({msg})")

  @parameterized.named_parameters(
      (f"_{name}_{dtype[1]}", name, dtype)
      for name in sorted(_OPS) for dtype in _DTYPES)
  def test_operation(self, name, dtype):
    jnp_dtype, triton_name = dtype
    op = _as_triton_defines(name, _OPS[name], triton_name)
    inputs = self._inputs(name, jnp_dtype)
    vectorised, one_at_a_time = self._both(op, inputs)
    float8 = np.dtype(jnp_dtype).itemsize == 1
    spelled = op.refused or (op.float8 if float8 else None)
    if spelled and not (op.divides and not isinstance(vectorised, Exception)):
      for path, outcome in (("vectorised", vectorised),
                            ("one program at a time", one_at_a_time)):
        self.assertRefused(outcome, spelled, triton_name, path)
      return
    for path, outcome in (("vectorised", vectorised),
                          ("one program at a time", one_at_a_time)):
      self.assertNotIsInstance(outcome, Exception, f"{path}: {outcome}")
    np.testing.assert_array_equal(vectorised, one_at_a_time,
                                  err_msg=f"seed {self.seed}")
    self.assertMatches(vectorised, op, inputs, jnp_dtype)

  @parameterized.named_parameters((f"_{name}", dtype) for dtype, name in _DTYPES)
  def test_device_print_shows_values(self, dtype):
    x = self.np_rng.uniform(-2, 2, (_BLOCK,)).astype(np.float32).astype(dtype)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      jax.block_until_ready(jt_dist.triton_call(
          jnp.asarray(x), kernel=K.print_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          BLOCK=_BLOCK))
    line = printed.getvalue().strip()
    shown = np.array(line[line.index("[") + 1:line.rindex("]")].split(),
                     np.float64)
    # NumPy prints at most 8 digits after the point.
    np.testing.assert_allclose(shown, x.astype(np.float64), rtol=1e-7,
                               atol=1e-8,
                               err_msg=f"{line!r} (seed {self.seed})")


if __name__ == "__main__":
  absltest.main()
