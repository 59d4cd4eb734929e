"""Autotuning: what one choice per kernel costs and gets, in one process or many.

``autotune_choice``: first calls, each in a fresh process (``python
benchmarks/autotune.py LIB KERNEL SIZE`` prints one JSON line) on an empty
cache and then in a second process on that cache, split into lowering,
XLA's compile and the first execution, for jt_dist, jt_dist with
``JT_DIST_AUTOTUNE=jaxlib`` and jax-triton; then the config jt_dist chose
against every config alone, in steady state.

``multiprocess``: ``tests_multigpu/multiprocess_worker.py`` in one process
per GPU (2 processes of 4 CPU devices on a CPU host), twice on the same
caches, then eight autotuned calls of four equally fast configs under
jt_dist's one choice and under jaxlib's per-process tuning, counting the
calls whose shards ran different configs. A failed check fails the suite.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from jt_dist import testing
import timing

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(timing.ROOT, "tests_multigpu", "multiprocess_worker.py")
TAGS = (1, 2, 3, 4)
_STAGES = ("lower_s", "xla_compile_s", "first_execute_s")


def _first_call(lib, kernel, size, env):
  out = subprocess.run([sys.executable, os.path.abspath(__file__), lib,
                        kernel, str(size)], capture_output=True, text=True,
                       env=env, timeout=900, check=False)
  for line in reversed(out.stdout.splitlines()):
    if line.startswith("{"):
      return json.loads(line)
  raise RuntimeError(f"first call failed:\n{out.stdout}\n{out.stderr}")


def _has_jax_triton():
  import jax  # pylint: disable=g-import-not-at-top
  return jax.devices()[0].platform == "gpu" and subprocess.run(
      [sys.executable, "-c", "import jax_triton"], capture_output=True,
      check=False).returncode == 0


def first_calls(size):
  """Cold and second-process first calls, per kernel and way of tuning."""
  ways = [("jt_dist", "jt_dist", {}, ("add", "matmul", "matmul_autotuned")),
          ("jt_dist, JT_DIST_AUTOTUNE=jaxlib", "jt_dist",
           {"JT_DIST_AUTOTUNE": "jaxlib"}, ("matmul_autotuned",))]
  if _has_jax_triton():
    ways.append(("jax-triton", "jax_triton", {},
                 ("add", "matmul", "matmul_autotuned")))
  rows = []
  for label, lib, extra, kernel_names in ways:
    for kernel in kernel_names:
      with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, JT_DIST_CACHE_DIR=cache,
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"), **extra)
        env["PYTHONPATH"] = os.pathsep.join(
            [timing.ROOT, HERE, env.get("PYTHONPATH", "")])
        cold = _first_call(lib, kernel, size, env)
        second = _first_call(lib, kernel, size, env)
      rows.append({
          "case": f"first call, {kernel}", "impl": label,
          "cold_s": cold["first_call_s"], "second_s": second["first_call_s"],
          **{f"{s}_cold": cold[s] for s in _STAGES},
          **{f"{s}_second": second[s] for s in _STAGES},
          "choice_cold": str(cold.get("autotune")),
          "choice_second": str(second.get("autotune"))})
  return rows


def steady_state(size, iters, rounds):
  """The chosen config against every config alone, chained, in turns."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import jt_dist  # pylint: disable=g-import-not-at-top
  import kernels  # pylint: disable=g-import-not-at-top

  # An empty cache: the choice is timed here, not loaded from an old run.
  jt_dist.configure_cache(cache_dir=tempfile.mkdtemp(prefix="jt_dist_bench_"))
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
  b = jax.random.normal(key_b, (size, size), jnp.bfloat16)
  expected = kernels.xla_matmul(a, b)
  calls = {"chosen (autotuned call)": (jax.jit(
      lambda p, q: kernels.matmul(jt_dist.triton_call, p, q,
                                  autotuned=True)), (a, b))}
  for i, config in enumerate(kernels.matmul_autotuned.configs):
    calls[f"config {i} alone"] = (jax.jit(
        lambda p, q, c=config: jt_dist.triton_call(
            p, q, size, size, size, kernel=kernels.matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((size, size), p.dtype),
            grid=kernels._matmul_grid(size, size), num_warps=c.num_warps,  # pylint: disable=protected-access
            num_stages=c.num_stages, **c.kwargs)), (a, b))
  for name, (fn, args) in calls.items():
    error = timing.relative_error(jnp.asarray(fn(*args), jnp.float32),
                                  jnp.asarray(expected, jnp.float32))
    assert error < 2e-2, (name, error)
  seconds = timing.chained(calls, iters=iters, rounds=rounds)
  (choice,) = jt_dist.autotune_choices(kernels.matmul_autotuned)
  alone = {k: v for k, v in seconds.items() if k.endswith("alone")}
  fastest = min(alone, key=alone.get)
  case = f"steady state, matmul {size} bf16"
  rows = [{"case": case, "impl": name, "ms": s * 1e3,
           "TFLOPs": 2 * size**3 / s / 1e12} for name, s in seconds.items()]
  rows.append({"case": f"the choice, matmul {size} bf16", "impl": "jt_dist",
               "chosen": f"config {choice.index}", "source": choice.source,
               "fastest_alone": fastest, "chosen_over_fastest_alone":
               seconds["chosen (autotuned call)"] / alone[fastest]})
  return rows


