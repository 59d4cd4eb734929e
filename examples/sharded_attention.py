"""Flash-attention-style forward kernel, sharded over batch and heads.

Each program handles a block of queries of one (batch, head) pair and sweeps
the keys with an online softmax, never materialising the score matrix.
Batch and heads are independent, so the mesh splits them with no
communication.

    python examples/sharded_attention.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import math

import jax
import numpy as np
import triton
import triton.language as tl
from jax.sharding import PartitionSpec as P

from jt_dist import testing


@triton.jit
def attention_block(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, sm_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
  """One program's block of queries of one (batch, head) pair."""
  pid_m = tl.program_id(0)
  base = tl.program_id(1).to(tl.int64) * seq_len * HEAD_DIM
  rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
  rd = tl.arange(0, HEAD_DIM)
  q = tl.load(q_ptr + base + rm[:, None] * HEAD_DIM + rd[None, :],
              mask=rm[:, None] < seq_len, other=0.0)
  m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
  l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
  acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
  for start in range(0, seq_len, BLOCK_N):
    rn = start + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_ptr + base + rn[None, :] * HEAD_DIM + rd[:, None],
                  mask=rn[None, :] < seq_len, other=0.0)
    scores = tl.dot(q, k_t) * sm_scale
    scores = tl.where(rn[None, :] < seq_len, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp(scores - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + base + rn[:, None] * HEAD_DIM + rd[None, :],
                mask=rn[:, None] < seq_len, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    m_i = m_new
  out = acc / l_i[:, None]
  tl.store(o_ptr + base + rm[:, None] * HEAD_DIM + rd[None, :],
           out.to(o_ptr.dtype.element_ty), mask=rm[:, None] < seq_len)


@triton.jit
def attention_kernel(q_ptr, k_ptr, v_ptr, seq_len, sm_scale, o_ptr,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
  """o = softmax(q k^T * sm_scale) v for q, k, v, o of shape [B, H, S, D]."""
  attention_block(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, sm_scale, HEAD_DIM,
                  BLOCK_M, BLOCK_N)


def _grid(meta):
  batch, heads = meta["q_ptr"].shape[:2]  # Shard-local shapes.
  return (triton.cdiv(meta["seq_len"], meta["BLOCK_M"]), batch * heads)


def attention(q, k, v, mesh=None, block_m=64, block_n=64):
  """Attention over [B, H, S, D] arrays, one launch per (batch, head) shard."""
  seq_len, head_dim = q.shape[2], q.shape[3]
  spec = P("b", "h")
  return jt_dist.sharded_triton_call(
      q, k, v, seq_len, 1.0 / math.sqrt(head_dim),
      kernel=attention_kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=_grid, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
      HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)


def reference(q, k, v):
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  scores -= scores.max(-1, keepdims=True)
  p = np.exp(scores)
  return (p / p.sum(-1, keepdims=True)) @ v


def main(shape=None, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  count = len(devices)
  heads_axis = 2 if count % 2 == 0 and count > 1 else 1
  mesh = jax.make_mesh((count // heads_axis, heads_axis), ("b", "h"),
                       devices=devices)
  if shape is None:
    shape = ((count // heads_axis, heads_axis, 32, 16) if on_cpu
             else (4 * count, 16, 4096, 64))
  blocks = (16, 16) if on_cpu else (64, 64)
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
  out = jax.jit(lambda a, b, c: attention(a, b, c, mesh, *blocks))(q, k, v)
  ref = reference(q, k, v)
  rel = float(np.linalg.norm(np.asarray(out) - ref) / np.linalg.norm(ref))
  print(f"attention {shape} over mesh {dict(mesh.shape)}: relative error"
        f" {rel:.2e}")
  assert rel < 1e-2, rel
  return rel


if __name__ == "__main__":
  testing.configure_cpu_devices(8)
  main()
