"""Every jt_dist benchmark in one process: JSON results and a printed table.

Side by side, in one run, on whatever GPUs are present: jt_dist, jax-triton
(when importable) and XLA's own ops.

    python benchmarks/run.py --out benchmarks/results/h200x2/run.json
    python benchmarks/run.py --smoke     # tiny sizes, any host, checks only

Cases: dispatch overhead (and its profile by lowering choice, in
dispatch_profile.py), kernel time (add, matmul one config and
autotuned), first-call compile latency (cold process, disk-cached process),
1 -> 2 GPU scaling, and the plain-jit-with-sharded-inputs case.
"""

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

import dispatch_profile  # pylint: disable=g-import-not-at-top
import jt_dist  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import multi_gpu  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

try:
  import jax_triton  # pylint: disable=g-import-not-at-top
except Exception as e:  # pylint: disable=broad-except
  jax_triton = None
  JAX_TRITON_ERROR = f"{type(e).__name__}: {e}"
else:
  JAX_TRITON_ERROR = None

HERE = os.path.dirname(os.path.abspath(__file__))


def _libs():
  libs = {"jt_dist": jt_dist.triton_call}
  if jax_triton is not None:
    libs["jax_triton"] = jax_triton.triton_call
  return libs


def _record(results, case, impl, **fields):
  row = {"case": case, "impl": impl, **fields}
  results.append(row)
  shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in fields.items())
  print(f"  {case:<28} {impl:<22} {shown}", flush=True)


