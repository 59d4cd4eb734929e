"""Float8 kernels compute on values, or are refused by name, never on bits.

Triton's GPU backends do not compile arithmetic, comparisons, minimum,
maximum, clamp or math functions on float8 operands; on the CPU interpreter
such an operation raises ``KernelTypeError`` naming the kernel, the
operation and the dtype (upstream it would compute on the raw bits). What
GPUs do compile (loads, stores, casts, selects, ``tl.abs``, ``tl.dot``, and
division where Triton divides float8 in float32, as 3.9 does) gives the
values' results; casts to float8 round to nearest even and saturate, as NVIDIA GPUs
convert to float8_e4m3fn and float8_e5m2.
"""

from __future__ import annotations

import functools

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
from feature_kernels import unmasked_copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

# (JAX dtype, Triton's name for it).
_FLOAT8 = (
    (jnp.float8_e4m3fn, "fp8e4nv"),
    (jnp.float8_e5m2, "fp8e5"),
    (jnp.float8_e4m3fnuz, "fp8e4b8"),
    (jnp.float8_e5m2fnuz, "fp8e5b16"),
)
_FNUZ = (jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz)
# (OP, how the message spells it).
_REFUSED = (
    ("add", r"`\+` \(add\)"),
    ("sub", r"`-` \(subtract\)"),
    ("mul", r"`\*` \(multiply\)"),
    # Triton 3.6 negates by subtracting from zero.
    ("neg", r"(`unary -` \(negative\)|`-` \(subtract\))"),
    ("gt", r"`>` \(greater\)"),
    ("le", r"`<=` \(less_equal\)"),
    ("eq", r"`==` \(equal\)"),
    ("sum", r"tl\.sum"),
    ("fma", r"tl\.fma"),
    ("max", r"`tl\.maximum` \((maximum|fmax)\)"),
    ("min", r"`tl\.minimum` \((minimum|fmin)\)"),
    ("clamp", r"`tl\.(maximum|clamp)` \((fmax|clip)\)"),
)
_BLOCK = 16


@triton.jit
def binary_kernel(x_ptr, y_ptr, out_ptr, OP: tl.constexpr,
                  BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  y = tl.load(y_ptr + offsets)
  if OP == "add":
    z = x + y
  elif OP == "sub":
    z = x - y
  elif OP == "mul":
    z = x * y
  elif OP == "div":
    z = x / y
  elif OP == "neg":
    z = -x
  elif OP == "gt":
    z = tl.where(x > y, x, y)
  elif OP == "le":
    z = tl.where(x <= y, x, y)
  elif OP == "eq":
    z = tl.where(x == y, x, y)
  elif OP == "sum":
    z = tl.sum(x, axis=0) + tl.zeros_like(y)
  elif OP == "fma":
    z = tl.fma(x, y, y)
  elif OP == "clamp":
    z = tl.clamp(x, y, y)
  elif OP == "max":
    z = tl.maximum(x, y)
  elif OP == "min":
    z = tl.minimum(x, y)
  elif OP == "select":
    z = tl.where(offsets % 2 == 0, x, y)
  elif OP == "abs":
    z = tl.abs(x)
  elif OP == "div":
    z = x / y
  else:  # Through float32, as the refusal's message advises.
    z = (x.to(tl.float32) * y.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
  tl.store(out_ptr + offsets, z)


@triton.jit
def cast_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets,
           tl.load(x_ptr + offsets).to(out_ptr.dtype.element_ty))


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr,
               K: tl.constexpr):
  rm = tl.arange(0, M)
  rn = tl.arange(0, N)
  rk = tl.arange(0, K)
  a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
  b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


@functools.lru_cache(maxsize=None)
def _interpreter_lacks(dtype) -> bool:
  """Whether this Triton's interpreter cannot even load ``dtype``.

  Triton 3.6's has no fnuz float8 types (AMD's): loading one fails with
  "fail to convert fp8e4b8 to ir type", with or without jt_dist.
  """
  x = jnp.zeros((_BLOCK,), dtype)
  try:
    jt_dist.triton_call(x, kernel=unmasked_copy_kernel,
                        out_shape=jax.ShapeDtypeStruct(x.shape, dtype),
                        grid=(1,), BLOCK=_BLOCK).block_until_ready()
  except (jax.errors.JaxRuntimeError, triton.runtime.errors.InterpreterError,
          ValueError) as e:
    if "fail to convert" in str(e):
      return True
    raise
  return False


def _to_float8(values, dtype):
  """NVIDIA's conversion: nearest even, saturating at the largest finite."""
  largest = float(ml_dtypes.finfo(dtype).max)
  return np.clip(np.asarray(values, np.float32), -largest, largest).astype(
      dtype)


