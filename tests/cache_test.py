"""The compiled-kernel caches: LRU bound, content keys, the disk store."""

from __future__ import annotations

import glob
import json
import os
import unittest
from unittest import mock

from absl.testing import absltest
import jax.numpy as jnp

import jt_dist
from jt_dist import _settings
from jt_dist._backend import cache as _cache
from jt_dist import testing
import cache_util
import gpu_lowering_util as util


class LRUCacheTest(testing.TestCase):

  def test_bound_evicts_least_recently_used(self):
    limit = [2]
    cache = _cache.LRUCache(lambda: limit[0])
    cache.put("a", 1)
    cache.put("b", 2)
    self.assertEqual(cache.get("a"), 1)  # "b" is now the oldest.
    cache.put("c", 3)
    self.assertLen(cache, 2)
    self.assertNotIn("b", cache)
    self.assertIn("a", cache)
    limit[0] = 1
    cache.trim()
    self.assertLen(cache, 1)
    self.assertIn("c", cache)

  def test_content_key_is_canonical(self):
    self.assertEqual(_cache.content_key({"a": 1, "b": [2]}),
                     _cache.content_key({"b": [2], "a": 1}))
    self.assertNotEqual(_cache.content_key({"a": 1}),
                        _cache.content_key({"a": 2}))

  def test_configure_memory_entries(self):
    cache_util.keep_settings(self)
    jt_dist.configure_cache(memory_entries=3)
    self.assertEqual(_settings.memory_entries(), 3)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class KernelCacheTest(cache_util.CountingCompilesMixin, testing.TestCase):

  def setUp(self):
    super().setUp()
    self.src_dir = cache_util.tmpdir(self)
    self.x = jnp.asarray(self.random((100,)))

  def _entries(self):
    return sorted(glob.glob(os.path.join(self.cache_dir, "*", "*.json")))

  def test_same_source_hits_memory_cache_across_objects(self):
    path = cache_util.write_kernel(self.src_dir)
    cache_util.lower(cache_util.import_file(path), self.x)
    cache_util.lower(cache_util.import_file(path), self.x)  # A new JITFunction of the same source.
    self.assertEqual(self.compiles, 1)

  def test_editing_a_helper_misses_the_cache(self):
    first = cache_util.lower(cache_util.import_file(cache_util.write_kernel(self.src_dir, "+")), self.x)
    edited = cache_util.lower(cache_util.import_file(cache_util.write_kernel(self.src_dir, "*")), self.x)
    self.assertEqual(self.compiles, 2)
    ptx = [util.triton_custom_calls(l)[0]["calls"][0]["ptx"]
           for l in (first, edited)]
    self.assertIn("add.f32", ptx[0])
    self.assertNotIn("add.f32", ptx[1])

  def test_disk_cache_hit_after_memory_is_cleared(self):
    path = cache_util.write_kernel(self.src_dir)
    first = util.triton_custom_calls(cache_util.lower(cache_util.import_file(path), self.x))
    self.assertLen(self._entries(), 1)
    _cache.memory_cache.clear()
    second = util.triton_custom_calls(cache_util.lower(cache_util.import_file(path), self.x))
    self.assertEqual(self.compiles, 1)
    self.assertEqual(first, second)

  def _populate_and_clear(self):
    path = cache_util.write_kernel(self.src_dir)
    cache_util.lower(cache_util.import_file(path), self.x)
    _cache.memory_cache.clear()
    (entry,) = self._entries()
    with open(entry) as f:
      document = json.load(f)
    binary = os.path.join(os.path.dirname(entry), document["binary_file"])
    return path, entry, document, binary

  def _assert_recompiles_with_log(self, path, reason):
    with self.assertLogs("jt_dist", "WARNING") as logs:
      call = util.triton_custom_calls(cache_util.lower(cache_util.import_file(path), self.x))[0]
    self.assertEqual(self.compiles, 2)
    self.assertIn(".target sm_90", call["calls"][0]["ptx"])
    self.assertRegex("\n".join(logs.output), f"discarding.*{reason}")
    self.assertLen(self._entries(), 1)  # Rewritten, and valid again.
    _cache.memory_cache.clear()
    cache_util.lower(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, 2)

  def test_corrupt_json_is_discarded(self):
    path, entry, _, _ = self._populate_and_clear()
    with open(entry, "w") as f:
      f.write("{not json")
    self._assert_recompiles_with_log(path, "corrupt or truncated")

  def test_truncated_binary_is_discarded(self):
    path, _, _, binary = self._populate_and_clear()
    with open(binary, "r+b") as f:
      f.truncate(100)
    self._assert_recompiles_with_log(path, "does not match")

  def test_flipped_binary_byte_is_discarded(self):
    path, _, document, binary = self._populate_and_clear()
    with open(binary, "r+b") as f:
      f.seek(document["binary_size"] // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0x01]))
    self._assert_recompiles_with_log(path, "does not match")

  def test_entry_of_another_key_is_discarded(self):
    path, entry, document, _ = self._populate_and_clear()
    document["key"] = "0" * 64
    with open(entry, "w") as f:
      json.dump(document, f)
    self._assert_recompiles_with_log(path, "another key")

  def test_missing_binary_is_discarded(self):
    path, _, _, binary = self._populate_and_clear()
    os.remove(binary)
    self._assert_recompiles_with_log(path, "binary file is missing")

  def test_malformed_metadata_is_discarded(self):
    path, entry, document, _ = self._populate_and_clear()
    del document["metadata"]["shared_mem"]
    # Recorded as if written so (a writer's bug, not damage on disk): the
    # metadata passes the entry's sha256 and fails when it is restored.
    document["entry_sha256"] = _cache._entry_digest(document)  # pylint: disable=protected-access
    with open(entry, "w") as f:
      json.dump(document, f)
    self._assert_recompiles_with_log(path, "metadata is invalid")

  def test_disabled_disk_cache_writes_nothing(self):
    _settings.configure_cache(disk_cache=False)
    path = cache_util.write_kernel(self.src_dir)
    cache_util.lower(cache_util.import_file(path), self.x)
    _cache.memory_cache.clear()
    cache_util.lower(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, 2)
    self.assertEqual(self._entries(), [])

  def test_configure_cache_refuses_an_empty_memory_cache(self):
    with self.assertRaisesRegex(ValueError,
                                r"memory_entries=0 must be at least 1"):
      jt_dist.configure_cache(memory_entries=0)

  def test_environment_switch_and_directory(self):
    self.enter_context(mock.patch.object(
        _settings, "_configured", _settings.Configured()))
    other = cache_util.tmpdir(self)
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "0",
                                      "JT_DIST_CACHE_DIR": other}):
      self.assertFalse(_settings.disk_cache())
      self.assertEqual(_settings.cache_dir(), other)
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "1",
                                      "JT_DIST_CACHE_DIR": other}):
      self.assertTrue(_settings.disk_cache())
      cache_util.lower(cache_util.import_file(cache_util.write_kernel(self.src_dir)), self.x)
      self.assertLen(glob.glob(os.path.join(other, "*", "*.json")), 1)

  def test_unwritable_directory_logs_and_continues(self):
    blocker = os.path.join(cache_util.tmpdir(self), "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory")
    _settings.configure_cache(cache_dir=blocker)
    with self.assertLogs("jt_dist", "WARNING") as logs:
      call = util.triton_custom_calls(
          cache_util.lower(cache_util.import_file(cache_util.write_kernel(self.src_dir)), self.x))[0]
    self.assertIn(".target sm_90", call["calls"][0]["ptx"])
    self.assertIn("cannot write the disk cache", "\n".join(logs.output))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CrossProcessTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = cache_util.tmpdir(self)
    self.kernel_file = cache_util.write_kernel(cache_util.tmpdir(self))
    self.env = cache_util.child_env(self.cache_dir, self.kernel_file)

  def _run(self, count=1):
    return [r for r, _ in cache_util.run_children(self, self.env, count)]

  def test_second_process_skips_triton(self):
    (first,) = self._run()
    (second,) = self._run()
    self.assertEqual(first["compiled"], 1)
    self.assertEqual(second["compiled"], 0)
    self.assertEqual(first["digest"], second["digest"])

  def test_concurrent_writers_leave_a_valid_entry(self):
    results = self._run(4)
    self.assertLen({r["digest"] for r in results}, 1)
    (after,) = self._run()
    self.assertEqual(after["compiled"], 0)
    self.assertEqual(after["digest"], results[0]["digest"])
    for entry in glob.glob(os.path.join(self.cache_dir, "*", "*.json")):
      key = os.path.basename(entry)[:-len(".json")]
      with mock.patch.object(_settings, "cache_dir",
                             return_value=self.cache_dir), \
          mock.patch.object(_settings, "disk_cache", return_value=True):
        self.assertIsNotNone(_cache.load(key))
    leftovers = glob.glob(os.path.join(self.cache_dir, "*", ".tmp-*"))
    self.assertEqual(leftovers, [])


_STORE_SCRIPT = '''
import os, sys
from jt_dist import _settings
from jt_dist._backend import cache as _cache
_settings.configure_cache(disk_cache=True,
                          cache_dir=os.environ["JT_DIST_CACHE_DIR"])
key = "ab" * 32
seed = int(sys.argv[1])
for i in range(200):
  binary = bytes([seed]) * (1000 + 37 * seed)
  _cache.store(key, {"seed": seed}, binary)
  entry = _cache.load(key)
  assert entry is not None, "a complete entry must always be visible"
  metadata, data = entry
  assert data == bytes([metadata["seed"]]) * (1000 + 37 * metadata["seed"])
print("RESULT {}")
'''


class ConcurrentStoreTest(testing.TestCase):

  def test_racing_writers_never_pair_metadata_with_another_binary(self):
    cache_dir = cache_util.tmpdir(self)
    env = cache_util.child_env(cache_dir, "")
    cache_util.run_children(self, env, script=_STORE_SCRIPT,
                            args=[[str(seed)] for seed in range(1, 5)])

if __name__ == "__main__":
  absltest.main()
