"""16 threads calling and compiling kernels at once.

Every thread calls one of several kernels, or the same kernel with another
metaparam, at the same moment (a barrier releases them together). Every
result must be right, and the caches must hold one entry per compiled
kernel: Triton's compiler and interpreter both touch module-wide state, so
a missing lock shows up here as a wrong result, a crash, or a duplicate.

On GPUs the calls compile and launch; on the CPU they run through the
interpreter, and a second test compiles the same calls for CUDA by
cross-lowering, which exercises the compile path and its caches.
"""

import collections
import concurrent.futures
import os
import re
import sys
import threading
import unittest

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing
from jt_dist._cpu import lockstep_rewrite  # Its per-function state.

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import cache_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.add import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_THREADS = 16
_N = 64
# What the interpreter logs, once per kernel, the first time it runs one.
_INTERPRETED = re.compile(
    r"INFO:jt_dist:jt_dist: kernel (\S+) runs through Triton's interpreter")


@triton.jit
def _twice(x):
  return x + x


@triton.jit
def mul_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x * y, mask=mask)


@triton.jit
def twice_diff_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, _twice(x) - y, mask=mask)


@triton.jit
def max_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, tl.maximum(x, y), mask=mask)


_KERNELS = (
    (add_kernel, np.add),
    (mul_kernel, np.multiply),
    (twice_diff_kernel, lambda x, y: 2 * x - y),
    (max_kernel, np.maximum),
)
_BLOCKS = (16, 32, 64)


def _job(i: int):
  """Thread i's kernel, reference and block: 4 kernels, 3 blocks each."""
  kernel, reference = _KERNELS[i % len(_KERNELS)]
  return kernel, reference, _BLOCKS[(i // len(_KERNELS)) % len(_BLOCKS)]


def _distinct_jobs() -> set:
  return {(_job(i)[0], _job(i)[2]) for i in range(_THREADS)}


def _call(kernel, block, x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),),
      BLOCK=block, **options)


def _in_threads(fn):
  """Runs fn(i) for every thread index, all released at once."""
  barrier = threading.Barrier(_THREADS)

  def run(i):
    barrier.wait(timeout=120)
    return fn(i)

  with concurrent.futures.ThreadPoolExecutor(_THREADS) as pool:
    return list(pool.map(run, range(_THREADS), timeout=600))


class ThreadsTest(cache_util.CountingCompilesMixin, testing.TestCase):

  def test_sixteen_threads_call_kernels_at_once(self):
    x = self.random((_THREADS, _N))
    y = self.random((_THREADS, _N))

    def work(i):
      kernel, _, block = _job(i)
      # Twice: a first call that compiles, and one that hits the caches.
      first = _call(kernel, block, jnp.asarray(x[i]), jnp.asarray(y[i]))
      second = jax.jit(lambda a, b: _call(kernel, block, a, b))(
          jnp.asarray(x[i]), jnp.asarray(y[i]))
      return np.asarray(first), np.asarray(second)

    if testing.platform() == "gpu":
      results = _in_threads(work)
    else:
      with self.assertLogs("jt_dist", "INFO") as logs:
        results = _in_threads(work)
    for i, (first, second) in enumerate(results):
      expected = _job(i)[1](x[i], y[i])
      self.assertAllClose(first, expected, msg=f"thread {i}")
      self.assertAllClose(second, expected, msg=f"thread {i}, jitted")
    if testing.platform() == "gpu":
      # One compiled kernel per (kernel, BLOCK), compiled exactly once.
      self.assertEqual(jt_dist.cache_info().memory_cache_entries,
                       len(_distinct_jobs()))
      self.assertEqual(self.compiles, len(_distinct_jobs()))
    else:
      # The interpreter says once per kernel, whichever thread runs it
      # first, that it runs slowly. Only this test runs the odd threads'
      # kernels on the CPU, so they are new here; the others may have been
      # said before.
      said = collections.Counter(
          found[1] for found in map(_INTERPRETED.match, logs.output) if found)
      for i, (kernel, _) in enumerate(_KERNELS):
        name = f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"
        self.assertLessEqual(said[name], 1, logs.output)
        if i % 2:
          self.assertEqual(said[name], 1, logs.output)
      # The interpreter's own per-function state: one lockstep form per
      # kernel (keyed by the Python function), made once.
      self.assertContainsSubset({k.fn for k, _ in _KERNELS},
                                set(lockstep_rewrite._REWRITTEN))
      self.assertEqual(self.compiles, 0)

  @unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_sixteen_threads_compile_for_cuda_at_once(self):
    x = jnp.asarray(self.random((_N,)))

    def ptx_of(i):
      kernel, _, block = _job(i)
      fresh = lambda a, b: _call(kernel, block, a, b, compute_capability=90)
      lowered = jax.jit(fresh).trace(x, x).lower(lowering_platforms=("cuda",))
      (call,) = util.triton_custom_calls(lowered)
      return call["calls"][0]["ptx"]

    concurrent_ptx = _in_threads(ptx_of)
    self.assertEqual(self.compiles, len(_distinct_jobs()))
    self.assertEqual(jt_dist.cache_info().memory_cache_entries,
                     len(_distinct_jobs()))
    # The same PTX as compiling each alone, in this thread, from scratch.
    testing.clear_memory_caches()
    jt_dist.configure_cache(disk_cache=False)
    for i, ptx in enumerate(concurrent_ptx):
      self.assertEqual(ptx, ptx_of(i), f"thread {i}")

  @unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_interpreter_and_compiler_at_once(self):
    # The interpreter patches triton.language for the length of a launch;
    # a compile running then must not see the patched functions.
    x = self.random((_N,))
    y = self.random((_N,))

    def work(i):
      kernel, reference, block = _job(i)
      if i % 2:
        fresh = lambda a, b: _call(kernel, block, a, b, compute_capability=90)
        lowered = jax.jit(fresh).trace(x, y).lower(
            lowering_platforms=("cuda",))
        return util.triton_custom_calls(lowered)[0]["calls"][0]["ptx"]
      cpu = jax.devices("cpu")[0]
      out = _call(kernel, block, jax.device_put(x, cpu),
                  jax.device_put(y, cpu))
      return np.asarray(out), reference(x, y)

    results = _in_threads(work)
    for i, result in enumerate(results):
      if i % 2:
        self.assertIn(".target sm_90", result)
        self.assertIn(_job(i)[0].fn.__name__, result)
      else:
        self.assertAllClose(*result, msg=f"thread {i}")
    self.assertEqual(self.compiles, len({_job(i)[0:3:2] for i in
                                         range(1, _THREADS, 2)}))


if __name__ == "__main__":
  absltest.main()
