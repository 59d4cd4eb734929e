"""Float results Triton's interpreter gets wrong upstream, as GPUs give them.

On the CPU, vectorised and one program at a time (``JT_DIST_VECTORIZE=0``):

* bf16 and float8 constants (``tl.full``, a number next to a narrow
  operand) are the number rounded to nearest even, float8 saturating.
  Upstream, Triton 3.6's interpreter cannot make them, and 3.9's makes a
  float8 one from the number's integer part (1.5 became 2**-9).
* ``tl.minimum``, ``tl.maximum`` and ``tl.clamp`` return the other operand
  where one is NaN (``minnumf``), as GPUs do; Triton 3.6's interpreter
  returned NaN.
* A ``tl.reduce`` or ``tl.associative_scan`` whose combine function returns
  another type than its operands is refused with ``KernelTypeError``, as
  compiling refuses it; upstream stores the values into the operands' type
  (float values as bf16 bits).
"""

from __future__ import annotations

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16
_PROGRAMS = 2
_PATHS = (("vectorised", "1"), ("one_program_at_a_time", "0"))
# (dtype, Triton's name for it).
_NARROW = ((jnp.bfloat16, "bf16"), (jnp.float8_e4m3fn, "fp8e4nv"),
           (jnp.float8_e5m2, "fp8e5"))


@triton.jit
def constant_kernel(out_ptr, VALUE: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets,
           tl.full((BLOCK,), VALUE, out_ptr.dtype.element_ty))


@triton.jit
def nan_kernel(x_ptr, y_ptr, out_ptr, OP: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  y = tl.load(y_ptr + offsets)
  if OP == "maximum":
    z = tl.maximum(x, y)
  elif OP == "minimum":
    z = tl.minimum(x, y)
  else:
    z = tl.clamp(x, y, y + 1.0)
  tl.store(out_ptr + offsets, z.to(tl.float32))


@triton.jit
def _widening_add(a, b):
  return a.to(tl.float32) + b.to(tl.float32)


@triton.jit
def combine_kernel(x_ptr, out_ptr, SCAN: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  if SCAN:
    y = tl.associative_scan(x, 0, _widening_add)
  else:
    y = tl.reduce(x, 0, _widening_add) + tl.zeros((BLOCK,), tl.float32)
  tl.store(out_ptr + offsets, y.to(tl.float32))


def _rounded(values, dtype) -> np.ndarray:
  """``values`` in ``dtype`` as GPUs round them (float8 saturating)."""
  values = np.asarray(values, np.float32)
  if np.dtype(dtype).itemsize == 1:
    largest = float(ml_dtypes.finfo(dtype).max)
    values = np.clip(values, -largest, largest)
  return values.astype(dtype).astype(np.float32)


class InterpreterFloatFixesTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("these are the CPU interpreter's results")

  def _on(self, vectorize: str, kernel, *args, **kwargs):
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": vectorize}):
      return np.asarray(jt_dist.triton_call(
          *args, kernel=kernel, grid=(_PROGRAMS,), BLOCK=_BLOCK, **kwargs))

  @parameterized.product(dtype=_NARROW, path=_PATHS,
                         value=(1.5, 1.0625, -0.3, 1000.0))
  def test_narrow_constants_are_rounded_values(self, dtype, path, value):
    jnp_dtype = dtype[0]
    out = self._on(path[1], constant_kernel, out_shape=jax.ShapeDtypeStruct(
        (_PROGRAMS * _BLOCK,), jnp_dtype), VALUE=value)
    np.testing.assert_array_equal(
        out.astype(np.float32),
        np.broadcast_to(_rounded([value], jnp_dtype), out.shape))

  @parameterized.product(dtype=(jnp.float32, jnp.bfloat16), path=_PATHS,
                         op=("maximum", "minimum", "clamp"))
  def test_a_nan_operand_gives_the_other(self, dtype, path, op):
    shape = (_PROGRAMS * _BLOCK,)
    x = np.asarray(self.random(shape, low=-2, high=2)).astype(dtype)
    x[::3] = np.nan
    y = np.asarray(self.random(shape, low=-2, high=2)).astype(dtype)
    out = self._on(path[1], nan_kernel, jnp.asarray(x), jnp.asarray(y),
                   out_shape=jax.ShapeDtypeStruct(shape, jnp.float32), OP=op)
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    reference = {"maximum": lambda: np.fmax(xf, yf),
                 "minimum": lambda: np.fmin(xf, yf),
                 "clamp": lambda: np.fmin(np.fmax(xf, yf),
                                          _rounded(yf + 1, dtype))}[op]()
    np.testing.assert_array_equal(out, reference,
                                  err_msg=f"seed {self.seed}")

  @parameterized.product(
      dtype=((jnp.bfloat16, "bf16"), (jnp.float16, "fp16"),
             (jnp.float8_e4m3fn, "fp8e4nv"), (jnp.int32, "int32")),
      path=_PATHS, scan=(False, True))
  def test_a_combine_function_changing_the_type_is_refused(
      self, dtype, path, scan):
    (jnp_dtype, triton_name), what = dtype, ("associative_scan" if scan
                                             else "reduce")
    x = jnp.ones((_PROGRAMS * _BLOCK,), jnp_dtype)
    with self.assertRaisesRegex(
        jt_dist.KernelTypeError,
        rf"kernel 'combine_kernel', program id \(0, 0, 0\):"
        rf" tl\.{what} on {triton_name} operands whose"
        r" combine function returns fp32 values\..*\.to\(a\.dtype\)`"):
      self._on(path[1], combine_kernel, x, out_shape=jax.ShapeDtypeStruct(
          x.shape, jnp.float32), SCAN=scan)

  @parameterized.product(path=_PATHS, scan=(False, True))
  def test_a_combine_function_keeping_the_type_runs(self, path, scan):
    x = np.asarray(self.random((_PROGRAMS * _BLOCK,), low=-2, high=2))
    out = self._on(path[1], combine_kernel, jnp.asarray(x, jnp.float32),
                   out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
                   SCAN=scan)
    rows = x.astype(np.float32).reshape(_PROGRAMS, _BLOCK)
    reference = (np.cumsum(rows, axis=1) if scan else np.broadcast_to(
        rows.sum(axis=1, keepdims=True), rows.shape))
    np.testing.assert_allclose(out.reshape(rows.shape), reference,
                               rtol=1e-6, atol=1e-6,
                               err_msg=f"seed {self.seed}")


if __name__ == "__main__":
  absltest.main()
