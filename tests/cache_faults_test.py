"""The disk cache under faults: damaged entries, unwritable places, races.

Adds to tests/cache_test.py (corrupt JSON, a truncated or flipped binary, a
missing binary, an entry rewritten for another key, a cache directory that
is a file, four processes compiling at once). In every case here jt_dist
must not load a wrong kernel, must not crash, must recompile, and must log
the fault once. The store's own pieces are tested here too: the in-memory
LRU, content keys, entries written by racing writers.

Kernels are compiled for CUDA by cross-lowering, so these run on any host;
on a GPU host they exercise the same compile path.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import types
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp

from jt_dist import _settings
from jt_dist._backend import cache as _cache
from jt_dist import testing
import cache_util
import gpu_lowering_util as util


def _ptx(module, x) -> str:
  (call,) = util.triton_custom_calls(cache_util.lower(module, x))
  return call["calls"][0]["ptx"]


def _call(module, x) -> dict:
  """The whole lowered custom call: kernel, launch metadata and binaries."""
  (call,) = util.triton_custom_calls(cache_util.lower(module, x))
  return call["calls"][0]


def _edit_document(entry: str, edit) -> None:
  """Rewrites the entry's JSON document, well formed, as ``edit`` changes it."""
  with open(entry) as f:
    document = json.load(f)
  edit(document)
  with open(entry, "w") as f:
    json.dump(document, f)


def _set_metadata(field, value):
  return lambda document: document["metadata"].__setitem__(field, value)


def _copy(source: str, target: str) -> None:
  with open(source, "rb") as f:
    data = f.read()
  with open(target, "wb") as f:
    f.write(data)


