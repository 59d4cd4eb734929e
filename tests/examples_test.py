"""Runs each example's ``main()``: on the CPU, through Triton's interpreter."""

import importlib.util
import os

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import testing

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


class ExamplesTest(testing.TestCase):

  @parameterized.parameters("add", "auto_partitioned_matmul", "matmul",
                            "softmax")
  def test_example_main(self, name):
    module = _load(name)
    error = module.main()
    self.assertIsNotNone(error)

  def test_add_on_odd_size(self):
    self.assertEqual(_load("add").main(n=1001), 0.0)

  def test_matmul_on_ragged_shape(self):
    # GPUs compute a float32 tl.dot in TF32 (10-bit mantissa) by default.
    bound = 1e-3 if testing.platform() == "cpu" else 5e-2
    self.assertLess(_load("matmul").main(m=20, n=36, k=24), bound)

  def test_softmax_on_ragged_shape(self):
    self.assertLess(_load("softmax").main(n_rows=3, n_cols=33), 1e-6)


if __name__ == "__main__":
  absltest.main()
