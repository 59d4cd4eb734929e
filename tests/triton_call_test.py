"""Correctness of ``triton_call`` through Triton's interpreter, against NumPy.

Every kernel runs eagerly and under ``jax.jit`` on fresh random inputs: chex
variants make one test of each (``self.variant`` is ``jax.jit`` or not), and
``chex.assert_trees_all_close`` compares pytree results whole, structure
included. Sizes are small on purpose: the interpreter runs Python per program
instance.
"""

import contextlib

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from variants_util import VariantsTestCase  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position


@triton.jit
def add_fp32_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # Adds in fp32 and rounds once on the store, as bf16 kernels usually do.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
  y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
  tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def axpy_kernel(x_ptr, y_ptr, alpha, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


@triton.jit
def axpy_mod_kernel(x_ptr, big, n, out_ptr, BLOCK: tl.constexpr):
  # out = x + (big mod 2**40), computed in 64 bits.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  small = (big % (1 << 40)).to(tl.int32)
  tl.store(out_ptr + offsets, x + small, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  rk = tl.arange(0, BLOCK_K)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, K, BLOCK_K):
    a_mask = (rm[:, None] < M) & (rk[None, :] + k < K)
    b_mask = (rk[:, None] + k < K) & (rn[None, :] < N)
    a = tl.load(a_ptr + rm[:, None] * K + (rk[None, :] + k), mask=a_mask,
                other=0.0)
    b = tl.load(b_ptr + (rk[:, None] + k) * N + rn[None, :], mask=b_mask,
                other=0.0)
    acc += tl.dot(a, b, input_precision="ieee")  # Exact fp32 on GPUs too.
  c_mask = (rm[:, None] < M) & (rn[None, :] < N)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=c_mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
  x = x - tl.max(x, axis=0)
  e = tl.exp(x)
  tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def copy_and_sum_kernel(x_ptr, n, copy_ptr, total_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
  tl.store(copy_ptr + offsets, x, mask=mask)
  tl.atomic_add(total_ptr, tl.sum(x, axis=0))


@triton.jit
def increment_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1,
           mask=mask)


@triton.jit
def grid_2d_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
  # One program per element of a (ROWS, COLS) array, on a 2-D grid.
  i = tl.program_id(0)
  j = tl.program_id(1)
  tl.store(out_ptr + i * COLS + j, tl.load(x_ptr + i * COLS + j) * 2)


@triton.jit
def _square(x):
  return x * x


@triton.jit
def square_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, _square(tl.load(x_ptr + offsets, mask=mask)),
           mask=mask)


@triton.jit
def defaults_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr = 16,
                    SCALE: tl.constexpr = 3):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * SCALE,
           mask=mask)


