"""The CPU suites: the interpreter per kernel, eager calls, the memory check.

Each runs on one CPU device with the bounds check on (the default) unless a
case says otherwise; docs/benchmarks.md ("On the CPU") says what each
times. ``cpu_interpreter`` runs each kernel under Triton's interpreter
(``JT_DIST_VECTORIZE=0``) and under jt_dist's, ``cpu_eager`` an eager
call's first and repeated calls, ``bounds_check_overhead`` the kernels
with ``JT_DIST_BOUNDS_CHECK`` on and off.
"""

import functools
import os
import statistics
import sys
import time
import tracemalloc
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import triton

import jt_dist
import kernels
import timing

sys.path.insert(0, os.path.join(timing.ROOT, "examples"))

import add  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import causal_attention  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import layernorm_training  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import matmul  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import softmax  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order


def _env(name, value):
  return mock.patch.dict(os.environ, {name: value})


def _peak_mib(call):
  tracemalloc.start()
  try:
    jax.block_until_ready(call())
    return tracemalloc.get_traced_memory()[1] / 2**20
  finally:
    tracemalloc.stop()


def _kernel_cases(quick, rng):
  """(name, programs, jt_dist's call, jnp's call) per kernel."""
  def arr(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))

  n = 1 << (12 if quick else 20)
  rows, cols = (16, 64) if quick else (4096, 1024)
  mm = 32 if quick else 512
  x, y, s, a, b = arr(n), arr(n), arr(rows, cols), arr(mm, mm), arr(mm, mm)
  lx, lw, lb, ldy = arr(rows, cols), arr(cols), arr(cols), arr(rows, cols)
  f32 = jax.ShapeDtypeStruct
  block = triton.next_power_of_2(cols)

  def ln_fwd():
    return jt_dist.triton_call(
        lx, lw, lb, cols, 1e-5, kernel=layernorm_training.ln_fwd_kernel,
        out_shape=(f32((rows, cols), jnp.float32),
                   f32((rows,), jnp.float32), f32((rows,), jnp.float32)),
        grid=(rows,), BLOCK_D=block)

  _, mean, rstd = ln_fwd()

  def ln_bwd():
    return jt_dist.triton_call(
        lx, lw, mean, rstd, ldy, cols, kernel=layernorm_training.ln_bwd_kernel,
        out_shape=(f32((rows, cols), jnp.float32),
                   f32((cols,), jnp.float32), f32((cols,), jnp.float32)),
        grid=(rows,), zeroed_outputs=[1, 2], BLOCK_D=block)

  ln_ref = layernorm_training.layer_norm_reference
  heads, seq, d = (1, 64, 16) if quick else (4, 512, 64)
  q, k, v, do = (arr(heads, seq, d) for _ in range(4))
  scale = d ** -0.5
  o, lse = causal_attention.attention_forward(q, k, v, scale)
  ref = lambda *t: causal_attention.reference(*t, scale)
  attn = f"{heads}x{seq}x{d}"
  # Made once: a jitted function made per call would be traced per call.
  jnp_add, jnp_softmax, jnp_matmul, jnp_ln, jnp_ln_bwd, jnp_attn, jnp_bwd = (
      jax.jit(f) for f in (
          jnp.add, jax.nn.softmax, jnp.matmul, ln_ref,
          lambda *t: jax.vjp(ln_ref, *t)[1](ldy), ref,
          lambda *t: jax.vjp(ref, *t)[1](do)))
  return [
      (f"add {n}", n // 1024, lambda: add.add(x, y, block=1024),
       lambda: jnp_add(x, y)),
      (f"softmax {rows}x{cols}", rows, lambda: softmax.softmax(s),
       lambda: jnp_softmax(s)),
      # The autotuner's first config on the CPU: 16x16x16 blocks.
      (f"matmul {mm}^3", (mm // 16) ** 2, lambda: matmul.matmul(a, b),
       lambda: jnp_matmul(a, b)),
      (f"layer norm forward {rows}x{cols}", rows, ln_fwd,
       lambda: jnp_ln(lx, lw, lb)),
      (f"layer norm backward {rows}x{cols}", rows, ln_bwd,
       lambda: jnp_ln_bwd(lx, lw, lb)),
      (f"causal attention forward {attn}",
       seq // causal_attention.BLOCKS["BLOCK_M"] * heads,
       lambda: causal_attention.attention_forward(q, k, v, scale),
       lambda: jnp_attn(q, k, v)),
      (f"causal attention backward {attn}",
       seq // causal_attention.BWD_BLOCKS["BLOCK_N1"] * heads,
       lambda: causal_attention.attention_backward(q, k, v, scale, o, lse, do),
       lambda: jnp_bwd(q, k, v)),
  ]


def _interpreted(name, call, stock_repeats, repeats):
  """Seconds under Triton's interpreter and under jt_dist's."""
  with _env("JT_DIST_VECTORIZE", "1"):
    timing.block(call())  # Compile and decide outside the timing.
  with _env("JT_DIST_VECTORIZE", "0"):
    stock = timing.best(call, stock_repeats)
  with _env("JT_DIST_VECTORIZE", "1"):
    ours = timing.best(call, repeats)
    return {"case": name, "impl": "Triton's interpreter / jt_dist",
            "stock_s": stock, "jt_dist_s": ours, "speedup": stock / ours,
            "jt_dist_peak_MiB": _peak_mib(call)}


def _training_step(norm):
  def loss(params, x, y):
    h = norm(jax.nn.relu(x @ params["w1"]), params["g"], params["b"])
    return jnp.mean((h @ params["w2"] - y) ** 2)

  return jax.jit(lambda params, x, y: jax.tree.map(
      lambda p, g: p - 0.01 * g, params, jax.grad(loss)(params, x, y)))


def _training_step_row(quick, rng, stock_repeats, repeats):
  """A 2-layer MLP's training step with the example's layer norm."""
  batch, width, hidden = (16, 16, 32) if quick else (256, 256, 512)
  normal = lambda *shape: rng.standard_normal(shape, np.float32)
  params = jax.tree.map(jnp.asarray, {
      "w1": normal(width, hidden) / 16, "g": np.ones((hidden,), np.float32),
      "b": np.zeros((hidden,), np.float32), "w2": normal(hidden, width) / 16})
  x, y = jnp.asarray(normal(batch, width)), jnp.asarray(normal(batch, width))
  mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1],
                       axis_types=(jax.sharding.AxisType.Auto,))
  ours = _training_step(lambda *a: layernorm_training.layer_norm(*a, mesh))
  theirs = _training_step(layernorm_training.layer_norm_reference)
  np.testing.assert_allclose(ours(params, x, y)["g"], theirs(params, x, y)["g"],
                             rtol=1e-4, atol=1e-5)
  row = _interpreted(f"layer-norm MLP training step {batch}x{width}x{hidden}",
                     lambda: ours(params, x, y), stock_repeats, repeats)
  del row["jt_dist_peak_MiB"]
  row["jnp_s"] = timing.best(lambda: theirs(params, x, y), repeats * 4)
  row["jt_dist_over_jnp"] = row["jt_dist_s"] / row["jnp_s"]
  return row


