"""``shard_size`` placeholders given as keyword metaparams, of every kind.

``M=jt_dist.shard_size(0, 0)`` binds a kernel's size parameter by name,
whether it is a runtime scalar declared after the output pointer
(``matmul(a_ptr, b_ptr, c_ptr, M, N, K, ...)``: it stays bound by name), a
runtime scalar before it (``matmul(a_ptr, b_ptr, M, N, K, c_ptr, ...)``:
it joins the positional operands) or a ``tl.constexpr``. Each resolves
where the kernel runs, to the shard's size: through
``sharded_triton_call`` (eager and jitted, rows x columns and a split K),
``triton_call`` with a ``ShardingRule``, ``triton_call`` inside the
caller's ``jax.shard_map``, and a plain ``triton_call`` on one device.
Results are compared with NumPy in float64.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

_BLOCK = 16


@triton.jit
def _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
  # C[M, N] = A[M, K] @ B[K, N], row-major; one BLOCK_M x BLOCK_N tile.
  rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K)):
    rk = k * BLOCK_K + tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :],
                mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :],
                mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc += tl.dot(a, b)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc,
           mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def sizes_after_output_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr):
  _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def sizes_before_output_kernel(a_ptr, b_ptr, M, N, K, c_ptr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr):
  _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def constexpr_sizes_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr,
                           N: tl.constexpr, K: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
  _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)


_KERNELS = (
    ("sizes_after_output", sizes_after_output_kernel),
    ("sizes_before_output", sizes_before_output_kernel),
    ("constexpr_sizes", constexpr_sizes_kernel),
)


def _grid(meta):
  return (triton.cdiv(meta["M"], meta["BLOCK_M"]),
          triton.cdiv(meta["N"], meta["BLOCK_N"]))


def _sizes(k=None):
  """M, N (and K, a shard's unless given) as keyword placeholders."""
  return dict(M=jt_dist.shard_size(0, 0), N=jt_dist.shard_size(1, 1),
              K=jt_dist.shard_size(0, axis=1) if k is None else k,
              BLOCK_M=_BLOCK, BLOCK_N=_BLOCK, BLOCK_K=_BLOCK)


def _out(m, n):
  return jax.ShapeDtypeStruct((m, n), jnp.float32)


class ShardSizeKeywordTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.devices(4)
    devices = self.devices()
    self.count = min(len(devices), 8) // 2 * 2
    self.devices_used = devices[:self.count]
    # rows over "x" (2), columns or K over "y" (the rest).
    self.mesh = jax.make_mesh((2, self.count // 2), ("x", "y"),
                              devices=self.devices_used)
    self.explicit = jax.make_mesh(
        (2, self.count // 2), ("x", "y"), devices=self.devices_used,
        axis_types=(AxisType.Explicit, AxisType.Explicit))

  def _operands(self, k=32):
    m, n = 2 * 2 * _BLOCK, (self.count // 2) * 2 * _BLOCK
    a, b = self.random((m, k)), self.random((k, n))
    return a, b, a.astype(np.float64) @ b

  def _assert_matmul(self, out, expected):
    self.assertEqual(out.shape, expected.shape)
    self.assertAllClose(out, expected, rtol=1e-4, atol=1e-4)

  @parameterized.named_parameters(
      (f"{name}_{mode}", kernel, mode) for name, kernel in _KERNELS
      for mode in ("eager", "jit"))
  def test_sharded_rows_and_columns(self, kernel, mode):
    a, b, expected = self._operands()

    def call(a, b):
      return jt_dist.sharded_triton_call(
          a, b, kernel=kernel, out_shape=_out(a.shape[0], b.shape[1]),
          mesh=self.mesh, in_specs=(P("x", None), P(None, "y")),
          out_specs=P("x", "y"), grid=_grid, **_sizes(k=a.shape[1]))

    out = (jax.jit(call) if mode == "jit" else call)(a, b)
    self._assert_matmul(out, expected)
    self.assertEqual(out.sharding.spec, P("x", "y"))

  @parameterized.named_parameters(*_KERNELS)
  def test_sharded_k_split_with_reduction(self, kernel):
    a, b, expected = self._operands(k=16 * self.count)
    out = jt_dist.sharded_triton_call(
        a, b, kernel=kernel, out_shape=_out(a.shape[0], b.shape[1]),
        mesh=self.mesh, in_specs=(P("x", "y"), P("y", None)),
        out_specs=P("x"), out_reduce=("sum", "y"), grid=_grid, **_sizes())
    self._assert_matmul(out, expected)

  @parameterized.named_parameters(
      (f"{name}_{mode}", kernel, mode) for name, kernel in _KERNELS
      for mode in ("eager", "jit"))
  def test_triton_call_with_a_sharding_rule(self, kernel, mode):
    rule = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})
    a, b, expected = self._operands(k=16 * self.count)
    a_split = jax.device_put(a, NamedSharding(self.explicit, P("x", "y")))
    b_split = jax.device_put(b, NamedSharding(self.explicit, P("y", None)))

    def call(a, b):
      return jt_dist.triton_call(
          a, b, kernel=kernel, out_shape=_out(a.shape[0], b.shape[1]),
          grid=_grid, sharding_rule=rule, **_sizes())

    out = (jax.jit(call) if mode == "jit" else call)(a_split, b_split)
    self._assert_matmul(out, expected)

  @parameterized.named_parameters(*_KERNELS)
  def test_triton_call_inside_shard_map(self, kernel):
    a, b, expected = self._operands()

    def per_shard(a, b):
      return jt_dist.triton_call(
          a, b, kernel=kernel, out_shape=_out(a.shape[0], b.shape[1]),
          grid=_grid, **_sizes())

    mapped = jax.jit(jax.shard_map(
        per_shard, mesh=self.mesh, in_specs=(P("x", None), P(None, "y")),
        out_specs=P("x", "y")))
    out = mapped(jax.device_put(a, NamedSharding(self.mesh, P("x", None))),
                 jax.device_put(b, NamedSharding(self.mesh, P(None, "y"))))
    self._assert_matmul(out, expected)

  @parameterized.named_parameters(*_KERNELS)
  def test_plain_triton_call(self, kernel):
    a, b, expected = self._operands()
    out = jt_dist.triton_call(
        jnp.asarray(a), jnp.asarray(b), kernel=kernel,
        out_shape=_out(a.shape[0], b.shape[1]), grid=_grid, **_sizes())
    self._assert_matmul(out, expected)

  def test_array_keyword_after_the_output_is_an_operand(self):
    # An array there is an input (the kernel is called through a wrapper
    # that takes it before the output): it needs an in_spec of its own.
    a, b, _ = self._operands()
    with self.assertRaisesRegex(
        jt_dist.ShardingSpecError,
        r"got 2 in_specs, but the call has 3 array arguments"):
      jt_dist.sharded_triton_call(
          a, b, kernel=sizes_after_output_kernel,
          out_shape=_out(a.shape[0], b.shape[1]), mesh=self.mesh,
          in_specs=(P("x", None), P(None, "y")), out_specs=P("x", "y"),
          grid=_grid, **dict(_sizes(k=32), M=jnp.zeros((2,), jnp.int32)))


if __name__ == "__main__":
  absltest.main()
