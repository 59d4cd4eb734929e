"""The compiled lean hit (``jt_dist/_call/lean_hit/``) against its reference.

The C hit must build the very key ``jt_dist._call.lean.key`` builds, and its
memo of last hits must never answer for a call whose key differs. Each test
runs under both hits where the C one is built.
"""

from __future__ import annotations

import gc
import math
import sys
import threading
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import _compat
from jt_dist import testing
from jt_dist._call import dispatch as _dispatch
from jt_dist._call import lean as _lean
from jt_dist._core import binding as _binding
from jt_dist._core import call_cache as _call_cache
import lean_util

testing.configure_cpu_devices()

_C = _lean._c_lean_hit  # pylint: disable=protected-access
_NO_C = "jt_dist/_call/lean_hit/ is not built here (no C compiler at install)"


@triton.jit
def scale_kernel(x_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr,
                 SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * SCALE,
           mask=mask)


@triton.jit
def tagged_copy_kernel(x_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr,
                       TAG: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _scale(x, scale, block=16, grid=None):
  return jt_dist.triton_call(
      x, kernel=scale_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=grid or (triton.cdiv(x.size, block),), n=x.size, BLOCK=block,
      SCALE=scale)


class CompiledHitTest(testing.TestCase):
  """Runs with the C hit where it is built."""

  def setUp(self):
    super().setUp()
    _dispatch.invalidate()

  def _binds(self):
    return mock.patch.object(_binding, "bind_call", wraps=_binding.bind_call)

  @unittest.skipIf(_C is None, _NO_C)
  def test_keys_agree_with_the_reference(self):
    x = jnp.asarray(self.random((24,)))
    sds = jax.ShapeDtypeStruct(x.shape, x.dtype)
    calls = [((x,), (2,), {"n": 24, "BLOCK": 16, "SCALE": 2}),
             ((x, x), (2, 1), {"n": 24, "BLOCK": 16, "SCALE": 2.5}),
             ((x,), (1,), {"SCALE": True, "n": 2**70})]
    for args, grid, metaparams in calls:
      with self.subTest(grid=grid, metaparams=metaparams):
        c_key = _C.key(args, scale_kernel, sds, grid, metaparams)
        self.assertIsNotNone(c_key)
        self.assertEqual(c_key, _lean.key(args, scale_kernel, sds, grid,
                                          metaparams))
    # No key where the reference has none: a scalar operand, a list grid.
    self.assertIsNone(_C.key((x, 2.0), scale_kernel, sds, (1,), {}))
    self.assertIsNone(_C.key((x,), scale_kernel, sds, [1], {}))

  def test_alternating_shapes_take_their_own_entries(self):
    small, large = (self.random((n,)) for n in (16, 48))
    for _ in range(3):
      for x in (small, large):
        out = _scale(jnp.asarray(x), 3)
        self.assertEqual(out.shape, x.shape)
        self.assertAllClose(out, 3 * x)

  def test_arrays_from_several_producers_hit(self):
    # Arrays made by different executables carry different avals: the
    # memo compares their shapes and dtypes, then hits.
    x = self.random((32,))
    arrays = [jnp.asarray(x), jnp.asarray(x) + 0, jnp.asarray(x) * 1,
              jax.device_put(x)]
    _scale(arrays[0], 2)
    with self._binds() as binds:
      for a in arrays * 2:
        self.assertAllClose(_scale(a, 2), 2 * x)
    self.assertEqual(binds.call_count, 0)

  @parameterized.parameters(
      (2, 2.0), (2, True), (1, True), (2**40, 2**40 + 1), (2.0, 2.5),
      (-(2**40), 2**40))
  def test_equal_looking_metaparams_are_told_apart(self, first, second):
    x = self.random((16,))
    out = _scale(jnp.asarray(x), first)
    self.assertAllClose(out, float(first) * x, rtol=1e-5)
    self.assertAllClose(_scale(jnp.asarray(x), first), float(first) * x,
                        rtol=1e-5)
    self.assertAllClose(_scale(jnp.asarray(x), second), float(second) * x,
                        rtol=1e-5)
    self.assertLen(_call_cache.lean_entries, 2)

  def test_ints_beyond_64_bits_are_told_apart(self):
    x = self.random((16,))
    for tag in (2**70, 2**70, 2**70 + 1, -(2**70), 2**70 + 1):
      out = jt_dist.triton_call(
          jnp.asarray(x), kernel=tagged_copy_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,), n=16,
          BLOCK=16, TAG=tag)
      self.assertAllClose(out, x)
    self.assertLen(_call_cache.lean_entries, 3)

  def test_nan_metaparam_runs(self):
    x = self.random((16,))
    for _ in range(3):
      self.assertTrue(np.isnan(np.asarray(_scale(jnp.asarray(x),
                                                 math.nan))).all())

  def test_grid_change_binds_again(self):
    x = self.random((64,))
    self.assertAllClose(_scale(jnp.asarray(x), 2, grid=(4,)), 2 * x)
    _scale(jnp.asarray(x), 2, grid=(4,))
    out = np.asarray(_scale(jnp.asarray(x), 2, grid=(2,)))
    # Half the programs: the second half of the output is never written.
    self.assertAllClose(out[:32], 2 * x[:32])

  def test_closure_arrays_under_a_trace_bind_into_it(self):
    x = jnp.asarray(self.random((16,)))
    _scale(x, 2)
    _scale(x, 2)  # A lean hit now waits for this signature.
    jaxpr = jax.make_jaxpr(lambda: _scale(x, 2))()
    self.assertIn("triton_call", str(jaxpr))
    self.assertAllClose(jax.jit(lambda: _scale(x, 2))(), 2 * x)

  def test_entries_emptied_means_memo_emptied(self):
    x = jnp.asarray(self.random((16,)))
    _scale(x, 2)
    _scale(x, 2)
    full_keys = lambda: mock.patch.object(_dispatch, "key",
                                          wraps=_dispatch.key)
    self.addCleanup(jt_dist.configure_cache,
                    dispatch_entries=_dispatch.DEFAULT_ENTRIES)
    for forget in (_dispatch.invalidate,
                   lambda: jt_dist.configure_cache(dispatch_entries=8)):
      forget()
      with full_keys() as keys:
        self.assertAllClose(_scale(x, 2), 2 * x)
      self.assertGreaterEqual(keys.call_count, 1)  # The full path ran.
      with full_keys() as keys:
        _scale(x, 2)
      self.assertEqual(keys.call_count, 0)  # Lean again.

  def test_kernel_source_update_misses(self):
    @triton.jit
    def twice(x_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr,
              SCALE: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2,
               mask=mask)

    x = self.random((16,))
    call = lambda: jt_dist.triton_call(
        jnp.asarray(x), kernel=twice,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,), n=16,
        BLOCK=16, SCALE=1)
    call()
    call()
    with self._binds() as binds:
      call()
      twice._unsafe_update_src(twice.src.replace("* 2", "* 3"))  # pylint: disable=protected-access
      call()
      call()
    # Bound again once, for the new source (which GPUs compile; the CPU
    # interpreter runs the Python function as defined).
    self.assertEqual(binds.call_count, 1)

  def test_references_are_released(self):
    x = jnp.asarray(self.random((16,)))

    def counts(calls):
      for _ in range(calls):
        out = _scale(x, 2)
      jax.block_until_ready(out)  # Nothing in flight holds a reference.
      gc.collect()
      (entry,) = _call_cache.lean_entries.values()
      return (sys.getrefcount(x), sys.getrefcount(scale_kernel),
              sys.getrefcount(entry), sys.getrefcount(entry.fn))

    before = counts(2)
    after = counts(200)
    # A reference kept per call would show as two hundred; caches filled by
    # other work in the process may move a count by one or two.
    for was, now in zip(before, after):
      self.assertLess(now - was, 10)

  def test_kernel_error_is_raised_as_itself(self):
    x = jnp.asarray(self.random((16,)))
    _scale(x, 2)
    _scale(x, 2)
    (entry,) = _call_cache.lean_entries.values()

    def fails(*_):
      raise RuntimeError("the kernel failed")

    entry.fn = fails
    _call_cache.clear_lean()
    _call_cache.lean_entries[_lean.key((x,), scale_kernel,
                                       jax.ShapeDtypeStruct((16,), x.dtype),
                                       (1,), {"n": 16, "BLOCK": 16,
                                              "SCALE": 2})] = entry
    with self.assertRaisesRegex(RuntimeError, "the kernel failed"):
      _scale(x, 2)


  def test_threads_racing_with_invalidation_get_their_own_answers(self):
    # Several signatures in turn, from several threads, while another
    # empties the entries (and the memo) again and again: each call's
    # answer must be its own.
    inputs = [(self.random((n,)), scale) for n in (16, 32, 48)
              for scale in (2, 3)]
    errors, stop = [], threading.Event()

    def caller(offset):
      try:
        for k in range(24):
          x, scale = inputs[(k + offset) % len(inputs)]
          out = np.asarray(_scale(jnp.asarray(x), scale))
          if out.shape != x.shape or not np.allclose(out, scale * x):
            errors.append((x.shape, scale))
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)

    def invalidator():
      while not stop.is_set():
        _dispatch.invalidate()
        stop.wait(0.02)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(3)]
    spoiler = threading.Thread(target=invalidator)
    spoiler.start()
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    stop.set()
    spoiler.join()
    self.assertEqual(errors, [])


class PythonHitTest(lean_util.PythonHitMixin, CompiledHitTest):
  """``CompiledHitTest`` with the lean hit in Python."""


class ProbeTest(testing.TestCase):

  def test_states_answer_as_the_probe(self):
    states = _compat.top_level_states()
    if states is None:
      self.skipTest("this jax's trace state differs: the C hit calls the "
                    "probe itself")
    holds = lambda: all(state.value is want for state, want in states)
    self.assertTrue(holds())
    seen = []
    jax.make_jaxpr(lambda: seen.append(holds()))()
    jax.vmap(lambda v: seen.append(holds()) or v)(jnp.zeros(2))
    self.assertEqual(seen, [False, False])

  @unittest.skipIf(_C is None, _NO_C)
  def test_compiled_hit_is_taken_where_built(self):
    self.assertTrue(_lean.compiled())
    self.assertFalse(_lean.use_compiled(False))
    self.assertTrue(_lean.use_compiled(True))


if __name__ == "__main__":
  absltest.main()
