"""Causal flash attention, forward and backward, as one differentiable op.

The kernels follow Triton's fused-attention tutorial: each program owns a
block of queries (forward, and the dq pass) or of keys (the dk/dv pass),
and its key or query loop stops or starts at its own block, so the loops'
bounds depend on ``tl.program_id``. ``jax.custom_vjp`` ties them into one
function that ``jax.grad`` differentiates; on the CPU the interpreter runs
all programs of a launch at once, the shorter loops masked.

    python examples/causal_attention.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist

_LOG2E = 1.4426950408889634


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptr, v_ptr, start_m, qk_scale, offs_m,
               offs_n, offs_d, D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
  # Stage 1: the key blocks left of the diagonal; stage 2: the diagonal's.
  if STAGE == 1:
    lo, hi = 0, start_m * BLOCK_M
  else:
    lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
  for start_n in range(lo, hi, BLOCK_N):
    cols = start_n + offs_n
    k = tl.load(k_ptr + cols[None, :] * D + offs_d[:, None])
    qk = tl.dot(q, k)
    if STAGE == 2:
      causal = offs_m[:, None] >= cols[None, :]
      qk = qk * qk_scale + tl.where(causal, 0.0, -1.0e6)
      m_ij = tl.maximum(m_i, tl.max(qk, 1))
      qk -= m_ij[:, None]
    else:
      m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
      qk = qk * qk_scale - m_ij[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ij)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + cols[:, None] * D + offs_d[None, :])
    acc = acc * alpha[:, None] + tl.dot(p, v)
    m_i = m_ij
  return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(q_ptr, k_ptr, v_ptr, sm_scale, n_ctx, o_ptr, lse_ptr,
                         D: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr):
  """o = softmax(q k^T * sm_scale, causal) v; lse in base 2, per row."""
  start_m = tl.program_id(0)
  head = tl.program_id(1)
  base = head * n_ctx * D
  offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
  offs_n = tl.arange(0, BLOCK_N)
  offs_d = tl.arange(0, D)
  q = tl.load(q_ptr + base + offs_m[:, None] * D + offs_d[None, :])
  m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
  l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
  acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
  qk_scale = sm_scale * 1.4426950408889634
  acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptr + base, v_ptr + base,
                             start_m, qk_scale, offs_m, offs_n, offs_d, D,
                             BLOCK_M, BLOCK_N, 1)
  acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptr + base, v_ptr + base,
                             start_m, qk_scale, offs_m, offs_n, offs_d, D,
                             BLOCK_M, BLOCK_N, 2)
  m_i += tl.math.log2(l_i)
  tl.store(lse_ptr + head * n_ctx + offs_m, m_i)
  tl.store(o_ptr + base + offs_m[:, None] * D + offs_d[None, :],
           acc / l_i[:, None])


@triton.jit
def attention_bwd_preprocess_kernel(o_ptr, do_ptr, n_ctx, delta_ptr,
                                    D: tl.constexpr, BLOCK_M: tl.constexpr):
  rows = tl.program_id(1) * n_ctx + tl.program_id(0) * BLOCK_M + tl.arange(
      0, BLOCK_M)
  offs_d = tl.arange(0, D)
  o = tl.load(o_ptr + rows[:, None] * D + offs_d[None, :])
  do = tl.load(do_ptr + rows[:, None] * D + offs_d[None, :])
  tl.store(delta_ptr + rows, tl.sum(o * do, 1))


@triton.jit
def _bwd_dkdv(dk, dv, q_ptr, k, v, qk_scale, do_ptr, lse_ptr, delta_ptr,
              start_n, start_m, num_steps, offs_d, D: tl.constexpr,
              BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
              MASK: tl.constexpr):
  offs_m = start_m + tl.arange(0, BLOCK_M1)
  offs_n = start_n + tl.arange(0, BLOCK_N1)
  qt_ptrs = q_ptr + offs_m[None, :] * D + offs_d[:, None]
  do_ptrs = do_ptr + offs_m[:, None] * D + offs_d[None, :]
  curr_m = start_m
  for _ in range(num_steps):
    qt = tl.load(qt_ptrs)
    offs_m = curr_m + tl.arange(0, BLOCK_M1)
    lse = tl.load(lse_ptr + offs_m)
    pt = tl.math.exp2(tl.dot(k, qt) * qk_scale - lse[None, :])
    if MASK:
      pt = tl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
    do = tl.load(do_ptrs)
    dv += tl.dot(pt, do)
    delta = tl.load(delta_ptr + offs_m)
    dpt = tl.dot(v, tl.trans(do))
    dk += tl.dot(pt * (dpt - delta[None, :]), tl.trans(qt))
    curr_m += BLOCK_M1
    qt_ptrs += BLOCK_M1 * D
    do_ptrs += BLOCK_M1 * D
  return dk, dv


@triton.jit
def _bwd_dq(dq, q, k_ptr, v_ptr, qk_scale, do, lse, delta, start_m, start_n,
            num_steps, offs_d, D: tl.constexpr, BLOCK_M2: tl.constexpr,
            BLOCK_N2: tl.constexpr, MASK: tl.constexpr):
  offs_m = start_m + tl.arange(0, BLOCK_M2)
  offs_n = start_n + tl.arange(0, BLOCK_N2)
  kt_ptrs = k_ptr + offs_n[None, :] * D + offs_d[:, None]
  vt_ptrs = v_ptr + offs_n[None, :] * D + offs_d[:, None]
  curr_n = start_n
  for _ in range(num_steps):
    kt = tl.load(kt_ptrs)
    p = tl.math.exp2(tl.dot(q, kt) * qk_scale - lse[:, None])
    if MASK:
      offs_n = curr_n + tl.arange(0, BLOCK_N2)
      p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    dp = tl.dot(do, tl.load(vt_ptrs))
    dq += tl.dot(p * (dp - delta[:, None]), tl.trans(kt))
    curr_n += BLOCK_N2
    kt_ptrs += BLOCK_N2 * D
    vt_ptrs += BLOCK_N2 * D
  return dq


@triton.jit
def attention_bwd_kernel(q_ptr, k_ptr, v_ptr, sm_scale, do_ptr, lse_ptr,
                         delta_ptr, n_ctx, dq_ptr, dk_ptr, dv_ptr,
                         D: tl.constexpr, BLOCK_M1: tl.constexpr,
                         BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr,
                         BLOCK_N2: tl.constexpr, SLICE: tl.constexpr):
  """dk, dv for key block program_id(0); dq for query block program_id(0)."""
  pid = tl.program_id(0)
  head = tl.program_id(1)
  base = head * n_ctx * D
  q_ptr += base
  k_ptr += base
  v_ptr += base
  do_ptr += base
  lse_ptr += head * n_ctx
  delta_ptr += head * n_ctx
  qk_scale = sm_scale * 1.4426950408889634
  offs_d = tl.arange(0, D)
  # dk, dv: the query blocks at and below this key block's diagonal.
  start_n = pid * BLOCK_N1
  offs_n = start_n + tl.arange(0, BLOCK_N1)
  k = tl.load(k_ptr + offs_n[:, None] * D + offs_d[None, :])
  v = tl.load(v_ptr + offs_n[:, None] * D + offs_d[None, :])
  dk = tl.zeros([BLOCK_N1, D], dtype=tl.float32)
  dv = tl.zeros([BLOCK_N1, D], dtype=tl.float32)
  MASK_M1: tl.constexpr = BLOCK_M1 // SLICE
  num_steps = BLOCK_N1 // MASK_M1
  dk, dv = _bwd_dkdv(dk, dv, q_ptr, k, v, qk_scale, do_ptr, lse_ptr,
                     delta_ptr, start_n, start_n, num_steps, offs_d, D,
                     MASK_M1, BLOCK_N1, True)
  start_m = start_n + num_steps * MASK_M1
  num_steps = (n_ctx - start_m) // BLOCK_M1
  dk, dv = _bwd_dkdv(dk, dv, q_ptr, k, v, qk_scale, do_ptr, lse_ptr,
                     delta_ptr, start_n, start_m, num_steps, offs_d, D,
                     BLOCK_M1, BLOCK_N1, False)
  tl.store(dv_ptr + base + offs_n[:, None] * D + offs_d[None, :], dv)
  tl.store(dk_ptr + base + offs_n[:, None] * D + offs_d[None, :],
           dk * sm_scale)
  # dq: the key blocks at and left of this query block's diagonal.
  start_m = pid * BLOCK_M2
  offs_m = start_m + tl.arange(0, BLOCK_M2)
  q = tl.load(q_ptr + offs_m[:, None] * D + offs_d[None, :])
  do = tl.load(do_ptr + offs_m[:, None] * D + offs_d[None, :])
  lse = tl.load(lse_ptr + offs_m)
  delta = tl.load(delta_ptr + offs_m)
  dq = tl.zeros([BLOCK_M2, D], dtype=tl.float32)
  MASK_N2: tl.constexpr = BLOCK_N2 // SLICE
  num_steps = BLOCK_M2 // MASK_N2
  end_n = start_m + BLOCK_M2 - num_steps * MASK_N2
  dq = _bwd_dq(dq, q, k_ptr, v_ptr, qk_scale, do, lse, delta, start_m, end_n,
               num_steps, offs_d, D, BLOCK_M2, MASK_N2, True)
  num_steps = end_n // BLOCK_N2
  dq = _bwd_dq(dq, q, k_ptr, v_ptr, qk_scale, do, lse, delta, start_m,
               end_n - num_steps * BLOCK_N2, num_steps, offs_d, D, BLOCK_M2,
               BLOCK_N2, False)
  tl.store(dq_ptr + base + offs_m[:, None] * D + offs_d[None, :],
           dq * sm_scale)


# Forward blocks, and the backward's (dk/dv: 32 queries per step over 32
# keys; dq: 32 queries over 32 keys per step; a program's key block and
# query block are the same size). On the diagonal a step takes a SLICE of
# those: GPUs' tl.dot needs every dimension >= 16.
BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32}
BWD_BLOCKS = {"BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32,
              "BLOCK_N2": 32, "SLICE": 2}


def attention_forward(q, k, v, sm_scale):
  """(o, lse) for q, k, v of shape (heads, n_ctx, d), float32."""
  heads, n_ctx, d = q.shape
  return jt_dist.triton_call(
      q, k, v, sm_scale, n_ctx, kernel=attention_fwd_kernel,
      out_shape=(jax.ShapeDtypeStruct(q.shape, jnp.float32),
                 jax.ShapeDtypeStruct((heads, n_ctx), jnp.float32)),
      grid=(n_ctx // BLOCKS["BLOCK_M"], heads), D=d, **BLOCKS)


def attention_backward(q, k, v, sm_scale, o, lse, do):
  """(dq, dk, dv) of the forward's output o against the cotangent do."""
  heads, n_ctx, d = q.shape
  delta = jt_dist.triton_call(
      o, do, n_ctx, kernel=attention_bwd_preprocess_kernel,
      out_shape=jax.ShapeDtypeStruct((heads, n_ctx), jnp.float32),
      grid=(n_ctx // 32, heads), D=d, BLOCK_M=32)
  grads = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jt_dist.triton_call(
      q, k, v, sm_scale, do, lse, delta, n_ctx,
      kernel=attention_bwd_kernel, out_shape=(grads, grads, grads),
      grid=(n_ctx // BWD_BLOCKS["BLOCK_N1"], heads), D=d, **BWD_BLOCKS)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def causal_attention(q, k, v, sm_scale: float):
  """Causal attention of q, k, v (heads, n_ctx, d); sm_scale a Python float."""
  return attention_forward(q, k, v, sm_scale)[0]


def _fwd(q, k, v, sm_scale):
  o, lse = attention_forward(q, k, v, sm_scale)
  return o, (q, k, v, o, lse)


def _bwd(sm_scale, residuals, do):
  q, k, v, o, lse = residuals
  return attention_backward(q, k, v, sm_scale, o, lse, do)


causal_attention.defvjp(_fwd, _bwd)


def reference(q, k, v, sm_scale):
  """Causal attention in jnp."""
  n_ctx = q.shape[1]
  s = jnp.einsum("hmd,hnd->hmn", q, k) * sm_scale
  causal = jnp.tril(jnp.ones((n_ctx, n_ctx), bool))
  p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
  return jnp.einsum("hmn,hnd->hmd", p, v)


def main(seed: int = 0, heads: int = 2, n_ctx: int = 128, d: int = 32):
  rng = np.random.default_rng(seed)
  q, k, v, do = (jnp.asarray(rng.standard_normal((heads, n_ctx, d),
                                                 dtype=np.float32))
                 for _ in range(4))
  sm_scale = d ** -0.5

  def loss(f):
    return lambda q, k, v: jnp.sum(f(q, k, v, sm_scale) * do)

  out = causal_attention(q, k, v, sm_scale)
  grads = jax.grad(loss(causal_attention), argnums=(0, 1, 2))(q, k, v)
  with jax.default_matmul_precision("highest"):
    want_out = reference(q, k, v, sm_scale)
    expected = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
  # GPUs compute a float32 tl.dot in TF32 (a 10-bit mantissa), the CPU
  # interpreter in float32.
  gpu = jax.default_backend() != "cpu"
  for got, want, tol in [(out, want_out, 2e-4), *zip(grads, expected,
                                                      [2e-3] * 3)]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if gpu:
      error = np.linalg.norm(got - want) / np.linalg.norm(want)
      assert error < 1e-2, f"relative error {error:.2e} against jnp"
    else:
      np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
  print("causal attention forward and backward match jnp")
  return out, grads


if __name__ == "__main__":
  main()
