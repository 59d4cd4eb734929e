"""libdevice on the CPU computes what CUDA's libdevice computes.

Triton's code generator maps ``triton.language.extra.libdevice`` to the
target's libdevice; on the CPU each ``__nv_*`` function is computed in
NumPy, rounded to the nearest or in the direction its name gives, and a
function the CPU does not compute raises an error naming it. Builtins
imported by name (``from triton.language.math import rsqrt``) run as the
compiler finds them, through their module.
"""

import fractions
import inspect
import math
import os
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import libdevice as cuda
from triton.language.extra.libdevice import tanh as imported_tanh
from triton.language.math import rsqrt as imported_rsqrt

from jt_dist import testing

testing.configure_cpu_devices()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import interpreter  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import libdevice as cpu  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 64


@triton.jit
def float_functions_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  x = tl.load(x_ptr + offs)
  y = tl.load(y_ptr + offs)
  tl.store(out_ptr + 0 * N + offs, libdevice.tanh(x))
  tl.store(out_ptr + 1 * N + offs, libdevice.rsqrt(y))
  tl.store(out_ptr + 2 * N + offs, libdevice.erf(x))
  tl.store(out_ptr + 3 * N + offs, libdevice.pow(y, x))
  tl.store(out_ptr + 4 * N + offs, libdevice.fmod(x, y))
  tl.store(out_ptr + 5 * N + offs, libdevice.log1p(y))
  tl.store(out_ptr + 6 * N + offs, libdevice.fast_expf(x))
  tl.store(out_ptr + 7 * N + offs, libdevice.div_rn(x, y))
  tl.store(out_ptr + 8 * N + offs, libdevice.erfinv(x / 4.0))
  tl.store(out_ptr + 9 * N + offs, libdevice.round(x * 4.0))
  tl.store(out_ptr + 10 * N + offs, libdevice.isnan(x / x).to(tl.float32))
  tl.store(out_ptr + 11 * N + offs, tl.extra.libdevice.exp2(x))


