"""The CPU interpreter per kernel: Triton's loop vs jt_dist's vectorised run.

Each kernel is launched eagerly on one CPU device, with the bounds check on
(the default), two ways that differ only in ``JT_DIST_VECTORIZE``:

- ``stock``: ``=0``, Triton's interpreter running one program instance at a
  time through its native memory module (jt_dist's CPU path before the
  vectorised interpreter);
- ``jt_dist``: the default, all program instances at once where the kernel
  allows, one at a time otherwise (the causal attention: its key loop's
  bound depends on the program id), with loads and stores as NumPy
  gathers and scatters either way.

The RMSNorm training step (a 2-layer MLP whose RMSNorm forward and backward
are Triton kernels under ``jax.custom_vjp``) is timed jitted against the
same step with a jnp RMSNorm.

    python benchmarks/cpu_interpreter.py --out benchmarks/results/cpu/cpu_interpreter.json

Writes JSON and prints a table. ``--small`` runs reduced sizes (smoke test).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "examples"))

import jt_dist  # pylint: disable=g-bad-import-order,wrong-import-position

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import triton  # pylint: disable=wrong-import-position
import triton.language as tl  # pylint: disable=wrong-import-position

import add  # pylint: disable=wrong-import-position,wrong-import-order
import layernorm_training  # pylint: disable=wrong-import-position,wrong-import-order
import matmul  # pylint: disable=wrong-import-position,wrong-import-order
import softmax  # pylint: disable=wrong-import-position,wrong-import-order
from jt_dist import _settings  # pylint: disable=wrong-import-position

_ENV = "JT_DIST_VECTORIZE"


@triton.jit
def causal_attention_kernel(q_ptr, k_ptr, v_ptr, seq_len, o_ptr,
                            D: tl.constexpr, BLOCK: tl.constexpr):
  """Causal attention: the key loop stops at the program's own block."""
  pid_m = tl.program_id(0)
  base = tl.program_id(1) * seq_len * D
  rm = pid_m * BLOCK + tl.arange(0, BLOCK)
  rd = tl.arange(0, D)
  q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :])
  m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
  l_i = tl.zeros([BLOCK], dtype=tl.float32)
  acc = tl.zeros([BLOCK, D], dtype=tl.float32)
  for start in range(0, (pid_m + 1) * BLOCK, BLOCK):
    rn = start + tl.arange(0, BLOCK)
    k = tl.load(k_ptr + base + rn[:, None] * D + rd[None, :])
    s = tl.dot(q, tl.trans(k))
    s = tl.where(rm[:, None] >= rn[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + base + rn[:, None] * D + rd[None, :])
    acc = acc * alpha[:, None] + tl.dot(p, v)
    m_i = m_new
  tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], acc / l_i[:, None])


@triton.jit
def rms_fwd_kernel(x_ptr, w_ptr, n_cols, eps, y_ptr, rstd_ptr,
                   BLOCK: tl.constexpr):
  row = tl.program_id(0).to(tl.int64)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
  rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / n_cols + eps)
  w = tl.load(w_ptr + cols, mask=mask)
  tl.store(y_ptr + row * n_cols + cols, x * rstd * w, mask=mask)
  tl.store(rstd_ptr + row, rstd)


@triton.jit
def rms_bwd_kernel(x_ptr, w_ptr, rstd_ptr, dy_ptr, n_cols, dx_ptr, dw_ptr,
                   BLOCK: tl.constexpr):
  row = tl.program_id(0).to(tl.int64)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
  dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0)
  w = tl.load(w_ptr + cols, mask=mask, other=0.0)
  rstd = tl.load(rstd_ptr + row)
  x_hat = x * rstd
  w_dy = w * dy
  c = tl.sum(x_hat * w_dy, 0) / n_cols
  tl.store(dx_ptr + row * n_cols + cols, (w_dy - x_hat * c) * rstd, mask=mask)
  tl.atomic_add(dw_ptr + cols, dy * x_hat, mask=mask)


_EPS = 1e-6


