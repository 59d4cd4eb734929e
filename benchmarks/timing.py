"""The one timing module: what a result was measured on, and how it is timed.

Device work is asynchronous, so every timer here synchronises before it
reads the host clock, warms up first (compilation and caches stay out of
the numbers), repeats, and reports medians. Cases take turns in a fresh
random order every round, so that drifting clocks, host load, or the power
state one case leaves fall on all alike.
"""

import importlib.metadata
import os
import platform
import subprocess
import time
import timeit

import jax
import numpy as np

from doc_tables import code_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _version(name):
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _git(*args):
  try:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, check=True)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip()


def commit(given=None):
  """``(hash, dirty)`` of this tree: ``given``, else git's; else unknown.

  ``dirty`` is whether tracked files differ from the commit (None where
  git cannot say: a given commit names a copy of the tree, whose own .git,
  if any, may be another snapshot's).
  """
  if given:
    return given, None
  head = _git("rev-parse", "HEAD")
  if head:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return head, None if status is None else bool(status)
  return "unknown", None


def provenance(given_commit=None):
  """The commit, the versions and the device a result was measured on."""
  head, dirty = commit(given_commit)
  devices = jax.devices()
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  return {
      "commit": head, "dirty": dirty, "code_sha256": code_sha256(),
      "date": time.strftime("%Y-%m-%d", time.gmtime()),
      "python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": _version("jaxlib"), "triton": _version("triton"),
      "numpy": np.__version__, "jax_triton": _version("jax-triton"),
      "platform": devices[0].platform, "device_kind": devices[0].device_kind,
      "devices": len(devices), "cpus": os.cpu_count(),
      "load_average": None if load is None else round(load, 2),
  }


def block(out):
  return jax.block_until_ready(out)


def _order(names, rounds, seed):
  """Per round, the names in a fresh random order."""
  rng = np.random.default_rng(seed)
  for r in range(rounds):
    yield r, [names[k] for k in rng.permutation(len(names))]


def per_call(cases, args, rounds, calls, seed=0, warmup=3):
  """Seconds of each call followed by a sync, per case, cases in turns.

  Args:
    cases: name -> function of ``*args``.
    args: the arguments every case takes.
    rounds: rounds; each runs every case ``calls`` times, in a random order.
    calls: calls per case and round.
    seed: the order's seed.
    warmup: untimed calls of each case first.

  Returns:
    ``(samples, halves)``: per case, every call's seconds, and the same
    split into the even and the odd rounds (the same case timed twice).
  """
  for fn in cases.values():
    for _ in range(warmup):
      block(fn(*args))
  samples = {name: [] for name in cases}
  halves = {name: ([], []) for name in cases}
  for r, order in _order(list(cases), rounds, seed):
    for name in order:
      fn = cases[name]
      for _ in range(calls):
        seconds = once(lambda fn=fn: fn(*args))
        samples[name].append(seconds)
        halves[name][r % 2].append(seconds)
  return samples, halves


def chained(calls, iters, rounds, seed=0, settle=False, clock=None):
  """Median seconds per call of ``iters`` back-to-back calls, synced once.

  For a kernel much longer than a launch this is device time; for a tiny
  one, the host's cost of one asynchronous launch.

  Args:
    calls: name -> (function, its arguments).
    iters: back-to-back calls per sample.
    rounds: samples per function, in a random order each round.
    seed: the order's seed.
    settle: run each function once, untimed, before its sample, so that
      the GPU's clocks settle to its load (a GPU at its power limit runs a
      kernel faster after a light one than after a heavy one).
    clock: the clock (``time.perf_counter``; ``time.process_time`` gives
      CPU time, which a busy shared host does not inflate).
  """
  clock = clock or time.perf_counter
  for fn, args in calls.values():
    block(fn(*args))
  samples = {name: [] for name in calls}
  for _, order in _order(list(calls), rounds, seed):
    for name in order:
      fn, args = calls[name]
      if settle:
        block(fn(*args))
      start = clock()
      out = None
      for _ in range(iters):
        out = fn(*args)
      block(out)
      samples[name].append((clock() - start) / iters)
  return {name: float(np.median(s)) for name, s in samples.items()}


def once(fn):
  """Seconds of one call of ``fn()`` and a sync."""
  start = time.perf_counter()
  block(fn())
  return time.perf_counter() - start


def best(fn, repeats):
  """The fastest of ``repeats`` calls and syncs, in seconds (slow calls)."""
  return min(once(fn) for _ in range(repeats))


def hot_us(fn, number):
  """Microseconds per call of ``fn()`` in a hot loop, no sync (best of 5)."""
  return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def relative_error(actual, expected):
  """‖actual − expected‖ / ‖expected‖, in float64."""
  actual, expected = (np.asarray(a, np.float64) for a in (actual, expected))
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def quartiles_us(seconds):
  """Median, p25 and p75 of ``seconds``, in µs."""
  p25, p50, p75 = map(float, np.percentile(seconds, [25, 50, 75]) * 1e6)
  return {"median_us": p50, "p25_us": p25, "p75_us": p75}
