"""What a microsecond of Python costs an eager call that follows a sync.

An eager call in a loop that syncs each time starts cold: its Python runs
right after the thread waited for the device. This measures how that
Python's wall time relates to its cost in a hot loop, and so what budget
jt_dist's eager front door has under its target: an eager call at most
``BOUND`` (1.2) times XLA's eager ``a + b``.

Cases, one call and a sync each, in a fresh random order every round, in
one process (``dispatch.py``'s 1,024-float add):

- ``xla_eager``: ``a + b``;
- ``jt_dist_eager``: ``jt_dist.triton_call`` as ``dispatch.py`` calls it;
- ``jt_dist_kernel_call_eager``: the same call as a ``jt_dist.kernel_call``
  made once, called on the two arrays;
- ``jt_dist_entry_fn``: the jitted function that ``triton_call``'s memo
  holds for ``jt_dist_eager``, called directly;
- ``floor_pad_<n>``: the caller's ``ShapeDtypeStruct``, grid and size
  metaparam, then Python work of ``n`` hashes of a small tuple (its hot
  cost measured alone), then that jitted function called directly.

From them:

- ``wall_us_per_hot_us``: the slope of the floor's wall time over the
  padding's hot cost (a least-squares line through the pads);
- ``jt_dist_hot_us``: jt_dist's own Python per ``triton_call`` in a hot
  loop: ``jt_dist_eager`` less the unpadded floor, back to back, with the
  ``KernelCall``'s jitted function replaced by a Python stub that returns
  a ready output (so that neither waits for the device);
- ``jt_dist_wall_us``: the same difference after a sync;
- ``kernel_call_hot_us`` and ``kernel_call_wall_us``: the same for the
  held ``kernel_call``, against its jitted function (or the stub) alone;
- ``budget_wall_us``: what 1.2x ``xla_eager`` leaves above the floor, and
  ``budget_hot_us``: that budget in hot microseconds (over the slope).

    python benchmarks/python_wall_cost.py --out benchmarks/results/h100x1/python_wall_cost.json
    python benchmarks/python_wall_cost.py --smoke    # tiny, any host
"""

import json
import os
import sys
import timeit
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dispatch  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import timing  # pylint: disable=g-import-not-at-top,wrong-import-position
import triton  # pylint: disable=g-import-not-at-top,wrong-import-position

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._call import memo as _memo  # pylint: disable=g-import-not-at-top,wrong-import-position

BOUND = 1.2  # The target: an eager triton_call at most 1.2x XLA's a + b.
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
    return fn(a, b)
  return case


def _hot_us(fn, number):
  return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def _python_hot_us(call, held, eager, args, number):
  """jt_dist's own Python per call, in a hot loop.

  The jitted functions of ``call`` (the memo's ``KernelCall`` behind
  ``eager``) and of ``held`` (a ``kernel_call``) are replaced, while this
  runs, by a Python stub that returns a ready output: nothing waits for
  the device, and the differences are jt_dist's. ``eager`` is timed
  against the unpadded floor, ``held`` against the stub alone.

  Returns:
    ``(triton_call's µs, kernel_call's µs)``.
  """
  ready = jax.block_until_ready(call._jitted(*args))  # pylint: disable=protected-access
  stub = lambda *_: ready
  floor = _floor(stub, _pad(0))
  with (mock.patch.object(call, "_jitted", stub),
        mock.patch.object(held, "_jitted", stub)):
    front_door = (_hot_us(lambda: eager(*args), number)
                  - _hot_us(lambda: floor(*args), number))
    kernel_call = (_hot_us(lambda: held(*args), number)
                   - _hot_us(lambda: stub(*args), number))
  return front_door, kernel_call


def measure(sizes):
  """The cases' medians, the pads' hot costs and what follows from them."""
  args = dispatch._inputs(11)  # pylint: disable=protected-access
  jt = jt_dist.triton_call
  eager = lambda a, b: dispatch.add_kw(jt, a, b)
  _memo.triton_calls.clear()
  call = dispatch.filed_call(_memo.triton_calls, eager, args)
  jitted = call._jitted  # pylint: disable=protected-access
  held = dispatch.add_kernel_call()
  pads = {n: _pad(n) for n in PADS}
  cases = {"xla_eager": lambda a, b: a + b, "jt_dist_eager": eager,
           "jt_dist_kernel_call_eager": held, "jt_dist_entry_fn": jitted}
  cases.update({f"floor_pad_{n}": _floor(jitted, p) for n, p in pads.items()})
  for case in cases.values():
    for _ in range(20):
      jax.block_until_ready(case(*args))
  samples, _ = dispatch._interleaved(  # pylint: disable=protected-access
      cases, args, sizes["rounds"], sizes["calls"], seed=3)
  medians = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
  pad_hot = {n: _hot_us(p, sizes["hot_calls"] * 10) for n, p in pads.items()}
  slope = float(np.polyfit(
      [pad_hot[n] - pad_hot[0] for n in PADS],
      [medians[f"floor_pad_{n}"] - medians["floor_pad_0"] for n in PADS],
      1)[0])
  hot_us, kernel_call_hot_us = _python_hot_us(
      call, held, eager, args, sizes["hot_calls"])
  budget_wall = BOUND * medians["xla_eager"] - medians["floor_pad_0"]
  return {
      "results": [{"case": k, "median_us": v} for k, v in medians.items()],
      "pad_hot_us": {str(n): v for n, v in pad_hot.items()},
      "wall_us_per_hot_us": slope,
      "jt_dist_hot_us": hot_us,
      "jt_dist_wall_us": medians["jt_dist_eager"] - medians["floor_pad_0"],
      "kernel_call_hot_us": kernel_call_hot_us,
      "kernel_call_wall_us": (medians["jt_dist_kernel_call_eager"]
                              - medians["jt_dist_entry_fn"]),
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
