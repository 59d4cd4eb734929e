"""Matrix multiply with ``tl.dot`` and ``@triton.autotune``.

The block sizes are autotuning configs, not constants in the kernel; the
grid is a callable, evaluated for each config. On a GPU Triton's autotuner
picks the fastest config; on a host without GPUs the first config runs
through Triton's interpreter, on small matrices.

    python examples/matmul.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl


# The first config is small: on the CPU, where timing configs through the
# interpreter means nothing, jt_dist runs the first one (tl.dot needs blocks
# of at least 16). On GPUs the autotuner times them all and keeps the
# fastest. The list is fixed at import, without asking JAX for a backend, so
# that importing this module has no side effects.
CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=1),
] + [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                  num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [(128, 128, 32, 4, 3), (128, 64, 32, 4, 4),
                             (64, 128, 32, 4, 4), (64, 64, 64, 4, 3),
                             (128, 256, 32, 8, 3)]
]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
  """C[M, N] = A[M, K] @ B[K, N], all row-major; accumulates in fp32."""
  pid_m = tl.program_id(0)
  pid_n = tl.program_id(1)
  rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  rk = tl.arange(0, BLOCK_K)
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, K, BLOCK_K):
    a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :],
                mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
    b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc += tl.dot(a, b)
  c = acc.to(c_ptr.dtype.element_ty)
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], c,
           mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
  """a @ b for 2-D arrays, in a's dtype."""
  (m, k), (k2, n) = a.shape, b.shape
  assert k == k2, (a.shape, b.shape)
  return jt_dist.triton_call(
      a, b, m, n, k,
      kernel=matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=lambda meta: (triton.cdiv(meta["M"], meta["BLOCK_M"]),
                         triton.cdiv(meta["N"], meta["BLOCK_N"])))


def main(m=None, n=None, k=None, seed=0):
  on_cpu = jax.default_backend() == "cpu"
  m = m or (48 if on_cpu else 4096)
  n = n or (40 if on_cpu else 4096)
  k = k or (32 if on_cpu else 4096)
  rng = np.random.default_rng(seed)
  a = rng.standard_normal((m, k), dtype=np.float32)
  b = rng.standard_normal((k, n), dtype=np.float32)
  out = jax.jit(matmul)(jnp.asarray(a), jnp.asarray(b))
  expected = a.astype(np.float64) @ b.astype(np.float64)
  error = float(np.max(np.abs(np.asarray(out) - expected)))
  # On GPUs tl.dot may use TF32, whose error grows with sqrt(K).
  tolerance = 1e-3 if on_cpu else 2e-2 * np.sqrt(k)
  where = "Triton's interpreter" if on_cpu else "a compiled, autotuned kernel"
  print(f"matmul ({m}x{k}) @ ({k}x{n}) on {out.devices()} ({where}):"
        f" max |error| vs NumPy = {error:.3g}")
  assert error < tolerance, (error, tolerance)
  return error


if __name__ == "__main__":
  main()
