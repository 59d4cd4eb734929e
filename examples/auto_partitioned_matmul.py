"""A Triton matmul under plain ``jax.jit``, split by its sharding rule.

The kernel is written for one device. ``jt_dist.ShardingRule("i k, k j ->
i j", reductions={"k": "sum"})`` says how it may be split: rows of A and
columns of B independently, and K with a sum of the partial products. With
the inputs on a mesh with explicit axes, ``jax.jit`` of the call runs it
once per device on its shard, with no ``shard_map`` in user code:

* A split by rows over "x", B by columns over "y": each device computes its
  block of C, no communication;
* A and B split along K: each device computes a partial C, and one
  all-reduce adds them.

    python examples/auto_partitioned_matmul.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing


@triton.jit
def matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
  """C[M, N] = A[M, K] @ B[K, N] for one device's row-major buffers."""
  rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
  rk = tl.arange(0, BLOCK_K)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K)):
    kk = k * BLOCK_K + rk
    a = tl.load(a_ptr + rm[:, None] * K + kk[None, :],
                mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + kk[:, None] * N + rn[None, :],
                mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc += tl.dot(a, b)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :],
           acc.to(c_ptr.dtype.element_ty),
           mask=(rm[:, None] < M) & (rn[None, :] < N))

MATMUL_RULE = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})


def matmul(a, b, blocks=(16, 16, 16), out_dtype=np.float32):
  """C = A @ B with the Triton kernel; split per shard by ``MATMUL_RULE``."""
  bm, bn, bk = blocks
  return jt_dist.triton_call(
      a, b,
      jt_dist.shard_size(0, axis=0),  # M, N and K as each shard sees them.
      jt_dist.shard_size(1, axis=1),
      jt_dist.shard_size(0, axis=1),
      kernel=matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), out_dtype),
      grid=lambda meta: (triton.cdiv(meta["M"], meta["BLOCK_M"]),
                         triton.cdiv(meta["N"], meta["BLOCK_N"])),
      sharding_rule=MATMUL_RULE, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)


def explicit_mesh(shape, names, devices=None):
  """A mesh whose axes are explicit: shardings are part of array types."""
  return jax.make_mesh(shape, names, devices=devices,
                       axis_types=(AxisType.Explicit,) * len(names))


def main(size=None, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  count = len(devices) - len(devices) % 2 if len(devices) > 1 else 1
  size = size or (32 if on_cpu else 4096)
  blocks = (16, 16, 16) if on_cpu else (128, 128, 32)
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((size, size), dtype=np.float32)
  b = rng.standard_normal((size, size), dtype=np.float32)
  ref = a.astype(np.float64) @ b.astype(np.float64)
  fn = jax.jit(lambda x, y: matmul(x, y, blocks))
  rows = 2 if count % 2 == 0 else 1
  grid_mesh = explicit_mesh((rows, count // rows), ("x", "y"), devices[:count])
  k_mesh = explicit_mesh((count,), ("k",), devices[:count])
  worst = 0.0
  for mesh, specs in ((grid_mesh, (P("x", None), P(None, "y"))),
                      (k_mesh, (P(None, "k"), P("k", None)))):
    x, y = (jax.device_put(v, NamedSharding(mesh, s))
            for v, s in zip((a, b), specs))
    out = fn(x, y)
    rel = float(np.linalg.norm(np.asarray(out) - ref) / np.linalg.norm(ref))
    print(f"matmul {a.shape} with A {specs[0]}, B {specs[1]} over mesh"
          f" {dict(mesh.shape)}: C is {jax.typeof(out)}, relative error"
          f" {rel:.2e}")
    worst = max(worst, rel)
  # GPUs compute a float32 tl.dot in TF32 by default.
  assert worst < (1e-5 if on_cpu else 1e-2), worst
  return worst


if __name__ == "__main__":
  testing.configure_cpu_devices(8)
  main()