def _rms_forward(x, w):
  rows, d = x.shape
  return jt_dist.triton_call(
      x, w, d, _EPS, kernel=rms_fwd_kernel,
      out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                 jax.ShapeDtypeStruct((rows,), jnp.float32)),
      grid=(rows,), BLOCK=triton.next_power_of_2(d))


@jax.custom_vjp
def triton_rms_norm(x, w):
  return _rms_forward(x, w)[0]


def _rms_fwd(x, w):
  y, rstd = _rms_forward(x, w)
  return y, (x, w, rstd)


def _rms_bwd(residuals, dy):
  x, w, rstd = residuals
  rows, d = x.shape
  dx, dw = jt_dist.triton_call(
      x, w, rstd, dy, d, kernel=rms_bwd_kernel,
      out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                 jax.ShapeDtypeStruct((d,), jnp.float32)),
      grid=(rows,), zeroed_outputs=[1], BLOCK=triton.next_power_of_2(d))
  return dx, dw


triton_rms_norm.defvjp(_rms_fwd, _rms_bwd)


def jnp_rms_norm(x, w):
  rstd = jax.lax.rsqrt(jnp.mean(x * x, axis=1, keepdims=True) + _EPS)
  return x * rstd * w


def _train_step(norm):
  def loss(params, x, y):
    h = jax.nn.relu(x @ params["w1"])
    h = norm(h, params["g"])
    return jnp.mean((h @ params["w2"] - y) ** 2)

  @jax.jit
  def step(params, x, y):
    grads = jax.grad(loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
  return step


def _kernel_cases(small: bool, rng):
  """(name, programs, zero-argument call) per kernel benchmark."""
  def arr(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

  n = 1 << (16 if small else 20)
  rows, cols = (256, 256) if small else (4096, 1024)
  mm = 128 if small else 512
  ln_rows, ln_d = (256, 256) if small else (4096, 1024)
  x, y = arr(n), arr(n)
  s = arr(rows, cols)
  a, b = arr(mm, mm), arr(mm, mm)
  lx, lw, lb, ldy = arr(ln_rows, ln_d), arr(ln_d), arr(ln_d), arr(ln_rows, ln_d)
  f32 = jnp.float32
  ln_block = triton.next_power_of_2(ln_d)

  def ln_fwd():
    return jt_dist.triton_call(
        lx, lw, lb, ln_d, 1e-5, kernel=layernorm_training.ln_fwd_kernel,
        out_shape=(jax.ShapeDtypeStruct((ln_rows, ln_d), f32),
                   jax.ShapeDtypeStruct((ln_rows,), f32),
                   jax.ShapeDtypeStruct((ln_rows,), f32)),
        grid=(ln_rows,), BLOCK_D=ln_block)

  _, mean, rstd = ln_fwd()

  def ln_bwd():
    return jt_dist.triton_call(
        lx, lw, mean, rstd, ldy, ln_d, kernel=layernorm_training.ln_bwd_kernel,
        out_shape=(jax.ShapeDtypeStruct((ln_rows, ln_d), f32),
                   jax.ShapeDtypeStruct((ln_d,), f32),
                   jax.ShapeDtypeStruct((ln_d,), f32)),
        grid=(ln_rows,), zeroed_outputs=[1, 2], BLOCK_D=ln_block)

  heads, seq, d, block = (2, 128, 32, 32) if small else (4, 512, 64, 64)
  q, k, v = arr(heads, seq, d), arr(heads, seq, d), arr(heads, seq, d)

  def attention():
    return jt_dist.triton_call(
        q, k, v, seq, kernel=causal_attention_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, f32),
        grid=(seq // block, heads), D=d, BLOCK=block)

  return [
      (f"add {n}", n // 1024, lambda: add.add(x, y, block=1024)),
      (f"softmax {rows}x{cols}", rows, lambda: softmax.softmax(s)),
      # The autotuner's first config on the CPU: 16x16x16 blocks.
      (f"matmul {mm}^3", (mm // 16) ** 2, lambda: matmul.matmul(a, b)),
      (f"layer norm forward {ln_rows}x{ln_d}", ln_rows, ln_fwd),
      (f"layer norm backward {ln_rows}x{ln_d}", ln_rows, ln_bwd),
      (f"causal attention {heads}x{seq}x{d} (fallback)",
       (seq // block) * heads, attention),
  ]


def _seconds(call, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(call())
    times.append(time.perf_counter() - start)
  return min(times)


def _with_env(value: str, fn, *args):
  previous = os.environ.get(_ENV)
  os.environ[_ENV] = value
  try:
    return fn(*args)
  finally:
    if previous is None:
      os.environ.pop(_ENV)
    else:
      os.environ[_ENV] = previous


def _rms_case(small: bool, rng):
  batch, width, hidden = (64, 64, 64) if small else (256, 256, 512)
  params = {
      "w1": jnp.asarray(rng.standard_normal((width, hidden), np.float32) / 16),
      "g": jnp.ones((hidden,), jnp.float32),
      "w2": jnp.asarray(rng.standard_normal((hidden, width), np.float32) / 16),
  }
  x = jnp.asarray(rng.standard_normal((batch, width), np.float32))
  y = jnp.asarray(rng.standard_normal((batch, width), np.float32))
  return f"RMSNorm MLP training step {batch}x{width}x{hidden}", params, x, y


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", default=os.path.join(
      _ROOT, "benchmarks", "results", "cpu", "cpu_interpreter.json"))
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--stock-repeats", type=int, default=2)
  parser.add_argument("--small", action="store_true")
  parser.add_argument("--only", default="",
                      help="time only the kernels whose name contains this")
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  results = {"host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "jax": jax.__version__, "triton": triton.__version__},
             "bounds_check": _settings.bounds_check(),
             "kernels": {}}
  print(f"{'kernel':44} {'programs':>8} {'stock':>10} {'jt_dist':>10} {'x':>6}")
  for name, programs, call in _kernel_cases(args.small, rng):
    if args.only not in name:
      continue
    _with_env("1", _seconds, call, 1)  # Compile and decide outside timing.
    stock = _with_env("0", _seconds, call, args.stock_repeats)
    ours = _with_env("1", _seconds, call, args.repeats)
    results["kernels"][name] = {"programs": programs, "stock_s": stock,
                                "jt_dist_s": ours, "speedup": stock / ours}
    print(f"{name:44} {programs:8d} {stock * 1e3:8.1f}ms {ours * 1e3:8.1f}ms"
          f" {stock / ours:6.1f}")
  if args.only and args.only not in "RMSNorm":
    _write(results, args.out)
    return
  name, params, x, y = _rms_case(args.small, rng)
  triton_step, jnp_step = _train_step(triton_rms_norm), _train_step(jnp_rms_norm)
  np.testing.assert_allclose(triton_step(params, x, y)["g"],
                             jnp_step(params, x, y)["g"], rtol=1e-4, atol=1e-5)
  timed = {
      "jnp_s": _seconds(lambda: jnp_step(params, x, y), args.repeats * 4),
      "stock_s": _with_env("0", _seconds, lambda: triton_step(params, x, y),
                           args.stock_repeats),
      "jt_dist_s": _with_env("1", _seconds, lambda: triton_step(params, x, y),
                             args.repeats),
  }
  timed["jt_dist_over_jnp"] = timed["jt_dist_s"] / timed["jnp_s"]
  timed["stock_over_jnp"] = timed["stock_s"] / timed["jnp_s"]
  results["rms_norm_training_step"] = {name: timed}
  print(f"{name:44} jnp {timed['jnp_s'] * 1e3:.1f}ms, stock"
        f" {timed['stock_s'] * 1e3:.1f}ms ({timed['stock_over_jnp']:.0f}x jnp),"
        f" jt_dist {timed['jt_dist_s'] * 1e3:.1f}ms"
        f" ({timed['jt_dist_over_jnp']:.1f}x jnp)")
  _write(results, args.out)


def _write(results, out):
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out, "w") as f:
    json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
