"""Timing helpers: warm up, chain launches, synchronise once, take medians."""

import statistics
import time

import jax
import numpy as np


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


def per_call_seconds(fn, args, calls=2000, warmup=200):
  """Median seconds of one call followed by a sync: dispatch overhead."""
  for _ in range(warmup):
    block(fn(*args))
  samples = np.empty(calls)
  for i in range(calls):
    start = time.perf_counter()
    block(fn(*args))
    samples[i] = time.perf_counter() - start
  return float(np.median(samples))


def relative_error(actual, expected):
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))
