"""Matmul over a mesh: rows x cols on a 2-D mesh, and the K-split.

* rows x cols: A is split by rows over "x", B by columns over "y"; each
  device computes its own block of C, no communication.
* K-split: A and B are split along K over "k"; each device computes a
  partial C, and ``out_reduce=("sum", "k")`` adds the partials before they
  leave the shard, all in one call.

    python examples/sharded_matmul.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import numpy as np
import triton
import triton.language as tl
from jax.sharding import PartitionSpec as P

from jt_dist import testing


@triton.jit
def matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
  """C[M, N] = A[M, K] @ B[K, N], row-major, fp32 accumulation."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  rk = tl.arange(0, BLOCK_K)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K)):
    kk = k * BLOCK_K + rk
    a = tl.load(a_ptr + rm[:, None] * K + kk[None, :],
                mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + kk[:, None] * N + rn[None, :],
                mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc += tl.dot(a, b)
  mask = (rm[:, None] < M) & (rn[None, :] < N)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :],
           acc.to(c_ptr.dtype.element_ty), mask=mask)


def _grid(meta):
  return (triton.cdiv(meta["M"], meta["BLOCK_M"]),
          triton.cdiv(meta["N"], meta["BLOCK_N"]))


def _call(a, b, mesh, in_specs, out_spec, out_reduce, blocks, out_dtype):
  m, n = a.shape[0], b.shape[1]
  bm, bn, bk = blocks
  return jt_dist.sharded_triton_call(
      a, b,
      jt_dist.shard_size(0, axis=0),  # M, local
      jt_dist.shard_size(1, axis=1),  # N, local
      jt_dist.shard_size(0, axis=1),  # K, local
      kernel=matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
      grid=_grid, mesh=mesh, in_specs=in_specs, out_specs=out_spec,
      out_reduce=out_reduce, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)


def matmul_rows_cols(a, b, mesh, blocks=(64, 64, 32)):
  """A split by rows over "x", B by columns over "y"; C split over both."""
  return _call(a, b, mesh, (P("x", None), P(None, "y")), P("x", "y"), None,
               blocks, a.dtype)


def matmul_k_split(a, b, mesh, blocks=(64, 64, 32)):
  """A and B split along K over "k"; fp32 partial sums reduced over "k"."""
  return _call(a, b, mesh, (P(None, "k"), P("k", None)), P(), ("sum", "k"),
               blocks, np.float32)


def main(size=None, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  size = size or (64 if on_cpu else 4096)
  blocks = (16, 16, 16) if on_cpu else (128, 128, 32)
  count = len(devices)
  rows = 2 if count % 2 == 0 and count > 1 else 1
  mesh2d = jax.make_mesh((rows, count // rows), ("x", "y"), devices=devices)
  mesh_k = jax.make_mesh((count,), ("k",), devices=devices)
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((size, size), dtype=np.float32)
  b = rng.standard_normal((size, size), dtype=np.float32)
  reference = a.astype(np.float64) @ b.astype(np.float64)
  for label, fn, mesh in (("rows x cols", matmul_rows_cols, mesh2d),
                          ("K-split", matmul_k_split, mesh_k)):
    out = jax.jit(lambda x, y, f=fn, m=mesh: f(x, y, m, blocks))(a, b)
    rel = float(np.linalg.norm(np.asarray(out) - reference)
                / np.linalg.norm(reference))
    print(f"{label} matmul {size}^3 over mesh {dict(mesh.shape)}:"
          f" relative error {rel:.2e}")
    assert rel < 1e-2, rel  # tf32 on GPUs: ~3e-4.
  return True


if __name__ == "__main__":
  testing.configure_cpu_devices(8)
  main()
