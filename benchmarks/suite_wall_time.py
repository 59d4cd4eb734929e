"""The test suites' wall time: ``pytest tests tests_multigpu``, whole.

Runs the suites of a source tree (this one, or another commit's, exported
with ``git archive``) in a fresh process with an empty jt_dist cache, and
records per run the wall time, the CPU time of the pytest process and all
its children, the load average before and after (on a shared host, others'
work slows a run down), and pytest's counts. A run overwrites ``--out``
with its one row; with ``--merge`` it keeps the file's other rows instead
(replacing the row of the same label), to compare several trees or
commands in one file outside ``benchmarks/results/``.

    python benchmarks/suite_wall_time.py --label "this tree" --runs 3 \\
        --out benchmarks/results/cpu/suite_wall_time.json
    git archive REV | tar -x -C /tmp/other_tree
    python benchmarks/suite_wall_time.py --tree /tmp/other_tree \\
        --commit REV --label "REV" --merge --out /tmp/suite_wall_time.json

Arguments after ``--`` are passed to pytest (e.g. ``-- -n 0``).

``--tests-of OTHER_TREE`` runs, in this tree, only the tests that OTHER_TREE
also has (the same node ids): the same tests, timed on this tree's code,
apart from the tests added since:

    python benchmarks/suite_wall_time.py --tests-of /tmp/other_tree \
        --label "this tree, REV's tests only" --merge \
        --out /tmp/suite_wall_time.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OPTIONS = ["-q", "-p", "no:cacheprovider"]
_COMMAND = ["-m", "pytest", "tests", "tests_multigpu", *_OPTIONS]


def _pytest(targets: list[str]) -> list[str]:
  """``_COMMAND`` with other targets than the two suites."""
  return ["-m", "pytest", *targets, *_OPTIONS]


def _counts(output: str) -> dict[str, int]:
  """pytest's final counts ("1209 passed, 45 skipped, ..."), by outcome."""
  summary = [line for line in output.splitlines()
             if re.search(r"\d+ (passed|failed|error)", line)]
  if not summary:
    return {}
  return {outcome: int(n) for n, outcome in re.findall(
      r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)",
      summary[-1])}


def _children_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _env(tree: str, cache: str) -> dict[str, str]:
  env = dict(os.environ, JT_DIST_CACHE_DIR=cache,
             PYTHONPATH=os.pathsep.join(
                 p for p in (tree, os.environ.get("PYTHONPATH")) if p))
  env.pop("JT_DIST_CPU_DEVICES", None)
  return env


def collected(tree: str) -> list[str]:
  """The node ids of ``pytest tests tests_multigpu`` in ``tree``."""
  with tempfile.TemporaryDirectory() as cache:
    done = subprocess.run(
        [sys.executable, *_COMMAND, "--collect-only", "-n", "0"], cwd=tree,
        env=_env(tree, cache), capture_output=True, text=True, check=False)
  ids = [line for line in done.stdout.splitlines() if "::" in line]
  if done.returncode != 0 or not ids:
    raise SystemExit(f"collecting the tests of {tree} failed:\n"
                     f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
  return ids


def shared_tests(tree: str, other: str) -> list[str]:
  """``tree``'s tests that ``other`` has too, in ``tree``'s order."""
  theirs = set(collected(other))
  return [node for node in collected(tree) if node in theirs]


def run_once(tree: str, extra: list[str], log: str | None = None,
             tests: list[str] | None = None) -> dict:
  """One run of the suites of `tree`: seconds, CPU seconds, counts.

  Args:
    tree: the source tree whose tests run.
    extra: more pytest arguments.
    log: a file for pytest's output, if given.
    tests: node ids to run instead of the two suites whole.

  Returns:
    The run's figures and pytest's counts.
  """
  command = _COMMAND if tests is None else _pytest(tests)
  with tempfile.TemporaryDirectory() as cache:
    env = _env(tree, cache)
    load_before = os.getloadavg()[0]
    cpu_before = _children_cpu_s()
    start = time.monotonic()
    done = subprocess.run([sys.executable, *command, *extra], cwd=tree,
                          env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - start
    cpu = _children_cpu_s() - cpu_before
  counts = _counts(done.stdout)
  if log:
    with open(log, "w", encoding="utf-8") as f:
      f.write(done.stdout + done.stderr)
  if done.returncode != 0:
    print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
  return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
          "load_before": load_before, "load_after": os.getloadavg()[0],
          "exit_status": done.returncode, **counts}


def _commit(tree: str) -> str:
  done = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True, check=False)
  return done.stdout.strip() if done.returncode == 0 else "not a git tree"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tree", default=_ROOT,
                      help="the source tree whose suites run (default: this)")
  parser.add_argument("--label", required=True,
                      help="the row's name, e.g. the tree's commit")
  parser.add_argument("--commit",
                      help="the tree's commit, where it is no git checkout")
  parser.add_argument("--runs", type=int, default=1)
  parser.add_argument("--out", required=True,
                      help="the JSON file, overwritten")
  parser.add_argument("--merge", action="store_true",
                      help="keep --out's rows of other labels")
  parser.add_argument("--log", help="pytest's output goes to LOG.<run>")
  parser.add_argument("--tests-of", metavar="OTHER_TREE",
                      help="run only the tests OTHER_TREE also has")
  parser.add_argument("pytest_args", nargs="*",
                      help="after --: more arguments for pytest")
  args = parser.parse_args()
  tree = os.path.abspath(args.tree)
  tests = (shared_tests(tree, os.path.abspath(args.tests_of))
           if args.tests_of else None)
  runs = []
  for i in range(args.runs):
    runs.append(run_once(tree, args.pytest_args,
                         f"{args.log}.{i + 1}" if args.log else None, tests))
    print(f"{args.label}, run {i + 1}: {runs[-1]}", flush=True)
  best = min(runs, key=lambda r: r["wall_s"])
  shown = (_COMMAND if tests is None else _pytest(
      [f"[the {len(tests)} tests that {_commit(args.tests_of)} also has]"]))
  row = {"case": "pytest tests tests_multigpu", "impl": args.label,
         "commit": args.commit or _commit(tree),
         "command": " ".join(["python", *shown, *args.pytest_args]),
         "best_wall_s": best["wall_s"], "cpu_s_of_best": best["cpu_s"],
         "passed": best.get("passed", 0), "skipped": best.get("skipped", 0),
         "failed": best.get("failed", 0), "runs": runs}
  data = {"results": []}
  if args.merge and os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      data = json.load(f)
  data["host"] = {"python": platform.python_version(),
                  "cores": os.cpu_count(), "machine": platform.machine(),
                  "note": "a shared host: see each run's load average"}
  for package in ("jax", "triton", "pytest-xdist"):
    try:  # Versions without importing: jax would log on a CPU host.
      data["host"][package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      data["host"][package] = "not installed"
  data["results"] = [r for r in data["results"]
                     if r.get("impl") != args.label] + [row]
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2)
    f.write("\n")


if __name__ == "__main__":
  main()