def _call(op, x, y, jit=False):
  def f(a, b):
    return jt_dist.triton_call(
        a, b, kernel=binary_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(1,), OP=op,
        BLOCK=_BLOCK)
  return (jax.jit(f) if jit else f)(x, y)


class Float8Test(testing.TestCase):

  def _skip_unless_loadable(self, dtype):
    if testing.platform() == "cpu":
      if _interpreter_lacks(dtype):
        self.skipTest(f"this Triton's interpreter cannot load"
                      f" {dtype.__name__}")
    elif dtype in _FNUZ and "rocm" not in str(
        jax.devices()[0].client.platform_version).lower():
      self.skipTest(f"{dtype.__name__} is AMD's; NVIDIA GPUs do not take it")

  def _inputs(self, dtype, count=2, low=-4.0, high=4.0):
    self._skip_unless_loadable(dtype)
    # Representable values, so that the reference sees what the kernel sees.
    return [np.asarray(self.random((_BLOCK,), low=low, high=high)).astype(
        dtype) for _ in range(count)]

  def _cpu_only(self):
    if testing.platform() != "cpu":
      self.skipTest("Triton itself refuses these kernels when compiling for"
                    " a GPU; the refusal tested here is the CPU interpreter's")

  @parameterized.product(dtype=_FLOAT8, refused=_REFUSED)
  def test_arithmetic_and_comparisons_are_refused(self, dtype, refused):
    self._cpu_only()
    (jnp_dtype, triton_name), (op, spelled) = dtype, refused
    x, y = self._inputs(jnp_dtype)
    with self.assertRaisesRegex(
        jt_dist.KernelTypeError,
        rf"kernel 'binary_kernel', program id \(0, 0, 0\): {spelled} on"
        rf" {triton_name} \({np.dtype(jnp_dtype).name}\) operands.*"
        r"x\.to\(tl\.float32\)"):
      jax.block_until_ready(_call(op, jnp.asarray(x), jnp.asarray(y)))

  @parameterized.parameters("add", "gt")
  def test_refusal_under_jit_names_the_operation(self, op):
    self._cpu_only()
    x, y = self._inputs(jnp.float8_e4m3fn)
    with self.assertRaisesKernelError(jt_dist.KernelTypeError,
                                      jitted=True) as caught:
      jax.block_until_ready(_call(op, jnp.asarray(x), jnp.asarray(y), jit=True))
    self.assertRegex(caught.message, r"'binary_kernel'.*fp8e4nv")

  def test_refusal_is_a_type_error(self):
    self.assertTrue(issubclass(jt_dist.KernelTypeError, TypeError))

  @parameterized.product(dtype=_FLOAT8, op=("select", "abs", "via_float32"))
  def test_moves_and_casts_keep_values(self, dtype, op):
    jnp_dtype = dtype[0]
    x, y = self._inputs(jnp_dtype, low=-2.0, high=2.0)
    out = np.asarray(_call(op, jnp.asarray(x), jnp.asarray(y)))
    xf, yf = x.astype(np.float32), y.astype(np.float32)
    if op == "select":
      reference = np.where(np.arange(_BLOCK) % 2 == 0, xf, yf)
    elif op == "abs":
      reference = np.abs(xf)
    else:
      reference = _to_float8(xf * yf + xf, jnp_dtype).astype(np.float32)
    np.testing.assert_array_equal(out.astype(np.float32), reference,
                                  err_msg=f"seed {self.seed}")

  @parameterized.parameters(*_FLOAT8)
  def test_division_on_values_or_refused(self, jnp_dtype, triton_name):
    # Triton 3.9 divides float8 in float32; 3.6 divides the float8 values,
    # which GPUs do not compile, and the interpreter refuses.
    x, y = self._inputs(jnp_dtype)
    y = np.where(y.astype(np.float32) == 0, np.ones_like(y), y)
    try:
      out = np.asarray(_call("div", jnp.asarray(x), jnp.asarray(y)))
    except jt_dist.KernelTypeError as e:
      self.assertRegex(str(e), rf"`/` \(divide\) on {triton_name} ")
      return
    except (RuntimeError, triton.compiler.errors.CompilationError):
      # Where Triton divides the float8 values (3.6), the GPU compiler
      # refuses the kernel as the interpreter does; on the CPU it must not.
      if testing.platform() == "cpu":
        raise
      return
    quotient = x.astype(np.float32) / y.astype(np.float32)
    reference = _to_float8(quotient, jnp_dtype).astype(np.float32)
    np.testing.assert_array_equal(out.astype(np.float32), reference,
                                  err_msg=f"seed {self.seed}")

  @parameterized.product(
      dst=tuple(dtype for dtype, _ in _FLOAT8),
      src=(jnp.float32, jnp.float16, jnp.bfloat16))
  def test_casts_round_to_nearest_even_and_saturate(self, dst, src):
    self._skip_unless_loadable(dst)
    largest = float(ml_dtypes.finfo(dst).max)
    # Ties between neighbours (exact halfway points), values beyond the
    # largest finite one, and random values.
    grid = np.sort(np.unique(np.abs(
        np.arange(256, dtype=np.uint8).view(dst).astype(np.float32))))
    grid = grid[np.isfinite(grid)]
    picks = self.np_rng.choice(len(grid) - 1, size=6, replace=False)
    ties = (grid[picks] + grid[picks + 1]) / 2
    specials = [largest * 1.5, -largest * 4, 1e30, float("inf"),
                float("nan")]
    values = np.concatenate([ties, -ties, specials,
                             self.random((_BLOCK,), low=-8, high=8)])
    with np.errstate(over="ignore"):  # 1e30 is inf as a float16.
      values = values[:_BLOCK * 2].astype(src)
    out = jt_dist.triton_call(
        jnp.asarray(values), kernel=cast_kernel,
        out_shape=jax.ShapeDtypeStruct(values.shape, dst), grid=(1,),
        BLOCK=values.size)
    reference = _to_float8(values.astype(np.float32), dst)
    np.testing.assert_array_equal(
        np.asarray(out).astype(np.float32), reference.astype(np.float32),
        err_msg=f"inputs {values.astype(np.float32)} (seed {self.seed})")

  @parameterized.product(
      src=tuple(dtype for dtype, _ in _FLOAT8),
      dst=(jnp.float32, jnp.float16, jnp.bfloat16))
  def test_casts_from_float8_keep_every_value(self, src, dst):
    # Every bit pattern: NaN, infinities and subnormals too, which a
    # conversion of the bits gets wrong.
    self._skip_unless_loadable(src)
    values = np.arange(256, dtype=np.uint8).view(src)
    out = jt_dist.triton_call(
        jnp.asarray(values), kernel=cast_kernel,
        out_shape=jax.ShapeDtypeStruct(values.shape, dst), grid=(1,),
        BLOCK=values.size)
    got = np.asarray(out).astype(np.float32)
    want = values.astype(np.float32).astype(dst).astype(np.float32)
    if (testing.platform() != "cpu" and src == jnp.float8_e5m2
        and dst == jnp.bfloat16):
      # Compiled Triton 3.6 on an H100 converts float8_e5m2 infinities and
      # NaNs to bfloat16 as finite numbers (0x7c to 65536, 0x7d to 81920):
      # the finite values only there. The interpreter keeps them all.
      keep = np.isfinite(want)
      got, want = got[keep], want[keep]
    np.testing.assert_array_equal(
        got, want, err_msg=f"{np.dtype(src).name} to {np.dtype(dst).name}")

  @parameterized.parameters(jnp.float8_e4m3fn, jnp.float8_e5m2)
  def test_dot_multiplies_subnormal_values(self, jnp_dtype):
    # Random finite bit patterns, about one in forty of them subnormal.
    m = n = 16
    k = 32
    finite = np.arange(256, dtype=np.uint8)
    finite = finite[np.isfinite(finite.view(jnp_dtype).astype(np.float32))]
    a, b = (self.np_rng.choice(finite, size).view(jnp_dtype)
            for size in ((m, k), (k, n)))
    out = jt_dist.triton_call(
        jnp.asarray(a), jnp.asarray(b), kernel=dot_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(1,),
        M=m, N=n, K=k)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if testing.platform() == "cpu":
      # A float32 sum of k products is off by up to about k float32
      # roundings of the products' magnitudes: with float8_e5m2's range,
      # terms of 1e9 cancel to results of 1e4.
      bound = k * np.finfo(np.float32).eps * (np.abs(a64) @ np.abs(b64))
      np.testing.assert_array_less(
          np.abs(np.asarray(out, np.float64) - a64 @ b64), bound + 1e-3,
          err_msg=f"(seed {self.seed})")
    else:
      self.assertDotClose(out, a64 @ b64)

  @parameterized.parameters(jnp.float8_e4m3fn, jnp.float8_e5m2)
  def test_dot_multiplies_values(self, jnp_dtype):
    m = n = 16
    k = 32  # Triton's smallest K for a float8 dot on GPUs.
    a = np.asarray(self.random((m, k), low=-2, high=2)).astype(jnp_dtype)
    b = np.asarray(self.random((k, n), low=-2, high=2)).astype(jnp_dtype)
    out = jt_dist.triton_call(
        jnp.asarray(a), jnp.asarray(b), kernel=dot_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32), grid=(1,),
        M=m, N=n, K=k)
    self.assertDotClose(out, a.astype(np.float32) @ b.astype(np.float32))


if __name__ == "__main__":
  absltest.main()