def _damage(entry: str, binary: str, how: str, rng) -> None:
  """Damages the entry's JSON document or its binary, as ``how`` says."""
  target = binary if how.startswith("binary") else entry
  with open(target, "rb") as f:
    data = f.read()
  if how.endswith("empty"):
    data = b""
  elif how.endswith("truncated"):
    data = data[:len(data) // 2]
  elif how.endswith("random"):
    data = rng.bytes(len(data))
  with open(target, "wb") as f:
    f.write(data)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class DiskFaultTest(cache_util.CountingCompilesMixin, testing.TestCase):

  def setUp(self):
    super().setUp()
    self.src_dir = cache_util.tmpdir(self)
    self.x = jnp.asarray(self.random((100,)))

  def _entries(self, pattern="*.json"):
    return sorted(glob.glob(os.path.join(self.cache_dir, "*", pattern)))

  def _cached(self, op="+"):
    """A kernel compiled once into the disk cache, then dropped from memory."""
    before = set(self._entries())
    path = cache_util.write_kernel(self.src_dir, op)
    ptx = _ptx(cache_util.import_file(path), self.x)
    _cache.memory_cache.clear()
    (entry,) = set(self._entries()) - before
    with open(entry) as f:
      binary = os.path.join(os.path.dirname(entry), json.load(f)["binary_file"])
    return path, ptx, entry, binary

  def _assert_recovers_logging_once(self, path, expected_ptx, reason):
    """Recompiles the right kernel with one warning, and stays recovered."""
    compiles = self.compiles
    with self.assertLogs("jt_dist", "WARNING") as logs:
      ptx = _ptx(cache_util.import_file(path), self.x)
      _ptx(cache_util.import_file(path), self.x)  # A memory hit: no new log.
    self.assertEqual(ptx, expected_ptx)
    self.assertEqual(self.compiles, compiles + 1)
    self.assertLen(logs.records, 1, logs.output)
    self.assertRegex(logs.output[0], reason)
    # The rewritten entry is whole: a new process (memory cleared) hits it.
    _cache.memory_cache.clear()
    with self.assertNoLogs("jt_dist", "WARNING"):
      self.assertEqual(_ptx(cache_util.import_file(path), self.x), expected_ptx)
    self.assertEqual(self.compiles, compiles + 1)

  @parameterized.named_parameters(
      ("json_empty", "json_empty", "corrupt or truncated"),
      ("json_truncated", "json_truncated", "corrupt or truncated"),
      ("json_random", "json_random", "corrupt or truncated"),
      ("binary_empty", "binary_empty", "does not match"),
      ("binary_truncated_in_half", "binary_truncated", "does not match"),
      ("binary_random_same_size", "binary_random", "does not match"))
  def test_damaged_entry_is_recompiled(self, how, reason):
    path, ptx, entry, binary = self._cached()
    _damage(entry, binary, how, self.np_rng)
    self._assert_recovers_logging_once(path, ptx, f"discarding.*{reason}")

  def test_swapped_entry_of_another_kernel_is_not_loaded(self):
    add_path, add_ptx, add_entry, _ = self._cached("+")
    _, mul_ptx, mul_entry, mul_binary = self._cached("*")
    self.assertNotEqual(add_ptx, mul_ptx)
    # The multiply kernel's whole entry under the add kernel's name, as a
    # botched copy or sync between machines would leave it.
    _copy(mul_entry, add_entry)
    self._assert_recovers_logging_once(add_path, add_ptx,
                                       "discarding.*another key")
    self.assertTrue(os.path.exists(mul_binary))  # The other entry survives.

  def test_swapped_binary_of_another_kernel_is_not_loaded(self):
    add_path, add_ptx, _, add_binary = self._cached("+")
    _, _, _, mul_binary = self._cached("*")
    _copy(mul_binary, add_binary)
    self._assert_recovers_logging_once(add_path, add_ptx,
                                       "discarding.*does not match")

  @parameterized.named_parameters(
      ("num_warps_4_to_8", _set_metadata("num_warps", 8)),
      ("shared_mem_0_to_1024", _set_metadata("shared_mem", 1024)),
      ("global_scratch_size", _set_metadata("global_scratch_size", 512)),
      ("profile_scratch_size", _set_metadata("profile_scratch_size", 64)),
      ("name", _set_metadata("name", "another_kernel")),
      ("num_ctas", _set_metadata("num_ctas", 2)),
      ("extra_field", lambda d: d.__setitem__("note", "edited by hand")))
  def test_edited_but_well_formed_entry_is_recompiled(self, edit):
    path, _, entry, _ = self._cached()
    expected = _call(cache_util.import_file(path), self.x)
    self.assertEqual((expected["num_warps"], expected["shared_mem"]), (4, 0))
    _cache.memory_cache.clear()
    _edit_document(entry, edit)
    compiles = self.compiles
    with self.assertLogs("jt_dist", "WARNING") as logs:
      self.assertEqual(_call(cache_util.import_file(path), self.x), expected)
      _call(cache_util.import_file(path), self.x)  # A memory hit: no new log.
    self.assertEqual(self.compiles, compiles + 1)
    self.assertLen(logs.records, 1, logs.output)
    self.assertRegex(logs.output[0],
                     "discarding.*does not match its recorded sha256")
    _cache.memory_cache.clear()  # The rewritten entry is whole again.
    with self.assertNoLogs("jt_dist", "WARNING"):
      self.assertEqual(_call(cache_util.import_file(path), self.x), expected)
    self.assertEqual(self.compiles, compiles + 1)

  def test_malformed_metadata_is_discarded(self):
    path, ptx, entry, _ = self._cached()
    # Recorded as if written so (a writer's bug, not damage on disk): the
    # metadata passes the entry's sha256 and fails when it is restored.
    def drop_shared_mem(document):
      del document["metadata"]["shared_mem"]
      document["entry_sha256"] = _cache._entry_digest(document)  # pylint: disable=protected-access
    _edit_document(entry, drop_shared_mem)
    self._assert_recovers_logging_once(path, ptx,
                                       "discarding.*metadata is invalid")

  def _write_fails_once_logged(self, patch, reason):
    """Two kernels compile under ``patch``: right, unstored, logged once."""
    paths = [cache_util.write_kernel(self.src_dir, op) for op in "+*"]
    with patch, self.assertLogs("jt_dist", "WARNING") as logs:
      ptxs = [_ptx(cache_util.import_file(p), self.x) for p in paths]
    self.assertEqual(self.compiles, 2)
    self.assertLen(logs.records, 1, logs.output)
    self.assertRegex(logs.output[0], f"cannot write the disk cache.*{reason}")
    self.assertEqual(self._entries(), [])
    self.assertEqual(self._entries(".tmp-*"), [])  # No torn temporaries.
    # Unchanged by the fault: the same PTX as compiled with a working disk.
    _cache.memory_cache.clear()
    self.assertEqual([_ptx(cache_util.import_file(p), self.x) for p in paths],
                     ptxs)
    self.assertEqual(self.compiles, 4)
    self.assertLen(self._entries(), 2)

  def test_full_disk(self):
    real_fsync = os.fsync
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fsync(fd):
      real_fsync(fd)
      raise full

    self._write_fails_once_logged(
        mock.patch.object(_cache.os, "fsync", fsync), "No space left")

  def test_disk_full_between_binary_and_json(self):
    real = _cache._atomic_write  # pylint: disable=protected-access

    def atomic_write(folder, path, data):
      if path.endswith(".json"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      real(folder, path, data)

    patch = mock.patch.object(_cache, "_atomic_write", atomic_write)
    paths = [cache_util.write_kernel(self.src_dir, op) for op in "+*"]
    with patch, self.assertLogs("jt_dist", "WARNING") as logs:
      for p in paths:
        _ptx(cache_util.import_file(p), self.x)
    self.assertLen(logs.records, 1, logs.output)
    # Binaries without a JSON document are never read: a new process
    # recompiles rather than guessing.
    self.assertEqual(self._entries(), [])
    _cache.memory_cache.clear()
    _ptx(cache_util.import_file(paths[0]), self.x)
    self.assertEqual(self.compiles, 3)

  def test_read_only_directory(self):
    if os.geteuid() == 0:
      # Root writes through permission bits: refuse the cache's writes the
      # way a read-only directory refuses them, inside this test only.
      def mkstemp(**kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                              kwargs.get("dir"))

      patch = mock.patch.object(_cache, "tempfile",
                                types.SimpleNamespace(mkstemp=mkstemp))
    else:
      os.chmod(self.cache_dir, 0o555)
      self.addCleanup(os.chmod, self.cache_dir, 0o755)
      patch = contextlib.nullcontext()
    self._write_fails_once_logged(patch, "Permission denied")

  def test_read_only_directory_still_serves_its_entries(self):
    path, ptx, _, _ = self._cached()
    os.chmod(self.cache_dir, 0o555)
    self.addCleanup(os.chmod, self.cache_dir, 0o755)
    with self.assertNoLogs("jt_dist", "WARNING"):
      self.assertEqual(_ptx(cache_util.import_file(path), self.x), ptx)
    self.assertEqual(self.compiles, 1)

  def test_directory_that_is_a_file_logs_once_for_many_kernels(self):
    blocker = os.path.join(cache_util.tmpdir(self), "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory")
    _settings.configure_cache(cache_dir=blocker)
    paths = [cache_util.write_kernel(self.src_dir, op) for op in "+*-"]
    with self.assertLogs("jt_dist", "WARNING") as logs:
      ptxs = [_ptx(cache_util.import_file(p), self.x) for p in paths]
    self.assertLen(logs.records, 1, logs.output)
    self.assertIn("cannot write the disk cache", logs.output[0])
    self.assertLen(set(ptxs), 3)
    with open(blocker) as f:
      self.assertEqual(f.read(), "not a directory")

  def test_entry_path_that_is_a_directory(self):
    path, ptx, entry, binary = self._cached()
    os.remove(entry)
    os.mkdir(entry)  # Something else's directory where the JSON should be.
    compiles = self.compiles
    with self.assertLogs("jt_dist", "WARNING") as logs:
      self.assertEqual(_ptx(cache_util.import_file(path), self.x), ptx)
      _ptx(cache_util.import_file(path), self.x)
    self.assertEqual(self.compiles, compiles + 1)
    # The read and the rewrite each fail, and each says so once; the
    # directory is left alone (it is not jt_dist's to delete).
    self.assertLen(logs.records, 2, logs.output)
    self.assertIn("cannot read disk cache entry", logs.output[0])
    self.assertIn("cannot write the disk cache", logs.output[1])
    self.assertTrue(os.path.isdir(entry))
    self.assertTrue(os.path.exists(binary))


class LRUCacheTest(testing.TestCase):
  """The in-memory cache's own bound and the content keys, without Triton."""

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


class EntryDigestTest(cache_util.EmptyCacheMixin, testing.TestCase):
  """The entry's own checks, without Triton: on every host and jax."""

  def _stored(self):
    key = os.urandom(32).hex()
    metadata = {"name": "kernel", "num_warps": 4, "shared_mem": 0,
                "scratch": [int(v) for v in self.np_rng.integers(0, 9, 3)]}
    binary = self.np_rng.bytes(int(self.np_rng.integers(16, 64)))
    _cache.store(key, metadata, binary)
    (entry,) = glob.glob(os.path.join(self.cache_dir, key[:2], key + ".json"))
    return key, metadata, binary, entry

  def test_whole_entry_loads_back(self):
    key, metadata, binary, _ = self._stored()
    with self.assertNoLogs("jt_dist", "WARNING"):
      self.assertEqual(_cache.load(key), (metadata, binary))

  @parameterized.named_parameters(
      ("num_warps", "num_warps", 8), ("shared_mem", "shared_mem", 1024),
      ("scratch", "scratch", [0, 0, 0]), ("name", "name", "other"))
  def test_edited_metadata_is_discarded_with_one_warning(self, field, value):
    key, _, _, entry = self._stored()
    _edit_document(entry, _set_metadata(field, value))
    with self.assertLogs("jt_dist", "WARNING") as logs:
      self.assertIsNone(_cache.load(key))
    self.assertLen(logs.records, 1, logs.output)
    self.assertRegex(
        logs.output[0],
        f"discarding the disk cache entry {key[:16]}.*does not match its"
        " recorded sha256")
    self.assertFalse(os.path.exists(entry))

  def test_entry_of_the_previous_format_is_discarded(self):
    key, _, _, entry = self._stored()
    _edit_document(entry, lambda d: (d.pop("entry_sha256"),
                                     d.__setitem__("format", 2)))
    with self.assertLogs("jt_dist", "WARNING") as logs:
      self.assertIsNone(_cache.load(key))
    self.assertRegex(logs.output[0], "another key or cache format")


_RACERS = 6


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class RacingProcessesTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = cache_util.tmpdir(self)
    self.kernel_file = cache_util.write_kernel(cache_util.tmpdir(self))
    self.env = cache_util.child_env(self.cache_dir, self.kernel_file)

  def _race(self, count=_RACERS):
    return cache_util.run_children(self, self.env, count)

  def _files(self, pattern):
    return sorted(glob.glob(os.path.join(self.cache_dir, "*", pattern)))

  def _assert_one_whole_entry(self, digest):
    (entry,) = self._files("*.json")
    (binary,) = self._files("*.bin")  # Identical compiles: one binary.
    with open(entry) as f:
      document = json.load(f)
    self.assertEqual(os.path.basename(binary), document["binary_file"])
    self.assertEqual(self._files(".tmp-*"), [])
    key = os.path.basename(entry)[:-len(".json")]
    with mock.patch.object(_settings, "cache_dir",
                           return_value=self.cache_dir), \
        mock.patch.object(_settings, "disk_cache", return_value=True):
      self.assertIsNotNone(_cache.load(key))
    ((after, _),) = self._race(1)
    self.assertEqual(after["compiled"], 0)
    self.assertEqual(after["digest"], digest)

  def test_racing_processes_over_an_empty_cache(self):
    results = self._race()
    self.assertLen({r["digest"] for r, _ in results}, 1)
    self.assertGreaterEqual(sum(r["compiled"] for r, _ in results), 1)
    self._assert_one_whole_entry(results[0][0]["digest"])

  def test_edited_metadata_is_recompiled_in_a_new_process(self):
    ((first, _),) = self._race(1)
    (entry,) = self._files("*.json")
    _edit_document(entry, _set_metadata("num_warps", 8))
    ((second, err),) = self._race(1)
    self.assertEqual(second["compiled"], 1)
    self.assertEqual(second["digest"], first["digest"])
    self.assertEqual(err.count("discarding the disk cache entry"), 1, err)
    self.assertIn("does not match its recorded sha256", err)
    ((third, err),) = self._race(1)  # The rewritten entry is used as is.
    self.assertEqual((third["compiled"], third["digest"]),
                     (0, first["digest"]))
    self.assertNotIn("discarding", err)

  def test_racing_processes_over_a_corrupt_entry(self):
    ((first, _),) = self._race(1)
    (entry,) = self._files("*.json")
    with open(entry, "w") as f:
      f.write('{"format": 3, "key": "trunc')
    results = self._race()
    self.assertLen({r["digest"] for r, _ in results} | {first["digest"]}, 1)
    # Whoever read the damage said so, once; nobody crashed on it.
    for result, err in results:
      self.assertLessEqual(err.count("discarding the disk cache entry"), 1)
      if result["compiled"] == 0:
        self.assertNotIn("discarding", err)
    self.assertGreaterEqual(sum(r["compiled"] for r, _ in results), 1)
    self._assert_one_whole_entry(first["digest"])


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