@triton.jit
def imported_kernel(x_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  x = tl.load(x_ptr + offs)
  tl.store(out_ptr + offs, imported_tanh(x) + imported_rsqrt(x + 3.0))


@triton.jit
def integer_functions_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  a = tl.load(a_ptr + offs)
  b = tl.load(b_ptr + offs)
  tl.store(out_ptr + 0 * N + offs, libdevice.clz(a))
  tl.store(out_ptr + 1 * N + offs, libdevice.popc(a))
  tl.store(out_ptr + 2 * N + offs, libdevice.brev(a))
  tl.store(out_ptr + 3 * N + offs, libdevice.ffs(a))
  tl.store(out_ptr + 4 * N + offs, libdevice.mulhi(a, b))
  tl.store(out_ptr + 5 * N + offs, libdevice.hadd(a, b))
  tl.store(out_ptr + 6 * N + offs, libdevice.byte_perm(a, b, b & 0x7777))
  tl.store(out_ptr + 7 * N + offs,
           libdevice.float2int_rz(a.to(tl.float32) / 7.0))


@triton.jit
def directed_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  x = tl.load(x_ptr + offs)
  y = tl.load(y_ptr + offs)
  tl.store(out_ptr + 0 * N + offs, libdevice.add_rd(x, y))
  tl.store(out_ptr + 1 * N + offs, libdevice.add_ru(x, y))
  tl.store(out_ptr + 2 * N + offs, libdevice.add_rz(x, y))
  tl.store(out_ptr + 3 * N + offs, libdevice.mul_rd(x, y))
  tl.store(out_ptr + 4 * N + offs, libdevice.mul_ru(x, y))
  tl.store(out_ptr + 5 * N + offs, libdevice.mul_rz(x, y))
  tl.store(out_ptr + 6 * N + offs, libdevice.div_rd(x, y))
  tl.store(out_ptr + 7 * N + offs, libdevice.div_ru(x, y))
  tl.store(out_ptr + 8 * N + offs, libdevice.div_rz(x, y))
  tl.store(out_ptr + 9 * N + offs, libdevice.sqrt_rd(libdevice.abs(x)))
  tl.store(out_ptr + 10 * N + offs, libdevice.sqrt_ru(libdevice.abs(x)))


@triton.jit
def bessel_kernel(x_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  tl.store(out_ptr + offs, libdevice.j0(tl.load(x_ptr + offs)))


@triton.jit
def subnormal_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
  offs = tl.arange(0, N)
  x = tl.load(x_ptr + offs)
  y = tl.load(y_ptr + offs)
  tl.store(out_ptr + 0 * N + offs, x * y)
  tl.store(out_ptr + 1 * N + offs, libdevice.nextafter(x, y))
  tl.store(out_ptr + 2 * N + offs, libdevice.saturatef(x))
  tl.store(out_ptr + 3 * N + offs, libdevice.mul_rn(x, y))


def _bits(*values):
  return np.array(values, np.uint32)


def _erf(x):
  return np.vectorize(math.erf)(x)


class LibdeviceTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    rng = np.random.default_rng(7)
    self.x = rng.uniform(-3, 3, _N).astype(np.float32)
    self.y = rng.uniform(0.25, 4, _N).astype(np.float32)

  def _call(self, kernel, *args, rows, dtype):
    out = jt_dist.triton_call(
        *map(jnp.asarray, args), kernel=kernel, grid=(1,), N=_N,
        out_shape=jax.ShapeDtypeStruct((rows * _N,), dtype))
    return np.asarray(out).reshape(rows, _N)

  @parameterized.parameters("on", "off")
  def test_float_functions_match_float64_references(self, vectorize):
    self.enter_context(mock.patch.dict(os.environ,
                                       {"JT_DIST_VECTORIZE": vectorize}))
    x, y = self.x.astype(np.float64), self.y.astype(np.float64)
    got = self._call(float_functions_kernel, self.x, self.y, rows=12,
                     dtype=jnp.float32)
    with np.errstate(all="ignore"):
      references = [np.tanh(x), 1 / np.sqrt(y), _erf(x), y ** x,
                    np.fmod(x, y), np.log1p(y), np.exp(x), x / y, None,
                    np.trunc(x * 4 + np.copysign(0.5, x)),
                    np.isnan(x / x).astype(np.float64), np.exp2(x)]
    for row, (value, reference) in enumerate(zip(got, references)):
      if reference is None:  # erfinv: erf takes it back to its operand.
        np.testing.assert_allclose(_erf(value.astype(np.float64)), x / 4,
                                   atol=1e-6)
        continue
      # Rounded once from float64, as correctly rounded as float32 allows.
      np.testing.assert_array_equal(value, reference.astype(np.float32),
                                    err_msg=f"row {row}")

  def test_builtins_imported_by_name(self):
    got = jt_dist.triton_call(jnp.asarray(self.x), kernel=imported_kernel,
                              grid=(1,), N=_N, out_shape=jnp.asarray(self.x))
    x = self.x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(got), np.tanh(x) + 1 / np.sqrt(x + 3),
                               rtol=1e-6, atol=1e-6)

  def test_integer_functions(self):
    rng = np.random.default_rng(3)
    a = rng.integers(-2**31, 2**31, _N, dtype=np.int64).astype(np.int32)
    b = rng.integers(-2**31, 2**31, _N, dtype=np.int64).astype(np.int32)
    a[:3] = (0, 1, -1)
    got = self._call(integer_functions_kernel, a, b, rows=8, dtype=jnp.int32)
    bits = [format(int(v) & 0xFFFFFFFF, "032b") for v in a]
    as_int32 = lambda values: np.array(values, np.int64).astype(np.uint32
                                                                ).view(np.int32)
    pool = [int(v) & 0xFFFFFFFF | (int(w) & 0xFFFFFFFF) << 32
            for v, w in zip(a, b)]
    expected = [
        [32 - len(s.lstrip("0")) for s in bits],
        [s.count("1") for s in bits],
        as_int32([int(s[::-1], 2) for s in bits]),
        [0 if v == 0 else (int(v) & -int(v)).bit_length() for v in a],
        as_int32([(int(v) * int(w)) >> 32 & 0xFFFFFFFF for v, w in zip(a, b)]),
        [(int(v) + int(w)) >> 1 for v, w in zip(a, b)],
        as_int32([sum(((p >> 8 * ((int(s) >> 4 * i) & 7)) & 0xFF) << 8 * i
                      for i in range(4))
                  for p, s in zip(pool, b & 0x7777)]),
        np.trunc(a.astype(np.float32) / np.float32(7)).astype(np.int64),
    ]
    for row, (value, reference) in enumerate(zip(got, expected)):
      np.testing.assert_array_equal(value, np.asarray(reference, np.int64),
                                    err_msg=f"row {row}")

  def test_directed_rounding_brackets_the_exact_result(self):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(_N).astype(np.float32)
    y = rng.standard_normal(_N).astype(np.float32)
    got = self._call(directed_kernel, x, y, rows=11, dtype=jnp.float32)
    exact = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b,
             "div": lambda a, b: a / b}
    F = fractions.Fraction  # pylint: disable=invalid-name
    for i in range(_N):
      a, b = F(float(x[i])), F(float(y[i]))
      for k, name in enumerate(("add", "mul", "div")):
        value = exact[name](a, b)
        down, up, zero = (F(float(v)) for v in got[3 * k:3 * k + 3, i])
        self.assertLessEqual(down, value, (name, i))
        self.assertGreaterEqual(up, value, (name, i))
        self.assertLessEqual(
            float(up) - float(down),
            float(np.spacing(np.float32(abs(float(value))))), (name, i))
        self.assertEqual(zero, down if value >= 0 else up, (name, i))
      root_down, root_up = (F(float(v)) for v in got[9:11, i])
      self.assertLessEqual(root_down * root_down, abs(a))
      self.assertGreaterEqual(root_up * root_up, abs(a))

  @parameterized.parameters(False, True)
  def test_subnormals_as_an_h200_computes_them(self, jit):
    # Arithmetic keeps subnormals (IEEE products, as an H200 gave them);
    # libdevice, linked flush-to-zero, takes and gives none: the nextafter
    # and saturatef bits are those an H200 gave.
    tiny, sub = 0x00000001, 0x000ae398  # Subnormals; 0x00800000 is FLT_MIN.
    x = _bits(0, tiny, tiny | 1 << 31, sub, sub, 0x80000000, 0x00800000,
              tiny, sub | 1 << 31, 0x3f800000, 0, 0, 0, 0, 0, 0).view(
                  np.float32)
    y = np.array([1, 1, 1, -1, 2, -1, -1, -0.0, 0, 2] + [1] * 6, np.float32)
    call = lambda a, b: jt_dist.triton_call(
        a, b, kernel=subnormal_kernel, grid=(1,), N=16,
        out_shape=jax.ShapeDtypeStruct((64,), jnp.float32))
    xla = lambda: np.asarray(jnp.asarray(x) * jnp.asarray(y))
    before = xla()
    got = np.asarray((jax.jit(call) if jit else call)(x, y)).view(
        np.uint32).reshape(4, 16)[:, :10]
    product = _bits(0, tiny, tiny | 1 << 31, sub | 1 << 31, 0x0015c730, 0,
                    0x80800000, 0x80000000, 0x80000000, 0x40000000)
    np.testing.assert_array_equal(got[0], product)
    np.testing.assert_array_equal(got[1], _bits(
        0x00800000, 0x00800000, 0x00800000, 0x80800000, 0x00800000,
        0x80800000, 0x007fffff, 0x80000000, 0, 0x3f800001))
    np.testing.assert_array_equal(got[2], _bits(
        0, 0, 0, 0, 0, 0, 0x00800000, 0, 0, 0x3f800000))
    np.testing.assert_array_equal(got[3], np.where(
        np.abs(product.view(np.float32)) < np.finfo(np.float32).tiny,
        product & 0x80000000, product))
    # XLA's own CPU arithmetic (which flushes) is as it was.
    np.testing.assert_array_equal(xla(), before)

  def test_a_function_the_cpu_does_not_compute_is_named(self):
    with self.assertRaisesRegex(
        NotImplementedError, r"libdevice\.j0 \(CUDA's __nv_j0f\) is not"
        r" computed on the CPU\. Write it with triton\.language's"):
      self._call(bessel_kernel, self.x, rows=1, dtype=jnp.float32)

  def test_every_symbol_computes_or_is_named(self):
    # Each __nv_ symbol of CUDA's libdevice, on values of its own types, at
    # the builder's call that Triton's extern_elementwise makes.
    entry = re.compile(r"\(((?:core\.dtype\(\"\w+\"\),?\s*)+)\): \(\"(__nv_\w+)\","
                       r" core\.dtype\(\"(\w+)\"\)\)")
    computed = 0
    for name, fn in vars(cuda).items():
      if not callable(fn) or name.startswith("_"):
        continue
      for types, symbol, returned in entry.findall(inspect.getsource(fn)):
        arg_types = [tl.dtype(t)
                     for t in re.findall(r"core\.dtype\(\"(\w+)\"\)", types)]
        args = [interpreter.TensorHandle(
            np.ones(4, interpreter.np_dtype(t)), t) for t in arg_types]
        try:
          out = cpu.create_extern_elementwise(None, "", "", symbol, args,
                                              tl.dtype(returned), True)
        except NotImplementedError as e:
          self.assertIn(f"libdevice.{name}", str(e))
          self.assertIn(symbol, str(e))
          continue
        computed += 1
        self.assertEqual(out.data.dtype,
                         interpreter.np_dtype(tl.dtype(returned)), symbol)
        self.assertEqual(out.data.shape, (4,), symbol)
    self.assertGreater(computed, 290)


if __name__ == "__main__":
  absltest.main()
