"""What a microsecond of Python costs an eager call that follows a sync.

An eager call in a loop that syncs each time starts cold: its Python runs
right after the thread waited for the device. This measures how that
Python's wall time relates to its cost in a hot loop, and so what budget a
design of jt_dist's eager hit has under its target: an eager call at most
``BOUND`` (1.15) times XLA's eager ``a + b``.

Cases, one call and a sync each, in a fresh random order every round, in
one process (``dispatch.py``'s 1,024-float add):

- ``xla_eager``: ``a + b``;
- ``jt_dist_eager``: ``jt_dist.triton_call`` as ``dispatch.py`` calls it;
- ``floor_pad_<n>``: the caller's ``ShapeDtypeStruct``, grid and size
  metaparam, then
  Python work of ``n`` hashes of a small tuple (its hot cost measured
  alone), then jt_dist's cached executable called directly.

From them:

- ``wall_us_per_hot_us``: the slope of the floor's wall time over the
  padding's hot cost (a least-squares line through the pads);
- ``jt_dist_hot_us``: jt_dist's own Python per call in a hot loop:
  ``jt_dist_eager`` less the unpadded floor, back to back, with the cached
  executable swapped for a Python stub (so that neither waits for the
  device);
- ``jt_dist_wall_us``: the same difference after a sync;
- ``budget_wall_us``: what 1.15x ``xla_eager`` leaves above the floor, and
  ``budget_hot_us``: that budget in hot microseconds (over the slope).

    python benchmarks/python_wall_cost.py --out benchmarks/results/h100x1/python_wall_cost.json
    python benchmarks/python_wall_cost.py --smoke    # tiny, any host
"""

import json
import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dispatch  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import timing  # pylint: disable=g-import-not-at-top,wrong-import-position
import triton  # pylint: disable=g-import-not-at-top,wrong-import-position

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

BOUND = 1.15  # The target: an eager triton_call at most 1.15x XLA's a + b.
PADS = (0, 4, 16, 48)
SIZES = {"full": {"rounds": 400, "calls": 5, "hot_calls": 2000},
         "smoke": {"rounds": 3, "calls": 2, "hot_calls": 20}}


def _pad(n):
  small = tuple(range(8))

  def pad():
    for _ in range(n):
      hash((small, n, 1.5))
  return pad


def _floor(fn, pad):
  """The caller's share of a Triton call, ``pad``, then ``fn`` directly.

  The caller's share: ``dispatch.add_kw``'s ``ShapeDtypeStruct``, grid and
  ``n_elements`` metaparam.
  """
  def case(a, b):
    pad()
    jax.ShapeDtypeStruct(a.shape, a.dtype)
    (triton.cdiv(a.size, dispatch.BLOCK),)  # pylint: disable=expression-not-assigned
    a.size  # pylint: disable=pointless-statement
    return fn(a, b)[0]
  return case


def _hot_us(fn, number):
  return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def _python_hot_us(entry, eager, args, number):
  """jt_dist's own Python per call, in a hot loop.

  ``eager`` (the jt_dist call) and the unpadded floor, back to back, with
  the cached executable swapped for a Python stub that returns a ready
  output: neither waits for the device, and the difference is jt_dist's.
  """
  real = entry.fn
  ready = real(*args)
  jax.block_until_ready(ready)
  stub = lambda *_: ready
  floor = _floor(stub, _pad(0))
  dispatch.swap_fn(entry, stub)
  try:
    return (_hot_us(lambda: eager(*args), number)
            - _hot_us(lambda: floor(*args), number))
  finally:
    dispatch.swap_fn(entry, real)


def measure(sizes):
  """The cases' medians, the pads' hot costs and what follows from them."""
  args = dispatch._inputs(11)  # pylint: disable=protected-access
  jt = jt_dist.triton_call
  jax.block_until_ready(dispatch.add_kw(jt, *args))
  entry = dispatch._newest_entry()  # pylint: disable=protected-access
  pads = {n: _pad(n) for n in PADS}
  cases = {"xla_eager": lambda a, b: a + b,
           "jt_dist_eager": lambda a, b: dispatch.add_kw(jt, a, b)}
  cases.update({f"floor_pad_{n}": _floor(entry.fn, p)
                for n, p in pads.items()})
  for case in cases.values():
    for _ in range(20):
      jax.block_until_ready(case(*args))
  samples = dispatch._interleaved(  # pylint: disable=protected-access
      cases, args, sizes["rounds"], sizes["calls"], seed=3)
  medians = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
  pad_hot = {n: _hot_us(p, sizes["hot_calls"] * 10) for n, p in pads.items()}
  slope = float(np.polyfit(
      [pad_hot[n] - pad_hot[0] for n in PADS],
      [medians[f"floor_pad_{n}"] - medians["floor_pad_0"] for n in PADS],
      1)[0])
  hot_us = _python_hot_us(entry, cases["jt_dist_eager"], args,
                          sizes["hot_calls"])
  budget_wall = BOUND * medians["xla_eager"] - medians["floor_pad_0"]
  return {
      "results": [{"case": k, "median_us": v} for k, v in medians.items()],
      "pad_hot_us": {str(n): v for n, v in pad_hot.items()},
      "wall_us_per_hot_us": slope,
      "jt_dist_hot_us": hot_us,
      "jt_dist_wall_us": medians["jt_dist_eager"] - medians["floor_pad_0"],
      "jt_dist_eager_over_xla_eager": (medians["jt_dist_eager"]
                                       / medians["xla_eager"]),
      "floor_over_xla_eager": medians["floor_pad_0"] / medians["xla_eager"],
      "budget_wall_us": budget_wall,
      "budget_hot_us": budget_wall / slope if slope > 0 else None,
  }


def main(argv=None):
  flags = timing.smoke_flags(__doc__, argv)
  sizes = SIZES["smoke" if flags.smoke else "full"]
  result = {"environment": dispatch._environment(),  # pylint: disable=protected-access
            "sizes": sizes, **measure(sizes)}
  print(json.dumps({k: v for k, v in result.items() if k != "environment"},
                   indent=1))
  timing.write_json(flags.out, result)
  return result


if __name__ == "__main__":
  main()
