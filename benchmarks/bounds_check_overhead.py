"""What the CPU interpreter's bounds check costs, on suites and kernels.

Two measurements, interleaved so that a busy host slows both alike:

- the test suites (``pytest tests tests_multigpu``), run whole with
  ``JT_DIST_BOUNDS_CHECK=1`` and ``=0`` in turn, wall time per run;
- the examples' kernels launched eagerly through the interpreter, median
  time per call with the check on and off.

    python benchmarks/bounds_check_overhead.py \
        --out benchmarks/results/cpu/bounds_check_overhead.json

Runs on the CPU (the check exists only there); writes JSON and prints a table.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_ENV = "JT_DIST_BOUNDS_CHECK"


def _suite_seconds(check: str) -> float:
  env = dict(os.environ, **{_ENV: check})
  start = time.perf_counter()
  subprocess.run(
      [sys.executable, "-m", "pytest", "tests", "tests_multigpu", "-q",
       "-p", "no:cacheprovider"],
      cwd=_ROOT, env=env, check=True, capture_output=True)
  return time.perf_counter() - start


def _kernel_calls():
  """(name, zero-argument callable) for each example kernel's eager call."""
  sys.path.insert(0, os.path.join(_ROOT, "examples"))
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import add  # pylint: disable=import-outside-toplevel
  import matmul  # pylint: disable=import-outside-toplevel
  import softmax  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  x = jax.numpy.asarray(rng.standard_normal(10_000, dtype=np.float32))
  a = jax.numpy.asarray(rng.standard_normal((48, 32), dtype=np.float32))
  b = jax.numpy.asarray(rng.standard_normal((32, 40), dtype=np.float32))
  s = jax.numpy.asarray(rng.standard_normal((16, 100), dtype=np.float32))
  return [
      ("add 10k (40 programs)", lambda: add.add(x, x, block=256)),
      ("matmul 48x32x40 (9 programs)", lambda: matmul.matmul(a, b)),
      ("softmax 16x100 (16 programs)", lambda: softmax.softmax(s)),
  ]


def _kernel_ms(call, check: str, repeats: int) -> float:
  os.environ[_ENV] = check
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    call().block_until_ready()
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", required=True,
                      help="where to write the JSON results")
  parser.add_argument("--suite-runs", type=int, default=3)
  parser.add_argument("--kernel-repeats", type=int, default=15)
  args = parser.parse_args()
  kernels = {}
  for name, call in _kernel_calls():
    call().block_until_ready()  # Compile outside the timing.
    on, off = [], []
    for _ in range(3):
      on.append(_kernel_ms(call, "1", args.kernel_repeats))
      off.append(_kernel_ms(call, "0", args.kernel_repeats))
    kernels[name] = {"on_ms": min(on), "off_ms": min(off)}
  suites = {"on_s": [], "off_s": []}
  for _ in range(args.suite_runs):
    suites["on_s"].append(_suite_seconds("1"))
    suites["off_s"].append(_suite_seconds("0"))
  import timing  # pylint: disable=import-outside-toplevel
  timing.write_json(args.out, {"environment": timing.environment(),
                               "kernels": kernels, "suites": suites})
  print(f"{'what':34} {'check on':>10} {'check off':>10} {'ratio':>6}")
  for name, t in kernels.items():
    print(f"{name:34} {t['on_ms']:8.1f}ms {t['off_ms']:8.1f}ms"
          f" {t['on_ms'] / t['off_ms']:6.2f}")
  if not args.suite_runs:
    return
  on_s, off_s = min(suites["on_s"]), min(suites["off_s"])
  print(f"{'suites (best of ' + str(args.suite_runs) + ')':34} {on_s:9.1f}s"
        f" {off_s:9.1f}s {on_s / off_s:6.2f}")


if __name__ == "__main__":
  main()