def cpu_interpreter(quick):
  rng = np.random.default_rng(0)
  stock_repeats, repeats = (1, 1) if quick else (2, 5)
  rows = []
  for name, programs, call, jnp_call in _kernel_cases(quick, rng):
    row = _interpreted(name, call, stock_repeats, repeats)
    timing.block(jnp_call())
    row.update(programs=programs, jnp_s=timing.best(jnp_call, repeats * 4))
    row["jt_dist_over_jnp"] = row["jt_dist_s"] / row["jnp_s"]
    rows.append(row)
  rows.append(_training_step_row(quick, rng, stock_repeats, repeats))
  for row in rows:
    row["case"], row["impl"] = "one eager launch per kernel", row["case"]
  return {"sizes": {"quick": quick}, "results": rows, "plots": [
      {"case": "one eager launch per kernel",
       "metrics": ["stock_s", "jt_dist_s", "jnp_s"], "log": True}]}


def _arrays(rng, n):
  return tuple(jnp.asarray(rng.standard_normal(n).astype(np.float32))
               for _ in range(2))


def _launches(rng, rounds):
  """One launch of a 16-float scale on one program, and on four, µs."""
  x = jnp.asarray(rng.standard_normal(16).astype(np.float32))
  launches = {f"{p} program(s)": (lambda p=p: jt_dist.triton_call(
      x, 0.5, kernel=kernels.scale_kernel, out_shape=x, grid=(p,),
      n_elements=16, BLOCK_SIZE=16 // p), ()) for p in (1, 4)}
  seconds = timing.chained(launches, iters=5, rounds=rounds)
  return [{"case": "one launch of a tiny kernel", "impl": name,
           "us": s * 1e6} for name, s in seconds.items()]


def cpu_eager(quick):
  """First calls on fresh lengths; repeated calls on one length each."""
  rounds, hot_calls = (2, 2) if quick else (40, 5)
  rng = np.random.default_rng(int(time.time()))
  add16 = functools.partial(kernels.add, jt_dist.triton_call, block=16)
  hot = {"jt_dist triton_call": (add16, _arrays(rng, 64)),
         "XLA jnp.add": (jnp.add, _arrays(rng, 62))}
  x63 = _arrays(rng, 63)
  hot["jt_dist kernel_call held"] = (jt_dist.kernel_call(
      kernels.add_kernel, out_shape=x63[0], grid=(4,), n_elements=63,
      BLOCK=16), x63)
  for name, (fn, args) in hot.items():
    np.testing.assert_allclose(np.asarray(fn(*args)), np.add(*args),
                               rtol=1e-6, err_msg=name)
  first = {"jt_dist triton_call": [], "XLA jnp.add": []}
  repeated = {name: [] for name in hot}
  for r in range(rounds):
    for k, name in enumerate(first):
      # A length neither has seen: a new signature for each.
      args = _arrays(rng, 100 + 3 * (r * len(first) + k))
      timing.block(args)
      first[name].append(timing.once(lambda: hot[name][0](*args)))  # pylint: disable=cell-var-from-loop
    for name, (fn, args) in hot.items():
      repeated[name] += [timing.once(lambda: fn(*args))  # pylint: disable=cell-var-from-loop
                       for _ in range(hot_calls)]
  rows = [{"case": "first eager call of a new signature", "impl": name,
           "ms": statistics.median(t) * 1e3, "samples": len(t)}
          for name, t in first.items()]
  rows += [{"case": "repeated eager call (one call and a sync)", "impl": name,
            "us": statistics.median(t) * 1e6, "samples": len(t)}
           for name, t in repeated.items()]
  rows += _launches(rng, rounds * 5)
  return {"sizes": {"rounds": rounds, "hot_calls": hot_calls},
          "results": rows}


def bounds_check_overhead(quick):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(10_000, dtype=np.float32))
  a = jnp.asarray(rng.standard_normal((48, 32), dtype=np.float32))
  b = jnp.asarray(rng.standard_normal((32, 40), dtype=np.float32))
  s = jnp.asarray(rng.standard_normal((16, 100), dtype=np.float32))
  calls = {"add 10k (40 programs)": lambda: add.add(x, x, block=256),
           "matmul 48x32x40 (9 programs)": lambda: matmul.matmul(a, b),
           "softmax 16x100 (16 programs)": lambda: softmax.softmax(s)}
  repeats = 2 if quick else 15
  rows = []
  for name, call in calls.items():
    timing.block(call())
    on, off = [], []
    for _ in range(1 if quick else 3):
      for check, times in (("1", on), ("0", off)):
        with _env("JT_DIST_BOUNDS_CHECK", check):
          times.append(statistics.median(
              timing.once(call) for _ in range(repeats)))
    rows.append({"case": "eager calls", "impl": name, "on_ms": min(on) * 1e3,
                 "off_ms": min(off) * 1e3, "on_over_off": min(on) / min(off)})
  return {"sizes": {"repeats": repeats}, "results": rows, "plots": [
      {"case": "eager calls", "metrics": ["on_ms", "off_ms"]}]}


SUITES = {"cpu_interpreter": cpu_interpreter, "cpu_eager": cpu_eager,
          "bounds_check_overhead": bounds_check_overhead}
