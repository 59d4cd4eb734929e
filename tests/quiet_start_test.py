"""Importing jt_dist, calling it and running the examples write no stderr.

On a host without GPUs that has JAX's CUDA plugin (for cross-lowering),
``import jax`` writes absl's and tsl's start-up lines; jt_dist drops exactly
those when it imports jax (jt_dist/_jax_import.py).
"""

import os
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import _jax_import

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ABSL = (b"WARNING: All log messages before absl::InitializeLog() is called"
         b" are written to STDERR")
_CUDART = (b"I0000 00:00:1795412422.697077    5485 cudart_stub.cc:31] Could not"
           b" find cuda drivers on your machine, GPU will not be used.")
_CALL = """
import jt_dist
import jax, jax.numpy as jnp, triton, triton.language as tl

@triton.jit
def double(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

x = jnp.arange(100, dtype=jnp.float32)
out = jax.jit(lambda x: jt_dist.triton_call(
    x, x.size, kernel=double, out_shape=x, grid=(4,), BLOCK=32))(x)
assert (jax.device_get(out) == 2 * jax.device_get(x)).all()
print("ok")
"""


def _run(argv):
  with tempfile.TemporaryDirectory() as cache:
    # This tree's jt_dist, also for scripts run from elsewhere.
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH"))
                           if p)
    env = dict(os.environ, JT_DIST_CACHE_DIR=cache, PYTHONPATH=path)
    return subprocess.run([sys.executable, *argv], capture_output=True,
                          cwd=_ROOT, env=env, timeout=600, check=False)


class DropHarmlessLinesTest(parameterized.TestCase):

  @parameterized.parameters(b"\n", b"\r\n")
  def test_drops_exactly_the_start_up_lines(self, end):
    kept = [b"W1123 a warning of jax's" + end, b"Traceback: ..." + end,
            b"x " + _ABSL + end, _CUDART + b" (more)" + end]
    data = b"".join([_ABSL + end, kept[0], _CUDART + end, kept[1], _ABSL + end,
                     _CUDART + end, kept[2], kept[3]])
    self.assertEqual(_jax_import.drop_harmless_lines(data), b"".join(kept))

  def test_keeps_a_last_line_without_newline(self):
    self.assertEqual(_jax_import.drop_harmless_lines(_ABSL + b"\nend"), b"end")

  def test_filters_a_descriptor_and_restores_it(self):
    with tempfile.TemporaryFile() as target:
      fd = target.fileno()
      os.write(fd, b"before\n")
      with _jax_import.harmless_lines_dropped(fd):
        os.write(fd, _ABSL + b"\nduring\n" + _CUDART + b"\n")
      os.write(fd, _ABSL + b"\n")  # After: no longer filtered.
      target.seek(0)
      self.assertEqual(target.read(), b"before\nduring\n" + _ABSL + b"\n")


class QuietStartTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if _jax_import.has_nvidia_devices():
      self.skipTest("checks hosts without GPUs, where jax's start-up lines"
                    " are known to be harmless; this host has NVIDIA devices")

  def test_import_and_call_write_nothing_to_stderr(self):
    # From a file: Triton reads a kernel's source.
    with tempfile.TemporaryDirectory() as folder:
      script = os.path.join(folder, "call.py")
      with open(script, "w", encoding="utf-8") as f:
        f.write(_CALL)
      result = _run([script])
    self.assertEqual(result.returncode, 0, result.stderr.decode())
    self.assertEqual(result.stdout, b"ok\n")
    self.assertEqual(result.stderr, b"")

  def test_readme_demo_writes_nothing_to_stderr(self):
    # The README's first command. The other examples import as it does;
    # tests/examples_test.py runs each (forked) for what it writes later.
    result = _run([os.path.join("examples", "sharded_add.py")])
    self.assertEqual(result.returncode, 0, result.stderr.decode())
    self.assertIn(b"max |error|", result.stdout)
    self.assertEqual(result.stderr, b"")

  def test_other_stderr_output_of_the_import_is_kept(self):
    # A warning raised while jax is imported still reaches stderr.
    code = ("import warnings, sys\n"
            "class Hook:\n"
            "  def find_spec(self, name, path=None, target=None):\n"
            "    if name == 'jax.numpy':\n"
            "      warnings.warn('seen during import')\n"
            "    return None\n"
            "sys.meta_path.insert(0, Hook())\n"
            "import jt_dist\n")
    result = _run(["-c", code])
    self.assertEqual(result.returncode, 0, result.stderr.decode())
    self.assertIn(b"UserWarning: seen during import", result.stderr)
    self.assertNotIn(b"cudart_stub", result.stderr)
    self.assertNotIn(b"absl::InitializeLog", result.stderr)


if __name__ == "__main__":
  absltest.main()