def autotune_choice(quick):
  size = 64 if quick else 4096
  return {"sizes": {"matmul": size},
          "results": first_calls(size) + steady_state(
              size, iters=2 if quick else 20, rounds=2 if quick else 15),
          "plots": [{"case": "first call, matmul_autotuned",
                     "metrics": ["cold_s", "second_s"]}]}


def _gpu_count():
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                         check=False)
  except OSError:
    return 0
  return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def _run(timeout, env, processes, gpus, *extra):
  start = time.perf_counter()
  outputs = testing.run_processes(
      [sys.executable, WORKER, *extra], num_processes=processes,
      cpu_devices_per_process=4, gpus_per_process=gpus, timeout_s=timeout,
      env=env)
  seconds = time.perf_counter() - start
  return [{line["case"]: line for line in o.json_lines()}
          for o in outputs], seconds


def _check(first, second, shards, on_gpu):
  """Every failed expectation, as text."""
  problems = []
  bound = 2e-2 if on_gpu else 1e-5  # tl.dot in TF32 on GPUs.

  def expect(ok, what):
    if not ok:
      problems.append(what)

  for p, cases in enumerate(first):
    expect("done" in cases, f"process {p} did not finish")
    for label in ("jit", "eager"):
      case = cases.get(f"sharded_add_{label}", {})
      expect(case.get("max_error") == 0.0, f"process {p} add {label}: {case}")
    case = cases.get("k_split_matmul", {})
    expect(case.get("rel_error", 1) < bound, f"process {p} K-split: {case}")
    case = cases.get("layernorm_training", {})
    expect(all(e < bound for e in case.get("grad_rel_error", {1: 1}).values())
           and case["losses"][-1] < case["losses"][0],
           f"process {p} layer norm: {case}")
    placement = cases.get("placement_errors", {})
    expect(placement.get("local_ok") and placement["messages"]["device"],
           f"process {p} placement: {placement}")
  chosen = first[0]["autotune_chosen_by_process_0"]
  want = [TAGS[chosen["choice_index"]]] * shards
  for p, cases in enumerate(first):
    case = cases["autotune_chosen_by_process_0"]
    expect(case["tags"] == want, f"process {p} tags {case['tags']} != {want}")
    expect(cases["autotune_pinned_in_process_0"]["tags"] == [3] * shards,
           f"process {p} pinned tags: {cases['autotune_pinned_in_process_0']}")
    expect(p == 0 or case["source"] == "process 0",
           f"process {p} chose by itself: {case}")
  expect(chosen["source"] == "timed" or not on_gpu,
         f"process 0 did not time: {chosen}")
  again = second[0]["autotune_chosen_by_process_0"]
  expect(again["source"] == "disk", f"second run timed again: {again}")
  for p, cases in enumerate(second):
    expect(cases["autotune_chosen_by_process_0"]["tags"] == want,
           f"second run, process {p}: {cases['autotune_chosen_by_process_0']}")
  return problems



