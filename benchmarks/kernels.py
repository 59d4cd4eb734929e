"""Kernels and calls the suites share between jt_dist and jax-triton.

Both libraries take the same ``triton_call`` arguments, so each call below
is written once and given the library's ``triton_call`` as ``call``.
"""

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from examples import add as add_example
from examples import sharded_attention

ADD_BLOCK = 1024
# The README's quickstart kernel: the size a runtime scalar.
add_kernel = add_example.add_kernel


@triton.jit
def add_kw_kernel(x_ptr, y_ptr, out_ptr, n_elements: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr):
  """jax-triton's documented form: the size is a keyword metaparam."""
  offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def scale_kernel(x_ptr, s, out_ptr, n_elements: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
  """``x * s``: ``s`` is a per-step scalar (a learning rate, a step)."""
  offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_elements
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * s,
           mask=mask)


@triton.jit
def _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr):
  """One program's tile of C[M, N] = A[M, K] @ B[K, N], row-major.

  Programs run in grouped order so that neighbours share rows of A in L2.
  """
  pid = tl.program_id(0)
  grid_m = tl.cdiv(M, BLOCK_M)
  grid_n = tl.cdiv(N, BLOCK_N)
  group = GROUP_M * grid_n
  first_m = (pid // group) * GROUP_M
  group_m = min(grid_m - first_m, GROUP_M)
  pid_m = first_m + (pid % group) % group_m
  pid_n = (pid % group) // group_m
  rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
  rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
  rk = tl.arange(0, BLOCK_K)
  a_ptrs = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
  b_ptrs = b_ptr + rk[:, None].to(tl.int64) * N + rn[None, :]
  acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BLOCK_K)):
    a = tl.load(a_ptrs, mask=rk[None, :] < K - k * BLOCK_K, other=0.0)
    b = tl.load(b_ptrs, mask=rk[:, None] < K - k * BLOCK_K, other=0.0)
    acc = tl.dot(a, b, acc)
    a_ptrs += BLOCK_K
    b_ptrs += BLOCK_K * N
  cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
  mask = (cm[:, None] < M) & (cn[None, :] < N)
  tl.store(c_ptr + cm[:, None].to(tl.int64) * N + cn[None, :],
           acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
  """The scalar-argument form: M, N and K are runtime integers."""
  _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
               GROUP_M)


@triton.jit
def matmul_kw_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr,
                     K: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr):
  """The keyword form of jax-triton's examples: shapes are metaparams."""
  _matmul_tile(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
               GROUP_M)


@triton.jit
def attention_kw_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len: tl.constexpr,
                        sm_scale: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
  """The example's attention in the keyword form: sizes are metaparams."""
  sharded_attention.attention_block(q_ptr, k_ptr, v_ptr, o_ptr, seq_len,
                                    sm_scale, HEAD_DIM, BLOCK_M, BLOCK_N)


# One config known to do well on Hopper for large bf16 problems.
MATMUL_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8)
MATMUL_OPTIONS = dict(num_warps=8, num_stages=3)

matmul_autotuned = triton.autotune(
    configs=[
        triton.Config(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8),
                      num_warps=8, num_stages=3),
        triton.Config(dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8),
                      num_warps=4, num_stages=4),
        triton.Config(dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8),
                      num_warps=8, num_stages=3),
        triton.Config(dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=32, GROUP_M=8),
                      num_warps=4, num_stages=4),
    ],
    key=["M", "N", "K"],
)(matmul_kernel)


def add(call, x, y, block=ADD_BLOCK):
  """``x + y``, the size a runtime scalar (the README's quickstart form)."""
  return call(x, y, x.size, kernel=add_kernel,
              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
              grid=(triton.cdiv(x.size, block),), BLOCK=block)


def add_kw(call, x, y, block=1024):
  """``x + y`` as jax-triton's docs call it: the size a keyword metaparam."""
  return call(x, y, kernel=add_kw_kernel,
              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
              grid=(triton.cdiv(x.size, block),), n_elements=x.size,
              BLOCK_SIZE=block)


def _matmul_grid(m, n):
  return lambda meta: (triton.cdiv(m, meta["BLOCK_M"])
                       * triton.cdiv(n, meta["BLOCK_N"]),)


def matmul(call, a, b, out_dtype=None, autotuned=False):
  (m, k), n = a.shape, b.shape[1]
  fixed = {} if autotuned else {**MATMUL_OPTIONS, **MATMUL_CONFIG}
  return call(a, b, m, n, k,
              kernel=matmul_autotuned if autotuned else matmul_kernel,
              out_shape=jax.ShapeDtypeStruct((m, n), out_dtype or a.dtype),
              grid=_matmul_grid(m, n), **fixed)


def xla_matmul(a, b):
  return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
