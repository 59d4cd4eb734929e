"""jt_dist in one process per GPU, joined by jax.distributed.

Starts ``tests_multigpu/multiprocess_worker.py`` once per GPU (each process
sees only its own GPU), as one global mesh: the sharded add, the K-split
matmul with its cross-process sum, the layer-norm training example, an
autotuned kernel whose four equally fast configs write their own tag (every
shard must show process 0's choice), and the placement errors. Then starts
the processes again on the same caches: process 0 must load its choice from
disk and time nothing. Last, eight autotuned calls (four equally fast
configs each) run once with jt_dist's one choice and once with jaxlib's
per-process tuning (``JT_DIST_AUTOTUNE=jaxlib``): the table counts the calls
whose shards ran different configs. Writes JSON and prints a table; exits 1
on any failed check.

    python benchmarks/multiprocess_gpu.py --out $OUT/multiprocess_gpu.json
    python benchmarks/multiprocess_gpu.py --processes 2
    python benchmarks/multiprocess_gpu.py --cpu   # 2 x 4 CPU devices, any host
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jt_dist import testing  # pylint: disable=g-import-not-at-top,wrong-import-position

WORKER = os.path.join(ROOT, "tests_multigpu", "multiprocess_worker.py")
TAGS = (1, 2, 3, 4)


def _gpu_count() -> int:
  out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                       check=False)
  return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def _run(args, env, processes, gpus, *extra):
  start = time.perf_counter()
  outputs = testing.run_processes(
      [sys.executable, WORKER, *extra], num_processes=processes,
      cpu_devices_per_process=4, gpus_per_process=gpus, timeout_s=args.timeout,
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


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--processes", type=int, default=None,
                      help="default: one per GPU")
  parser.add_argument("--cpu", action="store_true",
                      help="2 processes x 4 CPU devices instead of GPUs")
  parser.add_argument("--timeout", type=float, default=600)
  args = parser.parse_args()
  gpus = None if args.cpu else 1
  processes = args.processes or (2 if args.cpu else _gpu_count())
  if processes < 2:
    raise SystemExit(f"needs >= 2 processes; found {processes} GPUs")
  shards = processes * (4 if args.cpu else 1)
  with tempfile.TemporaryDirectory() as cache_root:
    env = dict(os.environ, JT_DIST_TEST_CACHE_ROOT=cache_root,
               JT_DIST_TEST_SEED=str(int.from_bytes(os.urandom(4), "little")))
    env.pop("JT_DIST_AUTOTUNE_PIN", None)
    if args.cpu:
      env["JT_DIST_AUTOTUNE_CPU"] = "time"
    first, first_s = _run(args, env, processes, gpus)
    second, second_s = _run(args, env, processes, gpus, "autotune")
    eight = {}
    for mode in ("choose", "jaxlib"):
      with tempfile.TemporaryDirectory() as fresh:
        mode_env = dict(env, JT_DIST_AUTOTUNE=mode,
                        JT_DIST_TEST_CACHE_ROOT=fresh)
        eight[mode] = _run(args, mode_env, processes, gpus, "eight")[0][0][
            "eight_calls"]
  problems = _check(first, second, shards, not args.cpu)
  if eight["choose"]["disagreeing"]:
    problems.append(f"one choice, yet shards disagree: {eight['choose']}")
  print(f"\n{processes} processes, {shards} shards; all cases {first_s:.1f} s,"
        f" the second (autotune only) run {second_s:.1f} s\n")
  print("| process | case | result |\n| --- | --- | --- |")
  for p, cases in enumerate(first):
    for name, case in cases.items():
      shown = {k: v for k, v in case.items() if k not in ("case", "process")}
      print(f"| {p} | {name} | {json.dumps(shown)[:300]} |")
  for p, cases in enumerate(second):
    case = cases.get("autotune_chosen_by_process_0", {})
    print(f"| {p} | second run: autotune | source {case.get('source')},"
          f" tags {case.get('tags')} |")
  for mode, case in eight.items():
    print(f"| 0 | eight autotuned calls, JT_DIST_AUTOTUNE={mode} |"
          f" {case['disagreeing']} of 8 calls ran different configs on"
          f" different shards; tags per call {case['tags']} |")
  print("\nchecks:", "all passed" if not problems else "\n  ".join(
      ["FAILED"] + problems))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"processes": processes, "shards": shards,
                 "first_run_s": first_s, "second_run_s": second_s,
                 "first": first, "second": second, "eight_calls": eight,
                 "problems": problems},
                f, indent=1)
  sys.exit(1 if problems else 0)


if __name__ == "__main__":
  main()
