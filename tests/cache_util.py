"""Helpers for tests of the compiled-kernel caches: kernels written to files,
lowered for CUDA, in this process or in child processes, with compiles
counted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import uuid

import jax

import jt_dist
from jt_dist import testing
import fork_server
import gpu_lowering_util as util

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL_SOURCE = '''
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

# Lowers the kernel in KERNEL_FILE for CUDA and reports how many kernels
# Triton compiled, how many came from the disk cache, and a digest of the
# custom call.
CHILD_SCRIPT = '''
import hashlib, importlib.util, json, os, sys
import jt_dist
import jax, jax.numpy as jnp
spec = importlib.util.spec_from_file_location("kmod", os.environ["KERNEL_FILE"])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
def f(x):
  return jt_dist.triton_call(
      x, x.size, kernel=module.kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), BLOCK=64,
      compute_capability=90)
x = jnp.zeros((100,), jnp.float32)
text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
info = jt_dist.cache_info()
print("RESULT " + json.dumps({
    "compiled": info.compiles, "disk_hits": info.disk_hits,
    "digest": hashlib.sha256(text.encode()).hexdigest()}))
'''


def tmpdir(test) -> str:
  # tempfile rather than absltest's create_tempdir, which needs parsed flags
  # and so fails under pytest.
  folder = tempfile.TemporaryDirectory()
  test.addCleanup(folder.cleanup)
  return folder.name


def write_kernel(folder: str, op: str = "+") -> str:
  path = os.path.join(folder, f"kernels_{uuid.uuid4().hex}.py")
  with open(path, "w") as f:
    f.write(KERNEL_SOURCE.format(op=op))
  return path


def import_file(path: str):
  name = f"jt_dist_cache_test_{uuid.uuid4().hex}"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def call(module, x):
  return jt_dist.triton_call(
      x, x.size, kernel=module.kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,), BLOCK=64,
      compute_capability=90)


def lower(module, x):
  fresh = lambda a: call(module, a)  # A new function defeats jit's cache.
  return jax.jit(fresh).trace(x).lower(lowering_platforms=("cuda",))


def child_env(cache_dir: str, kernel_file: str) -> dict[str, str]:
  env = fork_server.tree_env(REPO, JT_DIST_CACHE_DIR=cache_dir,
                             KERNEL_FILE=kernel_file, JT_DIST_DISK_CACHE="1")
  env.pop("JT_DIST_DUMP_DIR", None)
  # The children only lower for CUDA; on a GPU host they must not compete
  # with the parent for device memory.
  env["JAX_PLATFORMS"] = "cpu"
  return env


def run_children(test, env: dict[str, str], count: int = 1,
                 script: str = CHILD_SCRIPT, args=None):
  """Runs ``count`` children of ``script`` at once (forks where they may be).

  They race over the cache as closely as processes started apart would
  (``fork_server.run_together``). Asserts each exited 0.

  Returns:
    Each child's ``(result(stdout), stderr)``, in order.
  """
  args = args or [[] for _ in range(count)]
  done = fork_server.run_together([["-c", script, *a] for a in args],
                                  env=env, cwd=REPO, timeout=300)
  for process in done:
    test.assertEqual(process.returncode, 0, process.stderr[-3000:])
  return [(result(process.stdout), process.stderr) for process in done]


def result(stdout: str) -> dict:
  (line,) = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
  return json.loads(line[len("RESULT "):])


def keep_settings(test) -> None:
  """Restores what the ``configure_*`` functions set once ``test`` is over."""
  test.enterContext(testing.isolated_settings())


class EmptyCacheMixin(util.IsolatedCacheMixin):
  """Empty memory caches and a disk cache dir of its own, per test.

  The settings that a test changes with ``configure_*`` are restored.
  """

  def setUp(self):
    super().setUp()
    keep_settings(self)
    jt_dist.configure_cache(disk_cache=True, cache_dir=self.cache_dir)
    testing.clear_memory_caches()
    self.addCleanup(testing.clear_memory_caches)


class CountingCompilesMixin(EmptyCacheMixin):
  """An empty cache of its own and a count of Triton compilations, per test."""

  def setUp(self):
    super().setUp()
    self._compiles_before = jt_dist.cache_info().compiles

  @property
  def compiles(self) -> int:
    """Kernels Triton compiled in this process since the test began."""
    return jt_dist.cache_info().compiles - self._compiles_before
