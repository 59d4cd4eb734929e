"""What an eager CPU call costs, launched directly and through XLA.

An eager ``triton_call`` on CPU arrays launches the kernel directly on the
arrays' host buffers (``jt_dist._cpu.direct``); with direct launches off it
compiles an XLA executable per new signature and runs the kernel in XLA's
host callback, as a call under ``jax.jit`` does. On one CPU device, with
the bounds check on (the default), this times a 16-float add:

- the first call of each new signature (a new length each time), and
- a repeated call (one call and a sync), hot,

for jt_dist's direct launch, jt_dist with direct launches off, and XLA's
own eager ``a + b`` (``jnp.add``, a new length each time for the first
call); and, for the repeated call, a signature called more than
``PROMOTE_AFTER`` times, which has switched to its executable. Rounds alternate the three, and each figure is a median over them.
jax-triton has no CPU path, so it has no row.

    python benchmarks/cpu_first_call.py --out benchmarks/results/cpu/cpu_first_call.json
    python benchmarks/cpu_first_call.py --smoke
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

# jt_dist first: it imports jax quietly on hosts without GPUs.
import jt_dist  # pylint: disable=g-bad-import-order,wrong-import-position
from jt_dist._cpu import direct  # pylint: disable=wrong-import-position

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import triton  # pylint: disable=wrong-import-position
import triton.language as tl  # pylint: disable=wrong-import-position

_BLOCK = 16


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets,
           tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _add(x, y):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, _BLOCK),), BLOCK=_BLOCK)


def _impls():
  """name -> (function of two arrays, whether direct launches are on)."""
  return {"jt_dist, direct launch": (_add, True),
          "jt_dist, XLA executable (direct launches off)": (_add, False),
          "XLA jnp.add": (jnp.add, True)}


def _timed(fn, x, y, on):
  previous = direct.use_direct(on)
  try:
    start = time.perf_counter()
    jax.block_until_ready(fn(x, y))
    return time.perf_counter() - start
  finally:
    direct.use_direct(previous)


def _arrays(rng, n):
  return (jax.device_put(rng.standard_normal(n).astype(np.float32)),
          jax.device_put(rng.standard_normal(n).astype(np.float32)))


def measure(rounds: int, hot_calls: int, seed: int) -> list[dict]:
  """First calls on fresh lengths; repeated calls on one length each.

  The repeated calls' lengths (61 to 64) all take 4 programs. The direct
  launch's signature gets fewer than ``PROMOTE_AFTER`` calls in all, and
  the promoted one more before timing starts.
  """
  if rounds * hot_calls >= direct.PROMOTE_AFTER:
    raise ValueError(
        f"--rounds {rounds} x --hot-calls {hot_calls} must stay under"
        f" PROMOTE_AFTER={direct.PROMOTE_AFTER}: the direct launch's"
        " signature would switch to its executable mid-run.")
  rng = np.random.default_rng(seed)
  impls = _impls()
  promoted = "jt_dist, past PROMOTE_AFTER calls (its XLA executable)"
  hot_arrays = {name: _arrays(rng, 64 - k) for k, name in
                enumerate([*impls, promoted])}
  for _ in range(direct.PROMOTE_AFTER + 1):
    jax.block_until_ready(_add(*hot_arrays[promoted]))
  hot_impls = {**impls, promoted: (_add, True)}
  first = {name: [] for name in impls}
  hot = {name: [] for name in hot_impls}
  for r in range(rounds):
    for k, (name, (fn, on)) in enumerate(impls.items()):
      # A length no implementation has seen: a new signature for each.
      x, y = _arrays(rng, 100 + 3 * (r * len(impls) + k))
      jax.block_until_ready((x, y))
      first[name].append(_timed(fn, x, y, on))
    for name, (fn, on) in hot_impls.items():
      for _ in range(hot_calls):
        hot[name].append(_timed(fn, *hot_arrays[name], on))
  rows = []
  for name in impls:
    rows.append({"case": "first eager call of a new signature",
                 "impl": name, "where": "eager, 1 CPU device",
                 "ms": statistics.median(first[name]) * 1e3,
                 "samples": len(first[name])})
  for name in hot:
    rows.append({"case": "repeated eager call, hot (one call and a sync)",
                 "impl": name, "where": "eager, 1 CPU device",
                 "us": statistics.median(hot[name]) * 1e6,
                 "samples": len(hot[name])})
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", help="where to write the JSON results")
  parser.add_argument("--rounds", type=int, default=40)
  parser.add_argument("--hot-calls", type=int, default=5)
  parser.add_argument("--smoke", action="store_true",
                      help="a few rounds, to check the script runs")
  args = parser.parse_args()
  jax.config.update("jax_num_cpu_devices", 1)
  rounds, hot_calls = (2, 2) if args.smoke else (args.rounds, args.hot_calls)
  results = measure(rounds, hot_calls, seed=int(time.time()))
  data = {"environment": {"python": platform.python_version(),
                          "jax": jax.__version__,
                          "triton": triton.__version__,
                          "cpus": os.cpu_count(),
                          "load_average": round(os.getloadavg()[0], 2)},
          "results": results}
  text = json.dumps(data, indent=1)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(text)


if __name__ == "__main__":
  main()