def bench_dispatch(results, sizes):
  """A tiny jitted add, call + sync, microseconds per call."""
  key = jax.random.key(1)
  x = jax.random.normal(key, (1024,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (1024,), jnp.float32)
  fns = {name: jax.jit(lambda a, b, c=call: kernels.add(c, a, b))
         for name, call in _libs().items()}
  legacy = functools.partial(jt_dist.triton_call,
                             custom_call_target_name="triton_kernel_call")
  fns["jt_dist_legacy_target"] = jax.jit(
      lambda a, b: kernels.add(legacy, a, b))
  fns["xla"] = jax.jit(lambda a, b: a + b)
  for fn in fns.values():
    np.testing.assert_allclose(np.asarray(fn(x, y)), np.asarray(x + y))
  seconds = timing.per_call_seconds(fns, (x, y), calls=sizes["calls"])
  for name, value in seconds.items():
    _record(results, "dispatch_add_1024", name, us_per_call=value * 1e6)


def bench_placement(results, sizes):
  """The device-validation layer's eager check, alone: µs per call."""
  from jt_dist._sharding import placement as _placement  # pylint: disable=g-import-not-at-top
  device = jax.devices()[-1]
  arrays = [jax.device_put(jnp.ones((1024,)), device) for _ in range(3)]
  args = arrays + [1024, 0.5]
  calls = 20 * sizes["calls"]
  start = time.perf_counter()
  for _ in range(calls):
    _placement.check_concrete(args, "bench")
  seconds = (time.perf_counter() - start) / calls
  _record(results, "placement_check_3_arrays", "jt_dist",
          us_per_call=seconds * 1e6)


def bench_add(results, sizes):
  """A large fp32 add against XLA's add and an elementwise copy."""
  n = sizes["add_elements"]
  key = jax.random.key(2)
  x = jax.random.normal(key, (n,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (n,), jnp.float32)
  expected = np.asarray(x + y)
  gib = n * 4 / 2**30
  copy = jax.jit(lambda a: a + 1.0)
  copy_s = timing.chained_seconds(copy, (x,), iters=sizes["iters"])
  copy_gbs = 2 * n * 4 / copy_s / 1e9
  _record(results, f"copy_{gib:g}GiB_fp32", "xla", ms=copy_s * 1e3,
          GBps=copy_gbs)
  fns = {name: jax.jit(lambda a, b, c=call: kernels.add(c, a, b))
         for name, call in _libs().items()}
  fns["xla"] = jax.jit(lambda a, b: a + b)
  for name, fn in fns.items():
    np.testing.assert_array_equal(np.asarray(fn(x, y)), expected)
    seconds = timing.chained_seconds(fn, (x, y), iters=sizes["iters"])
    gbs = 3 * n * 4 / seconds / 1e9
    _record(results, f"add_{gib:g}GiB_fp32", name, ms=seconds * 1e3,
            GBps=gbs, pct_of_copy=100 * gbs / copy_gbs)


def bench_matmul(results, sizes):
  """bf16 matmul, one config and autotuned, against XLA's dot."""
  n = sizes["matmul"]
  key = jax.random.key(3)
  a = jax.random.normal(key, (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.fold_in(key, 1), (n, n), jnp.bfloat16)
  reference = np.asarray(a, np.float64) @ np.asarray(b, np.float64) if (
      n <= 2048) else np.asarray(kernels.xla_matmul(a, b), np.float64)
  flops = 2 * n**3
  xla = jax.jit(kernels.xla_matmul)
  xla_s = timing.chained_seconds(xla, (a, b), iters=sizes["iters"])
  _record(results, f"matmul_{n}_bf16", "xla", ms=xla_s * 1e3,
          TFLOPs=flops / xla_s / 1e12)
  for name, call in _libs().items():
    for tuned in (False, True):
      fn = jax.jit(lambda p, q, c=call, t=tuned: kernels.matmul(
          c, p, q, autotuned=t))
      error = timing.relative_error(fn(a, b), reference)
      assert error < 2e-2, (name, tuned, error)
      seconds = timing.chained_seconds(fn, (a, b), iters=sizes["iters"])
      label = f"matmul_{n}_bf16" + ("_autotuned" if tuned else "")
      _record(results, label, name, ms=seconds * 1e3,
              TFLOPs=flops / seconds / 1e12, pct_of_xla=100 * xla_s / seconds,
              rel_error=error)


def _first_call(lib, kernel, size, env):
  out = subprocess.run(
      [sys.executable, os.path.join(HERE, "first_call.py"), "--lib", lib,
       "--kernel", kernel, "--size", str(size)],
      capture_output=True, text=True, env=env, timeout=600, check=False)
  for line in reversed(out.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise RuntimeError(f"first_call.py failed:\n{out.stdout}\n{out.stderr}")


_STAGES = ("lower_s", "xla_compile_s", "first_execute_s")


def bench_compile(results, sizes):
  """First-call latency: a cold process, then a second one (disk cache)."""
  libs = ["jt_dist"] + (["jax_triton"] if jax_triton is not None else [])
  with tempfile.TemporaryDirectory() as cache_dir:
    env = dict(os.environ, JT_DIST_CACHE_DIR=cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    for kernel in ("add", "matmul", "matmul_autotuned"):
      for lib in libs:
        cold = _first_call(lib, kernel, sizes["compile_matmul"], env)
        warm = _first_call(lib, kernel, sizes["compile_matmul"], env)
        _record(results, f"first_call_{kernel}", lib,
                cold_s=cold["first_call_s"], second_process_s=warm["first_call_s"],
                second_over_cold=warm["first_call_s"] / cold["first_call_s"],
                **{f"{stage}_cold": cold[stage] for stage in _STAGES},
                **{f"{stage}_second": warm[stage] for stage in _STAGES})


def _environment():
  info = {
      "python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else "",
      "triton": __import__("triton").__version__,
      "jax_triton": getattr(jax_triton, "__version__", None) if jax_triton
      else JAX_TRITON_ERROR,
      "devices": [str(d) for d in jax.devices()],
      "device_kind": jax.devices()[0].device_kind,
  }
  return info


SIZES = {
    "full": dict(calls=2000, chain_iters=500, add_elements=1 << 28, iters=20, matmul=8192,
                 compile_matmul=4096, scale_add=1 << 28, scale_matmul=8192,
                 attention=(8, 16, 4096, 64)),
    "smoke": dict(calls=20, chain_iters=5, add_elements=1 << 12, iters=2, matmul=64,
                  compile_matmul=64, scale_add=1 << 12, scale_matmul=64,
                  attention=(2, 2, 32, 16)),
}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--cases",
                      default="dispatch,profile,placement,add,matmul,compile,"
                      "multi")
  args = parser.parse_args()
  sizes = SIZES["smoke" if args.smoke else "full"]
  results = []
  print(f"environment: {_environment()}", flush=True)
  cases = {"dispatch": bench_dispatch, "placement": bench_placement,
           "add": bench_add, "matmul": bench_matmul,
           "compile": bench_compile,
           "profile": lambda r, s: dispatch_profile.bench_dispatch_profile(
               r, s, _libs(), _record),
           "multi": lambda r, s: multi_gpu.bench_multi(r, s, _libs(), _record)}
  for name in args.cases.split(","):
    print(f"[{name}]", flush=True)
    try:
      cases[name](results, sizes)
    except Exception as e:  # pylint: disable=broad-except
      # One failing case must not lose the others' numbers.
      _record(results, name, "FAILED", error=f"{type(e).__name__}: {e}"[:500])
  timing.print_table(results)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"environment": _environment(), "results": results}, f,
                indent=1)


if __name__ == "__main__":
  main()
