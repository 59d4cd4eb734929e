"""What an eager CPU call costs: its first call and a repeated one.

An eager ``triton_call`` on CPU arrays runs an XLA executable with the
kernel in a host callback, as a call under ``jax.jit`` does: its first call
of a new signature (here a new length) traces the call and compiles an
executable, and a repeated call finds its ``KernelCall`` in
``triton_call``'s memo and runs the executable through ``jax.jit``'s
dispatch. On one CPU device, with the bounds check on (the default), this
times a 16-float add:

- the first call of each new signature (a new length each time), and
- a repeated call (one call and a sync), hot,

for jt_dist's ``triton_call``, for a held ``jt_dist.kernel_call`` (repeated
call only: it is ``triton_call`` without the memo lookup), and for XLA's
own eager ``a + b`` (``jnp.add``, a new length each time for the first
call). Rounds alternate the rows, and each figure is a median over them.
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

import jt_dist  # pylint: disable=g-bad-import-order,wrong-import-position

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
import triton  # pylint: disable=wrong-import-position
import triton.language as tl  # pylint: disable=wrong-import-position

_BLOCK = 16
_WHERE = "eager, 1 CPU device"


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


def _held(x):
  """A ``kernel_call`` made once for arrays shaped as ``x``."""
  return jt_dist.kernel_call(
      add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, _BLOCK),), n=x.size, BLOCK=_BLOCK)


def _timed(fn, x, y):
  start = time.perf_counter()
  jax.block_until_ready(fn(x, y))
  return time.perf_counter() - start


def _arrays(rng, n):
  return (jax.device_put(rng.standard_normal(n).astype(np.float32)),
          jax.device_put(rng.standard_normal(n).astype(np.float32)))


def measure(rounds: int, hot_calls: int, seed: int) -> list[dict]:
  """First calls on fresh lengths; repeated calls on one length each.

  The repeated calls' lengths (62 to 64) all take 4 programs. Each
  function is called once before timing starts, so that its executable is
  compiled; every result is checked against NumPy's.
  """
  rng = np.random.default_rng(seed)
  first_impls = {"jt_dist triton_call": _add, "XLA jnp.add": jnp.add}
  hot_arrays = {"jt_dist triton_call": _arrays(rng, 64),
                "jt_dist kernel_call held": _arrays(rng, 63),
                "XLA jnp.add": _arrays(rng, 62)}
  held = _held(hot_arrays["jt_dist kernel_call held"][0])
  hot_impls = {"jt_dist triton_call": _add,
               "jt_dist kernel_call held": held,
               "XLA jnp.add": jnp.add}
  for name, fn in hot_impls.items():
    x, y = hot_arrays[name]
    np.testing.assert_allclose(np.asarray(fn(x, y)),
                               np.asarray(x) + np.asarray(y), rtol=1e-6)
  first = {name: [] for name in first_impls}
  hot = {name: [] for name in hot_impls}
  for r in range(rounds):
    for k, (name, fn) in enumerate(first_impls.items()):
      # A length neither implementation has seen: a new signature for each.
      x, y = _arrays(rng, 100 + 3 * (r * len(first_impls) + k))
      jax.block_until_ready((x, y))
      first[name].append(_timed(fn, x, y))
    for name, fn in hot_impls.items():
      for _ in range(hot_calls):
        hot[name].append(_timed(fn, *hot_arrays[name]))
  rows = []
  for name, times in first.items():
    rows.append({"case": "first eager call of a new signature",
                 "impl": name, "where": _WHERE,
                 "ms": statistics.median(times) * 1e3,
                 "samples": len(times)})
  for name, times in hot.items():
    rows.append({"case": "repeated eager call, hot (one call and a sync)",
                 "impl": name, "where": _WHERE,
                 "us": statistics.median(times) * 1e6,
                 "samples": len(times)})
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
