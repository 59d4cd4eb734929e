"""The CPU interpreter per kernel: Triton's loop vs jt_dist's vectorised run.

Each kernel is launched eagerly on one CPU device, with the bounds check on
(the default), two ways that differ only in ``JT_DIST_VECTORIZE``:

- ``stock``: ``=0``, Triton's interpreter running one program instance at a
  time through its native memory module (jt_dist's CPU path before the
  vectorised interpreter);
- ``jt_dist``: the default, all program instances at once where the kernel
  allows (the causal attention's loops, whose bounds depend on the program
  id, in masked lockstep), one at a time otherwise, with loads and stores
  as NumPy gathers and scatters either way.

Each kernel's peak of new memory under jt_dist, as ``tracemalloc`` (which
NumPy reports its arrays to) sees it, is measured in a run of its own;
where jnp computes the same thing, its jitted time is given too.

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
import tracemalloc

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
import causal_attention  # pylint: disable=wrong-import-position,wrong-import-order
import layernorm_training  # pylint: disable=wrong-import-position,wrong-import-order
import matmul  # pylint: disable=wrong-import-position,wrong-import-order
import softmax  # pylint: disable=wrong-import-position,wrong-import-order
from jt_dist import _settings  # pylint: disable=wrong-import-position

_ENV = "JT_DIST_VECTORIZE"


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
  """(name, programs, zero-argument call, jnp's call or None) per kernel."""
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

  ln_ref = layernorm_training.layer_norm_reference
  jnp_ln_bwd = jax.jit(lambda x, w, b, dy: jax.vjp(ln_ref, x, w, b)[1](dy))
  heads, seq, d = (2, 128, 32) if small else (4, 512, 64)
  q, k, v, do = arr(heads, seq, d), arr(heads, seq, d), arr(heads, seq, d), arr(
      heads, seq, d)
  scale = d ** -0.5
  o, lse = causal_attention.attention_forward(q, k, v, scale)
  ref = causal_attention.reference
  jnp_attn = jax.jit(lambda q, k, v: ref(q, k, v, scale))
  jnp_attn_bwd = jax.jit(
      lambda q, k, v, do: jax.vjp(lambda *a: ref(*a, scale), q, k, v)[1](do))
  jnp_softmax, jnp_add = jax.jit(jax.nn.softmax), jax.jit(jnp.add)
  jnp_matmul, jnp_ln = jax.jit(jnp.matmul), jax.jit(ln_ref)
  fwd_programs = (seq // causal_attention.BLOCKS["BLOCK_M"]) * heads
  bwd_programs = (seq // causal_attention.BWD_BLOCKS["BLOCK_N1"]) * heads
  attn = f"{heads}x{seq}x{d}"
  return [
      (f"add {n}", n // 1024, lambda: add.add(x, y, block=1024),
       lambda: jnp_add(x, y)),
      (f"softmax {rows}x{cols}", rows, lambda: softmax.softmax(s),
       lambda: jnp_softmax(s)),
      # The autotuner's first config on the CPU: 16x16x16 blocks.
      (f"matmul {mm}^3", (mm // 16) ** 2, lambda: matmul.matmul(a, b),
       lambda: jnp_matmul(a, b)),
      (f"layer norm forward {ln_rows}x{ln_d}", ln_rows, ln_fwd,
       lambda: jnp_ln(lx, lw, lb)),
      (f"layer norm backward {ln_rows}x{ln_d}", ln_rows, ln_bwd,
       lambda: jnp_ln_bwd(lx, lw, lb, ldy)),
      (f"causal attention forward {attn}", fwd_programs,
       lambda: causal_attention.attention_forward(q, k, v, scale),
       lambda: jnp_attn(q, k, v)),
      (f"causal attention backward {attn}", bwd_programs,
       lambda: causal_attention.attention_backward(q, k, v, scale, o, lse, do),
       lambda: jnp_attn_bwd(q, k, v, do)),
  ]


def _peak_bytes(call) -> int:
  """The peak of memory ``call`` allocates, as ``tracemalloc`` sees it."""
  tracemalloc.start()
  try:
    jax.block_until_ready(call())
    return tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


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
  print(f"{'kernel':44} {'programs':>8} {'stock':>10} {'jt_dist':>10}"
        f" {'x':>6} {'jnp':>9} {'peak MiB':>9}")
  for name, programs, call, jnp_call in _kernel_cases(args.small, rng):
    if args.only not in name:
      continue
    _with_env("1", _seconds, call, 1)  # Compile and decide outside timing.
    stock = _with_env("0", _seconds, call, args.stock_repeats)
    ours = _with_env("1", _seconds, call, args.repeats)
    case = {"programs": programs, "stock_s": stock, "jt_dist_s": ours,
            "speedup": stock / ours,
            "jt_dist_peak_bytes": _with_env("1", _peak_bytes, call)}
    if jnp_call is not None:
      _seconds(jnp_call, 1)
      case["jnp_s"] = _seconds(jnp_call, args.repeats * 4)
    results["kernels"][name] = case
    print(f"{name:44} {programs:8d} {stock * 1e3:8.1f}ms {ours * 1e3:8.1f}ms"
          f" {stock / ours:6.1f} {case.get('jnp_s', 0) * 1e3:7.2f}ms"
          f" {case['jt_dist_peak_bytes'] / 2**20:9.1f}")
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
