"""Runs each example's ``main()``: on the CPU, through Triton's interpreter.

Each runs on the devices ``python examples/<name>.py`` uses: every GPU, or
8 virtual CPU devices on a host without GPUs; with a fresh seed here (the
scripts default to seed 0). Each script also runs as a user runs it, in a
fresh process, and must write nothing to stderr (on a host with JAX's CUDA
plugin and no GPU, importing jax before jt_dist would).
"""

import importlib.util
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax

from jt_dist import testing
import gpu_lowering_util
import script_util

testing.configure_cpu_devices()

_EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load(name):
  # Loaded by path: examples/ is a directory of scripts, not a package.
  spec = importlib.util.spec_from_file_location(
      f"jt_dist_example_{name}", os.path.join(_EXAMPLES, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# Scripts whose command line is the interface, run by their own tests.
_TESTED_ELSEWHERE = {
    "export_kernel": "tests/export_test.py runs its --save and --run",
}
_NAMES = sorted(name for name in (os.path.splitext(f)[0]
                                  for f in os.listdir(_EXAMPLES)
                                  if f.endswith(".py"))
                if name not in _TESTED_ELSEWHERE)


class ExamplesTest(testing.TestCase):

  def test_every_example_is_run(self):
    self.assertCountEqual(_NAMES + sorted(_TESTED_ELSEWHERE), [
        "add", "auto_partitioned_matmul", "causal_attention",
        "data_parallel_training",
        "export_kernel", "layernorm_training", "matmul", "sharded_add", "sharded_attention",
        "seeded_dropout", "sharded_matmul", "softmax"])

  @parameterized.parameters(*_NAMES)
  def test_example_main(self, name):
    if testing.platform() == "cpu" and "JT_DIST_CPU_DEVICES" not in os.environ:
      self.assertLen(jax.devices(), 8)  # As the scripts have on this host.
    module = _load(name)
    # Each main() asserts its result against NumPy or JAX and returns it.
    self.assertIsNotNone(module.main(seed=self.seed),
                         f"{name}, seed {self.seed}")

  def test_add_on_odd_size(self):
    self.assertEqual(_load("add").main(n=1001, seed=self.seed), 0.0)

  def test_matmul_on_ragged_shape(self):
    # GPUs compute a float32 tl.dot in TF32 (10-bit mantissa) by default.
    bound = 1e-3 if testing.platform() == "cpu" else 5e-2
    self.assertLess(_load("matmul").main(m=20, n=36, k=24, seed=self.seed), bound)

  def test_softmax_on_ragged_shape(self):
    self.assertLess(_load("softmax").main(n_rows=3, n_cols=33, seed=self.seed), 1e-6)


class ScriptsTest(parameterized.TestCase):
  """``python examples/<name>.py``, as the examples' docstrings say."""

  def _run_quietly(self, name, *args):
    path = os.path.join("examples", f"{name}.py")
    result = script_util.run_python([path, *args])
    script_util.assert_quiet_success(
        self, result, " ".join(["python", path, *args]))

  @parameterized.named_parameters(*((name, name) for name in sorted(
      os.path.splitext(f)[0] for f in os.listdir(_EXAMPLES)
      if f.endswith(".py"))))
  def test_script_writes_nothing_to_stderr(self, name):
    if name != "export_kernel":
      self._run_quietly(name)
      return
    if not gpu_lowering_util.HAS_TRITON_CALL:
      self.skipTest(gpu_lowering_util.SKIP_REASON)
    on_gpu = testing.platform() == "gpu"
    # For this host's GPU, which then runs them; else for sm_90.
    capability = (int(float(jax.devices()[0].compute_capability) * 10)
                  if on_gpu else 90)
    with tempfile.TemporaryDirectory() as folder:
      self._run_quietly(name, "--save", folder, "--compute-capability",
                        str(capability))
      self.assertLen(os.listdir(folder), 2)  # PTX, and PTX with a CUBIN.
      if on_gpu:
        self._run_quietly(name, "--run", folder)


if __name__ == "__main__":
  absltest.main()
