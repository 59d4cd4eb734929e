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
from jt_dist import testing
import cache_util
import gpu_lowering_util as util


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
    testing.clear_memory_caches()
    second = util.triton_custom_calls(cache_util.lower(cache_util.import_file(path), self.x))
    self.assertEqual(self.compiles, 1)
    self.assertEqual(first, second)

  def _populate_and_clear(self):
    path = cache_util.write_kernel(self.src_dir)
    cache_util.lower(cache_util.import_file(path), self.x)
    testing.clear_memory_caches()
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
    testing.clear_memory_caches()
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

  def test_disabled_disk_cache_writes_nothing(self):
    jt_dist.configure_cache(disk_cache=False)
    path = cache_util.write_kernel(self.src_dir)
    cache_util.lower(cache_util.import_file(path), self.x)
    testing.clear_memory_caches()
    cache_util.lower(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, 2)
    self.assertEqual(self._entries(), [])

  def test_configure_memory_entries_bounds_the_memory_cache(self):
    jt_dist.configure_cache(memory_entries=2, disk_cache=False)
    modules = [cache_util.import_file(cache_util.write_kernel(self.src_dir, op))
               for op in "+*-"]
    lower = lambda i: cache_util.lower(modules[i], self.x)
    lower(0)
    lower(1)
    lower(0)  # A memory hit: kernel 1 is now the least recently used.
    self.assertEqual(self.compiles, 2)
    lower(2)  # Evicts kernel 1.
    self.assertEqual(jt_dist.cache_info().memory_cache_entries, 2)
    lower(0)
    self.assertEqual(self.compiles, 3)
    lower(1)
    self.assertEqual(self.compiles, 4)
    jt_dist.configure_cache(memory_entries=1)  # Trimmed at once.
    self.assertEqual(jt_dist.cache_info().memory_cache_entries, 1)

  def test_configure_cache_refuses_an_empty_memory_cache(self):
    with self.assertRaisesRegex(ValueError,
                                r"memory_entries=0 must be at least 1"):
      jt_dist.configure_cache(memory_entries=0)

  def test_environment_switch_and_directory(self):
    self.enter_context(testing.isolated_settings(from_environment=True))
    other = cache_util.tmpdir(self)
    in_other = lambda: glob.glob(os.path.join(other, "*", "*.json"))
    path = cache_util.write_kernel(self.src_dir)
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "0",
                                      "JT_DIST_CACHE_DIR": other}):
      cache_util.lower(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, 1)
    self.assertEqual((in_other(), self._entries()), ([], []))
    testing.clear_memory_caches()
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "1",
                                      "JT_DIST_CACHE_DIR": other}):
      cache_util.lower(cache_util.import_file(path), self.x)
      self.assertLen(in_other(), 1)
      self.assertEqual(self._entries(), [])
      testing.clear_memory_caches()
      before = jt_dist.cache_info()
      cache_util.lower(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, 2)
    self.assertEqual(jt_dist.cache_info().disk_hits - before.disk_hits, 1)

  def test_unwritable_directory_logs_and_continues(self):
    blocker = os.path.join(cache_util.tmpdir(self), "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory")
    jt_dist.configure_cache(cache_dir=blocker)
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
    self.assertEqual((first["compiled"], first["disk_hits"]), (1, 0))
    self.assertEqual((second["compiled"], second["disk_hits"]), (0, 1))
    self.assertEqual(first["digest"], second["digest"])

  def test_concurrent_writers_leave_a_valid_entry(self):
    results = self._run(4)
    self.assertLen({r["digest"] for r in results}, 1)
    (after,) = self._run()
    self.assertEqual(after["compiled"], 0)
    self.assertEqual(after["digest"], results[0]["digest"])
    # The one entry is whole: the process after them read it back.
    self.assertLen(glob.glob(os.path.join(self.cache_dir, "*", "*.json")), 1)
    self.assertEqual(after["disk_hits"], 1)
    leftovers = glob.glob(os.path.join(self.cache_dir, "*", ".tmp-*"))
    self.assertEqual(leftovers, [])


if __name__ == "__main__":
  absltest.main()
