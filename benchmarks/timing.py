"""Timing helpers: warm up, chain launches, synchronise once, take medians."""

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time

import jax
import numpy as np


def smoke_flags(doc, argv=None):
  """``--out`` and ``--smoke``, parsed: the flags most benchmarks take.

  Args:
    doc: the benchmark's module docstring (its first line describes it).
    argv: the arguments, or None for the command line's.
  """
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--out", help="where to write the JSON results")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes: a sanity check on any host")
  return parser.parse_args(argv)


def write_json(path, result):
  """Writes ``result`` to ``path`` (its folder made if missing), if given."""
  if not path:
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)


def environment():
  """What a result was measured on: versions, the host's cores, the devices.

  Every results file carries it, so that a table in the docs can say where
  its figures come from.
  """
  def version(name):
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      return None
  devices = jax.devices()
  return {"python": platform.python_version(), "jax": jax.__version__,
          "jaxlib": version("jaxlib"), "triton": version("triton"),
          "jax_triton": version("jax-triton"), "cpus": os.cpu_count(),
          "devices": [str(d) for d in devices],
          "device_kind": devices[0].device_kind}


def block(out):
  return jax.block_until_ready(out)


def chained_seconds(fn, args, iters=20, repeats=7):
  """Median seconds per call of ``iters`` back-to-back calls, synced once.

  The first call compiles and warms up outside the timed region. Calls are
  asynchronous, so for kernels much longer than dispatch this is device time.
  """
  block(fn(*args))
  block(fn(*args))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = None
    for _ in range(iters):
      out = fn(*args)
    block(out)
    samples.append((time.perf_counter() - start) / iters)
  return statistics.median(samples)


def _rotated(mapping, start):
  """The items of ``mapping``, starting at the ``start``-th (modulo its size).

  Rotating the order each round spreads whatever the position in a round
  costs (the first after a switch, the one after the slowest) over all.
  """
  items = list(mapping.items())
  start %= len(items)
  return items[start:] + items[:start]


def _whole_rotations(rounds, count):
  """``rounds`` rounded up so that each function starts a round equally often."""
  return -(-rounds // count) * count


def per_call_samples(fns, args, calls=2000, rounds=10, warmup=200):
  """Seconds of each call followed by a sync, for each of ``fns``.

  The functions take turns, ``calls // rounds`` calls at a time, in an order
  rotated each round, so that a drift in clocks or host load during the run
  falls on all of them alike rather than on whichever was measured first.
  """
  for fn in fns.values():
    for _ in range(warmup):
      block(fn(*args))
  rounds = _whole_rotations(rounds, len(fns))
  samples = {name: [] for name in fns}
  for r in range(rounds):
    for name, fn in _rotated(fns, r):
      for _ in range(max(1, calls // rounds)):
        start = time.perf_counter()
        block(fn(*args))
        samples[name].append(time.perf_counter() - start)
  return {name: np.asarray(s) for name, s in samples.items()}


def per_call_seconds(fns, args, calls=2000, rounds=10, warmup=200):
  """Median seconds of one call followed by a sync, for each of ``fns``."""
  samples = per_call_samples(fns, args, calls, rounds, warmup)
  return {name: float(np.median(s)) for name, s in samples.items()}


def interleaved_chained_seconds(fns, args, iters=500, rounds=15):
  """Median seconds per call of ``iters`` back-to-back calls, synced once.

  For a tiny kernel the GPU keeps up with the host, so this is the host's
  cost of one asynchronous launch. The functions take turns per round.
  """
  return interleaved_chained_each(
      {name: (fn, args) for name, fn in fns.items()}, iters, rounds)


def interleaved_chained_each(calls, iters=20, rounds=15, shuffle_seed=None,
                             settle=False):
  """``interleaved_chained_seconds`` where each function has its own inputs.

  Args:
    calls: name -> (function, its arguments).
    iters: back-to-back calls per sample.
    rounds: samples per function, taken in turns.
    shuffle_seed: if given, each round takes the functions in a fresh
      random order from this seed, rather than a rotation. A GPU at its
      power limit runs a kernel faster after a light one than after a heavy
      one (on an H200, the same matmul measured 15% apart by what preceded
      it), and a rotation keeps each function's predecessor fixed.
    settle: run each function once, untimed, before its sample, so that the
      GPU's clocks settle to that function's load first.

  Returns:
    name -> median seconds per call.
  """
  for fn, args in calls.values():
    block(fn(*args))
  rounds = _whole_rotations(rounds, len(calls))
  rng = None if shuffle_seed is None else np.random.default_rng(shuffle_seed)
  samples = {name: [] for name in calls}
  for r in range(rounds):
    order = _rotated(calls, r)
    if rng is not None:
      order = [order[i] for i in rng.permutation(len(order))]
    for name, (fn, args) in order:
      if settle:
        block(fn(*args))
      start = time.perf_counter()
      out = None
      for _ in range(iters):
        out = fn(*args)
      block(out)
      samples[name].append((time.perf_counter() - start) / iters)
  return {name: float(np.median(s)) for name, s in samples.items()}


def relative_error(actual, expected):
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def print_table(rows):
  """Prints result rows (dicts with "case" and "impl") as a Markdown table."""
  print("\n| case | impl | numbers |\n| --- | --- | --- |")
  for row in rows:
    numbers = ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in row.items() if k not in ("case", "impl"))
    print(f"| {row['case']} | {row['impl']} | {numbers} |")
