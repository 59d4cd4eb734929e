"""One autotuning choice per kernel: what it costs and what it gets.

1. First call of an autotuned bf16 matmul (4 configs), each in a fresh
   process with an empty cache, then in a second process on that cache:
   * jt_dist (default): times the configs at lowering on one device and
     saves the choice; the second process loads it and times nothing;
   * jt_dist with ``JT_DIST_AUTOTUNE=jaxlib``: jaxlib times the configs on
     the first run, in every process;
   * jax-triton, when it can be imported (jaxlib's autotuning too).
2. Steady state: the config jt_dist chose, called through the autotuned
   kernel, against every config called alone; the fastest alone is the
   best a choice could do. Times are interleaved, chained launches.

    python benchmarks/autotune_choice.py --out benchmarks/results/h200x1/autotune_choice.json
    python benchmarks/autotune_choice.py --smoke   # tiny sizes, any host
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import timing  # pylint: disable=g-import-not-at-top,wrong-import-position

_STAGES = ("lower_s", "xla_compile_s", "first_execute_s")


def _first_call(lib, size, env):
  out = subprocess.run(
      [sys.executable, os.path.join(HERE, "first_call.py"), "--lib", lib,
       "--kernel", "matmul_autotuned", "--size", str(size)],
      capture_output=True, text=True, env=env, timeout=900, check=False)
  for line in reversed(out.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise RuntimeError(f"first_call.py failed:\n{out.stdout}\n{out.stderr}")


def _has_jax_triton() -> bool:
  code = "import jax_triton"
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        check=False).returncode == 0


def bench_first_call(size):
  """Cold and second-process first calls for each way of autotuning."""
  ways = [("jt_dist (one choice)", "jt_dist", {}),
          ("jt_dist, JT_DIST_AUTOTUNE=jaxlib", "jt_dist",
           {"JT_DIST_AUTOTUNE": "jaxlib"})]
  if _has_jax_triton():
    ways.append(("jax-triton", "jax_triton", {}))
  rows = []
  for label, lib, extra in ways:
    with tempfile.TemporaryDirectory() as cache:
      env = dict(os.environ, JT_DIST_CACHE_DIR=cache,
                 TRITON_CACHE_DIR=os.path.join(cache, "triton"), **extra)
      env["PYTHONPATH"] = os.pathsep.join(
          [os.path.dirname(HERE), env.get("PYTHONPATH", "")])
      cold = _first_call(lib, size, env)
      second = _first_call(lib, size, env)
    rows.append({
        "case": f"first_call_matmul_autotuned_{size}", "impl": label,
        "cold_s": cold["first_call_s"], "second_s": second["first_call_s"],
        **{f"{s}_cold": cold[s] for s in _STAGES},
        **{f"{s}_second": second[s] for s in _STAGES},
        "choice_cold": cold.get("autotune"),
        "choice_second": second.get("autotune"),
    })
  return rows


def bench_steady_state(size, iters, rounds):
  """The chosen config against every config alone, interleaved."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import kernels  # pylint: disable=g-import-not-at-top
  import jt_dist  # pylint: disable=g-import-not-at-top

  # An empty cache: the choice is timed here, not loaded from an old run.
  jt_dist.configure_cache(cache_dir=tempfile.mkdtemp(prefix="jt_dist_bench_"))
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
  b = jax.random.normal(key_b, (size, size), jnp.bfloat16)
  expected = kernels.xla_matmul(a, b)
  calls = {"chosen (autotuned call)": (jax.jit(
      lambda p, q: kernels.matmul(jt_dist.triton_call, p, q,
                                  autotuned=True)), (a, b))}
  m = n = size
  for i, config in enumerate(kernels.matmul_autotuned.configs):
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    calls[f"config {i} alone"] = (jax.jit(
        lambda p, q, c=config, o=options: jt_dist.triton_call(
            p, q, m, n, size, kernel=kernels.matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), p.dtype),
            grid=kernels._matmul_grid(m, n), **o, **c.kwargs)),  # pylint: disable=protected-access
                                  (a, b))
  for name, (fn, args) in calls.items():
    error = timing.relative_error(
        jnp.asarray(fn(*args), jnp.float32), jnp.asarray(expected, jnp.float32))
    assert error < 2e-2, (name, error)
  seconds = timing.interleaved_chained_each(calls, iters=iters, rounds=rounds)
  (choice,) = jt_dist.autotune_choices(kernels.matmul_autotuned)
  alone = {k: v for k, v in seconds.items() if k.endswith("alone")}
  fastest = min(alone, key=alone.get)
  flops = 2 * size ** 3
  rows = [{"case": f"steady_matmul_{size}_bf16", "impl": name,
           "ms": s * 1e3, "TFLOPs": flops / s / 1e12}
          for name, s in seconds.items()]
  rows.append({
      "case": f"steady_matmul_{size}_bf16", "impl": "summary",
      "chosen_index": choice.index, "chosen_config": choice.config,
      "choice_source": choice.source, "fastest_alone": fastest,
      "chosen_over_fastest_alone":
          seconds["chosen (autotuned call)"] / alone[fastest],
      "timings_at_choice_ms": {k: (v or 0) * 1e3
                               for k, v in (choice.timings_s or {}).items()},
      "device_kind": jax.devices()[0].device_kind,
  })
  return rows


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes, to check the script on any host")
  parser.add_argument("--size", type=int, default=None)
  args = parser.parse_args()
  size = args.size or (64 if args.smoke else 4096)
  rows = bench_first_call(size)
  rows += bench_steady_state(size, iters=2 if args.smoke else 20,
                             rounds=2 if args.smoke else 15)
  timing.print_table(rows)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"environment": timing.environment(), "results": rows}, f,
                indent=1)


if __name__ == "__main__":
  main()
