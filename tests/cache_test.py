"""The compiled-kernel caches: LRU bound, content keys, the disk store."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import tempfile
import sys
import unittest
from unittest import mock
import uuid

from absl.testing import absltest
import jax
import jax.numpy as jnp

import jt_dist
from jt_dist._gpu import cache as _cache
from jt_dist._gpu import compile as _compile
from jt_dist import testing
import gpu_lowering_util as util

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_KERNEL_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def helper(x):
  return x {op} 1.0


@triton.jit
def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, helper(tl.load(x_ptr + offsets, mask=mask)),
           mask=mask)
'''

# Lowers the kernel in KERNEL_FILE for CUDA and reports how many times
# Triton compiled, and a digest of the custom call.
_CHILD_SCRIPT = '''
import hashlib, importlib.util, json, os, sys
import jax, jax.numpy as jnp
import jt_dist
from jt_dist._gpu import compile as _compile
spec = importlib.util.spec_from_file_location("kmod", os.environ["KERNEL_FILE"])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
count = [0]
real = _compile.run_triton
def counting(*args):
  count[0] += 1
  return real(*args)
_compile.run_triton = counting
def f(x):
  return jt_dist.triton_call(
      x, x.size, kernel=module.kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), BLOCK=64,
      compute_capability=90)
x = jnp.zeros((100,), jnp.float32)
text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
print("RESULT " + json.dumps({
    "compiled": count[0],
    "digest": hashlib.sha256(text.encode()).hexdigest()}))
'''


def _tmpdir(test) -> str:
  # tempfile rather than absltest's create_tempdir, which needs parsed flags
  # and so fails under pytest.
  folder = tempfile.TemporaryDirectory()
  test.addCleanup(folder.cleanup)
  return folder.name


def _write_kernel(folder: str, op: str = "+") -> str:
  path = os.path.join(folder, f"kernels_{uuid.uuid4().hex}.py")
  with open(path, "w") as f:
    f.write(_KERNEL_SOURCE.format(op=op))
  return path


def _import(path: str):
  name = f"jt_dist_cache_test_{uuid.uuid4().hex}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _call(module, x):
  import jt_dist  # pylint: disable=g-import-not-at-top

  return jt_dist.triton_call(
      x, x.size, kernel=module.kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), BLOCK=64,
      compute_capability=90)


def _lower(module, x):
  fresh = lambda a: _call(module, a)  # A new function defeats jit's cache.
  return jax.jit(fresh).trace(x).lower(lowering_platforms=("cuda",))


class LRUCacheTest(testing.TestCase):

  def test_bound_evicts_least_recently_used(self):
    cache = _cache.LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    self.assertEqual(cache.get("a"), 1)  # "b" is now the oldest.
    cache.put("c", 3)
    self.assertLen(cache, 2)
    self.assertNotIn("b", cache)
    self.assertIn("a", cache)
    cache.resize(1)
    self.assertLen(cache, 1)
    self.assertIn("c", cache)

  def test_content_key_is_canonical(self):
    self.assertEqual(_cache.content_key({"a": 1, "b": [2]}),
                     _cache.content_key({"b": [2], "a": 1}))
    self.assertNotEqual(_cache.content_key({"a": 1}),
                        _cache.content_key({"a": 2}))

  def test_configure_memory_entries(self):
    saved = _cache.memory_cache.max_entries
    self.addCleanup(_cache.configure, memory_entries=saved)
    _cache.configure(memory_entries=3)
    self.assertEqual(_cache.memory_cache.max_entries, 3)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class KernelCacheTest(util.IsolatedCacheMixin, testing.TestCase):

  def setUp(self):
    super().setUp()
    self.compiles = 0
    real = _compile.run_triton

    def counting(*args):
      self.compiles += 1
      return real(*args)

    patcher = mock.patch.object(_compile, "run_triton", counting)
    patcher.start()
    self.addCleanup(patcher.stop)
    self.src_dir = _tmpdir(self)
    self.x = jnp.asarray(self.random((100,)))

  def _entries(self):
    return sorted(glob.glob(os.path.join(self.cache_dir, "*", "*.json")))

  def test_same_source_hits_memory_cache_across_objects(self):
    path = _write_kernel(self.src_dir)
    _lower(_import(path), self.x)
    _lower(_import(path), self.x)  # A new JITFunction of the same source.
    self.assertEqual(self.compiles, 1)

  def test_editing_a_helper_misses_the_cache(self):
    first = _lower(_import(_write_kernel(self.src_dir, "+")), self.x)
    edited = _lower(_import(_write_kernel(self.src_dir, "*")), self.x)
    self.assertEqual(self.compiles, 2)
    ptx = [util.triton_custom_calls(l)[0]["calls"][0]["ptx"]
           for l in (first, edited)]
    self.assertIn("add.f32", ptx[0])
    self.assertNotIn("add.f32", ptx[1])

  def test_disk_cache_hit_after_memory_is_cleared(self):
    path = _write_kernel(self.src_dir)
    first = util.triton_custom_calls(_lower(_import(path), self.x))
    self.assertLen(self._entries(), 1)
    _cache.memory_cache.clear()
    second = util.triton_custom_calls(_lower(_import(path), self.x))
    self.assertEqual(self.compiles, 1)
    self.assertEqual(first, second)

  def _populate_and_clear(self):
    path = _write_kernel(self.src_dir)
    _lower(_import(path), self.x)
    _cache.memory_cache.clear()
    (entry,) = self._entries()
    with open(entry) as f:
      document = json.load(f)
    binary = os.path.join(os.path.dirname(entry), document["binary_file"])
    return path, entry, document, binary

  def _assert_recompiles_with_log(self, path, reason):
    with self.assertLogs("jt_dist", "WARNING") as logs:
      call = util.triton_custom_calls(_lower(_import(path), self.x))[0]
    self.assertEqual(self.compiles, 2)
    self.assertIn(".target sm_90", call["calls"][0]["ptx"])
    self.assertRegex("\n".join(logs.output), f"discarding.*{reason}")
    self.assertLen(self._entries(), 1)  # Rewritten, and valid again.
    _cache.memory_cache.clear()
    _lower(_import(path), self.x)
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
    with open(entry, "w") as f:
      json.dump(document, f)
    self._assert_recompiles_with_log(path, "metadata is invalid")

  def test_disabled_disk_cache_writes_nothing(self):
    _cache.configure(disk_cache=False)
    path = _write_kernel(self.src_dir)
    _lower(_import(path), self.x)
    _cache.memory_cache.clear()
    _lower(_import(path), self.x)
    self.assertEqual(self.compiles, 2)
    self.assertEqual(self._entries(), [])

  def test_configure_cache_refuses_an_empty_memory_cache(self):
    with self.assertRaisesRegex(ValueError,
                                r"memory_entries=0 must be at least 1"):
      jt_dist.configure_cache(memory_entries=0)

  def test_environment_switch_and_directory(self):
    _cache._settings.disk_cache = None  # pylint: disable=protected-access
    _cache._settings.cache_dir = None  # pylint: disable=protected-access
    other = _tmpdir(self)
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "0",
                                      "JT_DIST_CACHE_DIR": other}):
      self.assertFalse(_cache.disk_cache_enabled())
      self.assertEqual(_cache.cache_dir(), other)
    with mock.patch.dict(os.environ, {"JT_DIST_DISK_CACHE": "1",
                                      "JT_DIST_CACHE_DIR": other}):
      self.assertTrue(_cache.disk_cache_enabled())
      _lower(_import(_write_kernel(self.src_dir)), self.x)
      self.assertLen(glob.glob(os.path.join(other, "*", "*.json")), 1)

  def test_unwritable_directory_logs_and_continues(self):
    blocker = os.path.join(_tmpdir(self), "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory")
    _cache.configure(cache_dir=blocker)
    with self.assertLogs("jt_dist", "WARNING") as logs:
      call = util.triton_custom_calls(
          _lower(_import(_write_kernel(self.src_dir)), self.x))[0]
    self.assertIn(".target sm_90", call["calls"][0]["ptx"])
    self.assertIn("cannot write the disk cache", "\n".join(logs.output))


def _child_env(cache_dir: str, kernel_file: str) -> dict[str, str]:
  env = dict(os.environ)
  env.update(JT_DIST_CACHE_DIR=cache_dir, KERNEL_FILE=kernel_file,
             JT_DIST_DISK_CACHE="1",
             PYTHONPATH=os.pathsep.join([_REPO, env.get("PYTHONPATH", "")]))
  env.pop("JT_DIST_DUMP_DIR", None)
  # The children only lower for CUDA; on a GPU host they must not compete
  # with the parent for device memory.
  env["JAX_PLATFORMS"] = "cpu"
  return env


def _result(stdout: str) -> dict:
  (line,) = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
  return json.loads(line[len("RESULT "):])


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CrossProcessTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.cache_dir = _tmpdir(self)
    self.kernel_file = _write_kernel(_tmpdir(self))
    self.env = _child_env(self.cache_dir, self.kernel_file)

  def _spawn(self):
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD_SCRIPT], env=self.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def _finish(self, process):
    out, err = process.communicate(timeout=300)
    self.assertEqual(process.returncode, 0, err[-3000:])
    return _result(out)

  def test_second_process_skips_triton(self):
    first = self._finish(self._spawn())
    second = self._finish(self._spawn())
    self.assertEqual(first["compiled"], 1)
    self.assertEqual(second["compiled"], 0)
    self.assertEqual(first["digest"], second["digest"])

  def test_concurrent_writers_leave_a_valid_entry(self):
    results = [self._finish(p) for p in [self._spawn() for _ in range(4)]]
    self.assertLen({r["digest"] for r in results}, 1)
    after = self._finish(self._spawn())
    self.assertEqual(after["compiled"], 0)
    self.assertEqual(after["digest"], results[0]["digest"])
    for entry in glob.glob(os.path.join(self.cache_dir, "*", "*.json")):
      key = os.path.basename(entry)[:-len(".json")]
      with mock.patch.object(_cache, "cache_dir", return_value=self.cache_dir), \
          mock.patch.object(_cache, "disk_cache_enabled", return_value=True):
        self.assertIsNotNone(_cache.load(key))
    leftovers = glob.glob(os.path.join(self.cache_dir, "*", ".tmp-*"))
    self.assertEqual(leftovers, [])


_STORE_SCRIPT = '''
import os, sys
from jt_dist._gpu import cache as _cache
_cache.configure(disk_cache=True, cache_dir=os.environ["JT_DIST_CACHE_DIR"])
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
    cache_dir = _tmpdir(self)
    env = _child_env(cache_dir, "")
    processes = [
        subprocess.Popen([sys.executable, "-c", _STORE_SCRIPT, str(seed)],
                         env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for seed in range(1, 5)]
    for process in processes:
      out, err = process.communicate(timeout=300)
      self.assertEqual(process.returncode, 0, err[-3000:])
      _result(out)


if __name__ == "__main__":
  absltest.main()
