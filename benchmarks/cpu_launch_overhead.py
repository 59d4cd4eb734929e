"""What one eager CPU launch of a tiny kernel costs, and where it goes.

A 16-float scale kernel (``out = x * s``) is launched eagerly on one CPU
device through ``jt_dist.triton_call``, on one program (Triton's
interpreter loop) and on 4 programs (the vectorised interpreter), with the
bounds check on (the default). For each:

- ``wall_us``: median and quartiles of the wall time per launch (one call
  and a sync), over rounds that alternate the two cases;
- ``profile``: a cProfile of repeated launches: the profiled time per
  launch, and the share of it spent in Triton's ``_patch_lang`` (which
  walks ``triton.language`` with ``inspect.getmembers`` to build the
  interpreter's patches) and in jt_dist's language scope.

    python benchmarks/cpu_launch_overhead.py --out benchmarks/results/cpu/cpu_launch_overhead.json
    python benchmarks/cpu_launch_overhead.py --smoke    # a few launches

Runs the jt_dist of the tree it sits in (it puts that tree first on the
path), so the same script times a checkout before and after a change.
"""

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

import jt_dist  # pylint: disable=g-bad-import-order,wrong-import-position

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import triton  # pylint: disable=wrong-import-position
import triton.language as tl  # pylint: disable=wrong-import-position

_N = 16
# Functions whose cumulative time the profile reports, by name.
_STAGES = {
    "triton_patch_lang": "_patch_lang",
    "jt_dist_language_scope": "language_patched",
}


@triton.jit
def scale_kernel(x_ptr, s, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * s,
           mask=mask)


def _launcher(programs, rng):
  x = jax.device_put(rng.standard_normal(_N).astype(np.float32),
                     jax.devices("cpu")[0])
  s = float(rng.uniform(-2, 2))

  def launch():
    return jt_dist.triton_call(
        x, s, _N, kernel=scale_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(programs,), BLOCK=_N // programs).block_until_ready()

  np.testing.assert_allclose(np.asarray(launch()),
                             np.asarray(x) * np.float32(s), rtol=1e-6)
  return launch


def _profile(launch, count):
  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(count):
    launch()
  profiler.disable()
  stats = pstats.Stats(profiler)
  total = stats.total_tt
  result = {"profiled_us_per_launch": total / count * 1e6}
  for key, function in _STAGES.items():
    # A recursive or nested function's cumulative time is its outermost.
    cumulative = sum(v[3] for k, v in stats.stats.items() if k[2] == function)
    calls = sum(v[1] for k, v in stats.stats.items() if k[2] == function)
    result[key] = {"calls_per_launch": calls / count,
                   "us_per_launch": cumulative / count * 1e6,
                   "share": cumulative / total}
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", help="where to write the JSON results")
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--per-round", type=int, default=25)
  parser.add_argument("--profiled", type=int, default=200)
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args()
  if args.rounds < 2:
    parser.error(f"--rounds {args.rounds}: quartiles need at least 2 rounds")
  if args.smoke:
    args.rounds, args.per_round, args.profiled = 2, 3, 5
  rng = np.random.default_rng(0)
  cases = {f"{p}_program{'s' if p > 1 else ''}": _launcher(p, rng)
           for p in (1, 4)}
  samples = {name: [] for name in cases}
  for _ in range(args.rounds):
    for name, launch in cases.items():
      start = time.perf_counter()
      for _ in range(args.per_round):
        launch()
      samples[name].append((time.perf_counter() - start) / args.per_round)
  results = {"host": {"cpus": os.cpu_count(),
                      "load_average": os.getloadavg(),
                      "python": platform.python_version(),
                      "jax": jax.__version__, "triton": triton.__version__},
             "elements": _N, "cases": {}}
  for name, launch in cases.items():
    q1, median, q3 = statistics.quantiles(samples[name], n=4)
    results["cases"][name] = {
        "wall_us": {"median": median * 1e6, "q1": q1 * 1e6, "q3": q3 * 1e6},
        "profile": _profile(launch, args.profiled)}
    prof = results["cases"][name]["profile"]
    print(f"{name:12} {median * 1e6:8.0f} us/launch (q1 {q1 * 1e6:.0f},"
          f" q3 {q3 * 1e6:.0f}); profiled {prof['profiled_us_per_launch']:.0f}"
          f" us: _patch_lang {prof['triton_patch_lang']['share']:.0%}"
          f" ({prof['triton_patch_lang']['calls_per_launch']:.0f} calls),"
          f" jt_dist scope {prof['jt_dist_language_scope']['share']:.0%}")
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)
      f.write("\n")


if __name__ == "__main__":
  main()
