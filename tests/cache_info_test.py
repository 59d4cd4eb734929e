"""``jt_dist.cache_info`` and ``jt_dist.testing``'s isolation helpers."""

import os
import shutil
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


def _scale(x, s, **options):
  return jt_dist.triton_call(
      x, s, x.size, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, _BLOCK),), BLOCK=_BLOCK, **options)


def _entries(folder):
  return [f for _, _, files in os.walk(folder) for f in files
          if f.endswith(".json")]


def _delta(before, after=None):
  after = after or jt_dist.cache_info()
  return after._replace(**{f: getattr(after, f) - getattr(before, f)
                           for f in after._fields})


class CacheInfoTest(testing.TestCase):

  def test_fields_are_counts(self):
    info = jt_dist.cache_info()
    self.assertIsInstance(info, jt_dist.CacheInfo)
    self.assertEqual(info._fields, (
        "triton_call_entries", "sharded_call_entries", "lowerings",
        "compiles", "memory_hits", "disk_hits", "disk_writes",
        "memory_cache_entries"))
    for name, value in info._asdict().items():
      self.assertIsInstance(value, int, name)
      self.assertGreaterEqual(value, 0, name)

  def test_eager_calls_add_one_entry_and_one_lowering(self):
    # Empty memos: one at its bound (after many tests in this process)
    # would evict an entry for each one filed.
    testing.clear_memory_caches()
    x = self.random((int(self.np_rng.integers(1000, 2000)),))
    xs = jnp.asarray(x)
    before = jt_dist.cache_info()
    self.assertAllClose(_scale(xs, 2.0), x * 2)
    first = _delta(before)
    # A call whose scalars come at run time (a float, on every platform) is
    # filed under their types, twice (the general key, and the plain key
    # that says where its compiled-in values are), and under its first
    # values (docs/one-device/eager-calls.md).
    self.assertEqual(first.triton_call_entries, 3)
    self.assertEqual(first.lowerings, 1)
    middle = jt_dist.cache_info()
    for _ in range(3):
      self.assertAllClose(_scale(xs, 2.0), x * 2)
    self.assertEqual(_delta(middle).triton_call_entries, 0)
    self.assertEqual(_delta(middle).lowerings, 0)
    # An int for the float: a new signature, lowered again. An int comes
    # at run time on the CPU (three entries, as above); a GPU compiles it
    # in (two: by its type, and by its value).
    self.assertAllClose(_scale(xs, 3), x * 3)
    self.assertEqual(_delta(middle).triton_call_entries,
                     3 if testing.platform() == "cpu" else 2)
    self.assertEqual(_delta(middle).lowerings, 1)

  def test_jit_counts_a_lowering_per_new_computation(self):
    x = jnp.asarray(self.random((48,)))
    step = jax.jit(lambda a, s: _scale(a, jt_dist.runtime_scalar(s)))
    before = jt_dist.cache_info()
    for s in self.np_rng.uniform(-3, 3, size=3):
      self.assertAllClose(step(x, s), np.asarray(x) * np.float32(s),
                          rtol=1e-6)
    self.assertEqual(_delta(before).lowerings, 1)
    step(jnp.asarray(self.random((64,))), 1.0)  # New shapes.
    self.assertEqual(_delta(before).lowerings, 2)

  def test_sharded_triton_call_entries(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    x = self.random((int(self.np_rng.integers(1, 8)) * 2 * _BLOCK,))
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    before = jt_dist.cache_info()
    for s in (2, 2, 3.0):  # Two signatures: an int, then a float.
      out = jt_dist.sharded_triton_call(
          xs, s, jt_dist.shard_size(0), kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
          mesh=mesh, in_specs=(P("i"),), out_specs=P("i"), BLOCK=_BLOCK)
      self.assertAllClose(out, x * s)
    self.assertEqual(_delta(before).sharded_call_entries, 2)
    self.assertEqual(_delta(before).triton_call_entries, 0)

  def test_entries_follow_the_bound(self):
    with testing.isolated_settings():
      jt_dist.configure_cache(dispatch_entries=2)
      for n in range(3):
        x = self.random((16 * (n + 1),))
        _scale(jnp.asarray(x), 1.0)
      self.assertLessEqual(jt_dist.cache_info().triton_call_entries, 2)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CompileCountsTest(testing.TestCase):
  """Compiles, hits and writes, seen by cross-lowering for CUDA."""

  def _lower(self, n):
    x = jax.ShapeDtypeStruct((n,), jnp.float32)
    fresh = lambda a: _scale(a, 2.0, compute_capability=90)
    return jax.jit(fresh).trace(x).lower(lowering_platforms=("cuda",))

  def test_compile_then_memory_hit_then_disk_hit(self):
    with testing.isolated_caches() as folder:
      before = jt_dist.cache_info()
      self._lower(64)
      first = _delta(before)
      self.assertEqual((first.compiles, first.disk_writes, first.memory_hits,
                        first.disk_hits, first.lowerings), (1, 1, 0, 0, 1))
      self.assertEqual(jt_dist.cache_info().memory_cache_entries, 1)
      self.assertLen(_entries(folder), 1)
      self._lower(64)
      second = _delta(before)
      self.assertEqual((second.compiles, second.memory_hits,
                        second.disk_hits), (1, 1, 0))
      testing.clear_memory_caches()
      self.assertEqual(jt_dist.cache_info().memory_cache_entries, 0)
      self._lower(64)
      third = _delta(before)
      self.assertEqual((third.compiles, third.memory_hits, third.disk_hits,
                        third.disk_writes), (1, 1, 1, 1))

  def test_isolated_settings_from_environment(self):
    env_dir = tempfile.mkdtemp(prefix="jt_dist_env_cache_")
    self.addCleanup(shutil.rmtree, env_dir, ignore_errors=True)
    with testing.isolated_caches() as configured:
      with mock.patch.dict(os.environ, {"JT_DIST_CACHE_DIR": env_dir,
                                        "JT_DIST_DISK_CACHE": "1"}):
        with testing.isolated_settings(from_environment=True):
          self._lower(96)  # Where the environment says.
        # Where configure_cache said, once more (another kernel: Triton
        # specialises sizes that 16 divides).
        self._lower(97)
      self.assertLen(_entries(env_dir), 1)
      self.assertLen(_entries(configured), 1)

  def test_memory_cache_bound(self):
    with testing.isolated_caches():
      jt_dist.configure_cache(memory_entries=2, disk_cache=False)
      before = jt_dist.cache_info()
      for n in (1, 16, 17):  # Three kernels: Triton specialises n.
        self._lower(n)
      self.assertEqual(_delta(before).compiles, 3)
      self.assertEqual(jt_dist.cache_info().memory_cache_entries, 2)
      self._lower(1)  # Evicted, so compiled again.
      self.assertEqual(_delta(before).compiles, 4)


class IsolationTest(testing.TestCase):

  def test_isolated_settings_restore_what_was_configured(self):
    with testing.isolated_settings():
      jt_dist.configure_cache(dispatch_entries=1)
      x = jnp.asarray(self.random((16,)))
      for s in (1, 2, 3):
        _scale(x, s)
      self.assertLessEqual(jt_dist.cache_info().triton_call_entries, 1)
    # The default bound again: new signatures are kept.
    for n in (32, 48):
      _scale(jnp.asarray(self.random((n,))), 1.0)
    self.assertGreaterEqual(jt_dist.cache_info().triton_call_entries, 2)

  def test_isolated_caches_give_an_empty_directory_and_memory(self):
    with testing.isolated_caches() as folder:
      self.assertTrue(os.path.isdir(folder))
      self.assertEqual(os.listdir(folder), [])
      info = jt_dist.cache_info()
      self.assertEqual((info.triton_call_entries, info.sharded_call_entries,
                        info.memory_cache_entries), (0, 0, 0))
    self.assertFalse(os.path.exists(folder))


if __name__ == "__main__":
  absltest.main()