@triton.jit
def add_sub_kernel(x_ptr, y_ptr, n, sum_ptr, diff_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(sum_ptr + offsets, x + y, mask=mask)
  tl.store(diff_ptr + offsets, x - y, mask=mask)


def _cdiv_grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def add(x, y, kernel=add_kernel, block=32):
  return jt_dist.triton_call(
      x, y, x.size, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=_cdiv_grid, BLOCK=block)


class AddTest(VariantsTestCase):

  # Without jit: NumPy inputs as given, and inputs already on the device.
  @chex.variants(with_jit=True, without_jit=True, with_device=True,
                 without_device=True)
  @parameterized.named_parameters(
      ("float32", np.float32), ("float16", np.float16), ("int32", np.int32))
  def test_add(self, dtype):
    x = self.random((100,), dtype)
    y = self.random((100,), dtype)
    out = self.variant(add)(x, y)
    self.assertEqual(out.dtype, dtype)
    self.assertAllClose(out, x + y, rtol=0, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_add_bfloat16(self):
    # The interpreter stores bf16 as raw uint16 bits and cannot add them
    # natively, so this kernel upcasts, as bf16 kernels usually do anyway.
    x = jnp.asarray(self.random((70,)), jnp.bfloat16)
    y = jnp.asarray(self.random((70,)), jnp.bfloat16)
    out = self.variant(add, static_argnums=2)(x, y, add_fp32_kernel)
    self.assertEqual(out.dtype, jnp.bfloat16)
    expected = (np.asarray(x, np.float32) + np.asarray(y, np.float32)).astype(
        jnp.bfloat16)
    self.assertAllClose(out.astype(np.float32), expected.astype(np.float32),
                        rtol=0, atol=0)

  def test_2d_array(self):
    x = self.random((8, 12))
    y = self.random((8, 12))
    out = jax.jit(add)(jnp.asarray(x), jnp.asarray(y))
    self.assertAllClose(out, x + y)

  @chex.variants(with_jit=True, without_jit=True)
  def test_float64_numpy_operands_without_x64_are_float32_to_the_kernel(self):
    # jit passes the kernel float32 buffers: the call is bound for them
    # (bound for float64, a kernel would read past its buffers).
    self.assertFalse(jax.config.jax_enable_x64)
    x = self.np_rng.uniform(-2, 2, (100,))
    y = self.np_rng.uniform(-2, 2, (100,))

    def call(x, y):
      return jt_dist.triton_call(
          x, y, x.size, kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, np.float32),
          grid=(triton.cdiv(x.size, 8),), BLOCK=8)

    for _ in range(2):  # The first call, then its cached entry.
      out = self.variant(call)(x, y)
      self.assertEqual(out.dtype, np.float32)
      self.assertAllClose(out, x.astype(np.float32) + y.astype(np.float32),
                          rtol=0, atol=0)

  def test_same_call_twice_gives_fresh_results(self):
    x, y = self.random((40,)), self.random((40,))
    self.assertAllClose(add(x, y), x + y)
    x2 = self.random((40,))
    self.assertAllClose(add(x2, y), x2 + y)


def _deprecated_if_numpy(test, value):
  """Expects jt_dist's deprecation of an ``np.float32`` scalar, if it is one."""
  if isinstance(value, np.floating):
    return test.assertWarnsRegex(
        DeprecationWarning, r"passing np\.float32 scalars is deprecated")
  return contextlib.nullcontext()


class ScalarTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(3, -2.5, np.float32(0.75), True)
  def test_axpy(self, alpha):
    x, y = self.random((50,)), self.random((50,))

    def axpy(x, y):
      return jt_dist.triton_call(
          x, y, alpha, x.size, kernel=axpy_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_cdiv_grid,
          BLOCK=16)

    with _deprecated_if_numpy(self, alpha):
      out = self.variant(axpy)(jnp.asarray(x), jnp.asarray(y))
    self.assertAllClose(out, np.float32(alpha) * x + y, rtol=1e-6)

  @parameterized.parameters(1.0 / 3.0, np.float32(1.0 / 3.0))
  def test_fp16_times_float_scalar_computes_in_fp32(self, alpha):
    # A compiled kernel receives a float scalar as an fp32 parameter, so
    # fp16 * alpha is computed in fp32; the interpreter must do the same.
    x = self.random((64,), np.float16)
    with _deprecated_if_numpy(self, alpha):
      out = jt_dist.triton_call(
          x, alpha, x.size, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, np.float32),
          grid=_cdiv_grid, BLOCK=64)
    expected = np.float32(alpha) * x.astype(np.float32)
    self.assertAllClose(out, expected, rtol=1e-6, atol=0)
    fp16_math = (np.float16(alpha) * x).astype(np.float32)
    self.assertFalse(np.array_equal(np.asarray(out), fp16_math))

  def test_int_scalar_times_int_array(self):
    x = self.random((30,), np.int32)
    out = jax.jit(lambda x: jt_dist.triton_call(
        x, 7, x.size, kernel=scale_kernel, out_shape=x, grid=_cdiv_grid,
        BLOCK=16))(x)
    self.assertAllClose(out, 7 * x, rtol=0, atol=0)

  def test_large_int_scalar(self):
    # 2**40 + 5 needs an i64 parameter: the kernel must see all 64 bits.
    x = self.random((16,), np.int32)
    big = 2**40 + 5
    out = jt_dist.triton_call(
        x, big, x.size, kernel=axpy_mod_kernel, out_shape=x, grid=1,
        BLOCK=16)
    self.assertAllClose(out, x + 5, rtol=0, atol=0)


class GridTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("int", 4), ("tuple", (4,)), ("tuple3", (4, 1, 1)),
      ("callable", lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)),
      ("callable_int", lambda meta: triton.cdiv(meta["n"], meta["BLOCK"])))
  def test_grid_forms(self, grid):
    x, y = self.random((60,)), self.random((60,))
    def call(x, y):
      return jt_dist.triton_call(
          x, y, x.size, kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
          BLOCK=16)

    self.assertAllClose(self.variant(call)(x, y), x + y)

  def test_grid_callable_sees_scalar_args_and_metaparams(self):
    seen = []

    def grid(meta):
      seen.append(dict(meta))
      return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    x, y = self.random((45,)), self.random((45,))
    out = add(x, y, block=8)
    out = jt_dist.triton_call(
        x, y, 45, kernel=add_kernel, out_shape=x, grid=grid, BLOCK=8)
    self.assertAllClose(out, x + y)
    self.assertEqual(seen[-1]["n"], 45)
    self.assertEqual(seen[-1]["BLOCK"], 8)

  def test_2d_grid(self):
    x = self.random((3, 5))
    out = jax.jit(lambda x: jt_dist.triton_call(
        x, kernel=grid_2d_kernel, out_shape=x, grid=(3, 5), ROWS=3, COLS=5))(x)
    self.assertAllClose(out, 2 * x)


class KernelTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matmul(self):
    m, n, k = 32, 32, 48
    a, b = self.random((m, k)), self.random((k, n))

    def matmul(a, b):
      return jt_dist.triton_call(
          a, b, kernel=matmul_kernel,
          out_shape=jax.ShapeDtypeStruct((m, n), np.float32),
          grid=lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),
                             triton.cdiv(n, meta["BLOCK_N"])),
          M=m, N=n, K=k, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)

    self.assertAllClose(self.variant(matmul)(a, b), a @ b, rtol=1e-4,
                        atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_softmax(self):
    x = self.random((6, 20), low=-5, high=5)

    def softmax(x):
      return jt_dist.triton_call(
          x, kernel=softmax_kernel, out_shape=x, grid=x.shape[0],
          n_cols=x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))

    e = np.exp(x - x.max(axis=1, keepdims=True))
    self.assertAllClose(self.variant(softmax)(jnp.asarray(x)),
                        e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters("sequence", "callable")
  def test_two_outputs_atomic_add_into_zeroed_output(self, zeroed):
    x = self.random((70,))
    zeroed_outputs = [1] if zeroed == "sequence" else (
        lambda meta: [1] if meta["BLOCK"] else [])

    def copy_and_sum(x):
      return jt_dist.triton_call(
          x, x.size, kernel=copy_and_sum_kernel,
          out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                     jax.ShapeDtypeStruct((1,), np.float32)),
          grid=_cdiv_grid, zeroed_outputs=zeroed_outputs, BLOCK=16)

    fn = self.variant(copy_and_sum)
    expected = (x, np.array([x.sum()], np.float32))
    chex.assert_trees_all_close(fn(jnp.asarray(x)), expected, rtol=1e-5,
                                atol=1e-5)
    # Zeroed before every launch, not once: a second call gives the same.
    chex.assert_trees_all_close(fn(jnp.asarray(x)), expected, rtol=1e-5,
                                atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_two_outputs(self):
    x, y = self.random((33,)), self.random((33,))
    out = self.variant(lambda x, y: jt_dist.triton_call(
        x, y, x.size, kernel=add_sub_kernel, out_shape=(x, x),
        grid=_cdiv_grid, BLOCK=16))(x, y)
    chex.assert_trees_all_close(out, (x + y, x - y), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kernel_calling_jit_helper(self):
    x = self.random((40,))
    fn = lambda x: jt_dist.triton_call(
        x, x.size, kernel=square_kernel, out_shape=x, grid=_cdiv_grid,
        BLOCK=16)
    self.assertAllClose(self.variant(fn)(x), x * x)

  @parameterized.named_parameters(
      ("all_defaults", {}, 16, 3),
      ("override_scale", {"SCALE": 5}, 16, 5),
      ("override_block", {"BLOCK": 8}, 8, 3))
  def test_parameters_with_defaults(self, metaparams, block, scale):
    x = self.random((40,))
    grids = []

    def grid(meta):
      grids.append(meta)
      return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    out = jax.jit(lambda x: jt_dist.triton_call(
        x, x.size, kernel=defaults_kernel, out_shape=x, grid=grid,
        **metaparams))(x)
    self.assertAllClose(out, scale * x)
    # The grid sees defaults as Triton's own launcher shows them.
    self.assertEqual(grids[-1]["BLOCK"], block)
    self.assertEqual(grids[-1]["SCALE"], scale)


class AliasTest(testing.TestCase):

  def _increment(self, x):
    return jt_dist.triton_call(
        x, x.size, kernel=increment_kernel, out_shape=x, grid=_cdiv_grid,
        input_output_aliases={0: 0}, BLOCK=16)

  def test_in_place_increment(self):
    x = self.random((50,))
    self.assertAllClose(self._increment(jnp.asarray(x)), x + 1)

  def test_in_place_increment_jit_donated(self):
    x = self.random((50,))
    fn = jax.jit(self._increment, donate_argnums=0)
    xa = jnp.asarray(x)
    out = fn(xa)
    self.assertAllClose(out, x + 1)
    out = fn(out)
    self.assertAllClose(out, x + 2)

  def test_alias_keeps_unwritten_elements(self):
    # Only the first 20 elements are written; the rest of the aliased
    # output keeps the input's values, as on a GPU.
    x = self.random((50,))
    out = jax.jit(lambda x: jt_dist.triton_call(
        x, 20, kernel=increment_kernel, out_shape=x, grid=2,
        input_output_aliases={0: 0}, BLOCK=16))(x)
    self.assertAllClose(out[:20], x[:20] + 1)
    self.assertAllClose(out[20:], x[20:], rtol=0, atol=0)

  def test_alias_with_scalars_before_the_array(self):
    # Alias indices count array arguments only, scalars not included.
    @triton.jit
    def k(alpha, x_ptr, n, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + alpha,
               mask=mask)

    x = self.random((20,))
    out = jt_dist.triton_call(
        2.0, x, x.size, kernel=k, out_shape=x, grid=_cdiv_grid,
        input_output_aliases={0: 0}, BLOCK=16)
    self.assertAllClose(out, x + 2)


class PytreeTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_dict_out_shape(self):
    x, y = self.random((24,)), self.random((24,))
    out = self.variant(lambda x, y: jt_dist.triton_call(
        x, y, x.size, kernel=add_sub_kernel,
        out_shape={"sum": jax.ShapeDtypeStruct(x.shape, x.dtype),
                   "diff": jax.ShapeDtypeStruct(x.shape, x.dtype)},
        grid=_cdiv_grid, BLOCK=16))(x, y)
    # Dict leaves flatten in sorted key order: diff first, then sum.
    chex.assert_trees_all_close(out, {"diff": x + y, "sum": x - y},
                                rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_nested_out_shape(self):
    x, y = self.random((24,)), self.random((24,))
    sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
    out = self.variant(lambda x, y: jt_dist.triton_call(
        x, y, x.size, kernel=add_sub_kernel, out_shape=[(sds,), {"d": sds}],
        grid=_cdiv_grid, BLOCK=16))(x, y)
    # The structure is compared too: a list holding a tuple and a dict.
    chex.assert_trees_all_close(out, [(x + y,), {"d": x - y}], rtol=1e-6)

  def test_single_leaf_returns_leaf(self):
    x, y = self.random((24,)), self.random((24,))
    out = add(x, y)
    self.assertIsInstance(out, jax.Array)

  def test_array_as_out_shape(self):
    x, y = self.random((24,)), self.random((24,))
    out = jt_dist.triton_call(x, y, x.size, kernel=add_kernel,
                              out_shape=jnp.zeros(24), grid=_cdiv_grid,
                              BLOCK=16)
    self.assertAllClose(out, x + y)

  def test_out_type_alias(self):
    x, y = self.random((24,)), self.random((24,))
    out = jt_dist.triton_call(
        x, y, x.size, kernel=add_kernel,
        out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_cdiv_grid,
        BLOCK=16)
    self.assertAllClose(out, x + y)


if __name__ == "__main__":
  absltest.main()