def multiprocess(quick):
  """One process per GPU (or 2 x 4 CPU devices), checked; see the doc."""
  on_gpu = _gpu_count() >= 2
  processes, gpus = (_gpu_count(), 1) if on_gpu else (2, None)
  shards = processes * (1 if on_gpu else 4)
  with tempfile.TemporaryDirectory() as cache_root:
    env = dict(os.environ, JT_DIST_TEST_CACHE_ROOT=cache_root,
               JT_DIST_TEST_SEED=str(int.from_bytes(os.urandom(4), "little")))
    env.pop("JT_DIST_AUTOTUNE_PIN", None)
    if not on_gpu:
      env["JT_DIST_AUTOTUNE_CPU"] = "time"
    first, first_s = _run(600, env, processes, gpus)
    second, second_s = _run(600, env, processes, gpus, "autotune")
    eight = {}
    for mode in ("choose", "jaxlib"):
      with tempfile.TemporaryDirectory() as fresh:
        mode_env = dict(env, JT_DIST_AUTOTUNE=mode,
                        JT_DIST_TEST_CACHE_ROOT=fresh)
        eight[mode] = _run(600, mode_env, processes, gpus, "eight")[0][0][
            "eight_calls"]
  problems = _check(first, second, shards, on_gpu)
  if eight["choose"]["disagreeing"]:
    problems.append(f"one choice, yet shards disagree: {eight['choose']}")
  rows = [{"case": "all cases", "impl": f"{processes} processes",
           "shards": shards, "first_run_s": first_s,
           "second_run_s": second_s, "problems": len(problems)}]
  rows += [{"case": "eight autotuned calls", "impl": f"JT_DIST_AUTOTUNE={m}",
            "calls_with_disagreeing_shards": c["disagreeing"]}
           for m, c in eight.items()]
  return {"results": rows, "notes": problems, "failed": bool(problems)}


SUITES = {"autotune_choice": autotune_choice, "multiprocess": multiprocess}


def first_call_main(lib, kernel, size):
  """Times the first call of one kernel in this fresh process; prints JSON."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import kernels  # pylint: disable=g-import-not-at-top
  if lib == "jt_dist":
    import jt_dist as module  # pylint: disable=g-import-not-at-top
  else:
    import jax_triton as module  # pylint: disable=g-import-not-at-top
  key_a, key_b = jax.random.split(jax.random.key(int(time.time())))
  if kernel == "add":
    n = 1 << (24 if size > 64 else 12)
    inputs = (jax.random.normal(key_a, (n,), jnp.float32),
              jax.random.normal(key_b, (n,), jnp.float32))
    fn = jax.jit(lambda a, b: kernels.add(module.triton_call, a, b))
  else:
    inputs = (jax.random.normal(key_a, (size, size), jnp.bfloat16),
              jax.random.normal(key_b, (size, size), jnp.bfloat16))
    tuned = kernel == "matmul_autotuned"
    fn = jax.jit(lambda p, q: kernels.matmul(module.triton_call, p, q,
                                             autotuned=tuned))
  timing.block(inputs)
  # Trace + lower (where Triton compiles, or the disk cache answers), XLA's
  # compile, and the first execution (jaxlib loads the kernels and, if it
  # autotunes, times them).
  start = time.perf_counter()
  lowered = fn.trace(*inputs).lower()
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  compiled_at = time.perf_counter()
  out = timing.block(compiled(*inputs))
  first = time.perf_counter() - start
  # Checked after the timing, which must not include the reference's compile.
  expected = (inputs[0] + inputs[1] if kernel == "add"
              else kernels.xla_matmul(*inputs))
  error = timing.relative_error(out.astype(jnp.float32),
                                expected.astype(jnp.float32))
  if not error < 1e-2:
    raise SystemExit(f"{lib} {kernel}: relative error {error}")
  # Where each choice came from: "timed" in a cold process, "disk" in a
  # second one; none in jaxlib's mode, which times at run time.
  autotune = ([{"source": c.source, "index": c.index}
               for c in module.autotune_choices()] if lib == "jt_dist" else [])
  print(json.dumps({"first_call_s": first, "autotune": autotune,
                    "lower_s": lowered_at - start,
                    "xla_compile_s": compiled_at - lowered_at,
                    "first_execute_s": time.perf_counter() - compiled_at}))


if __name__ == "__main__":
  sys.path.insert(0, timing.ROOT)
  first_call_main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
