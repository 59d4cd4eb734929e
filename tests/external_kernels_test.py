"""The external-kernels yardstick's quick mode, on the CPU.

benchmarks/external_kernels.py runs Triton's tutorials and Liger-Kernel's
kernels unchanged; here a few that pass run at small sizes, and a kernel
that cannot pass is reported with its reason rather than hidden. Liger's
cases run where its source is installed (pip install --no-deps
liger-kernel==0.8.5).
"""

import importlib
import importlib.util
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import testing

testing.configure_cpu_devices()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _yardstick():
  sys.path.insert(0, os.path.join(_ROOT, "benchmarks"))
  try:
    return importlib.import_module("external_kernels")
  finally:
    sys.path.pop(0)


def _liger_source():
  spec = importlib.util.find_spec("liger_kernel")
  if spec is None or not spec.submodule_search_locations:
    return None
  return os.path.dirname(list(spec.submodule_search_locations)[0])


class ExternalKernelsTest(testing.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.yardstick = _yardstick()
    if not os.path.isdir(cls.yardstick.TUTORIALS):
      raise absltest.SkipTest("Triton's tutorials are not beside this tree")

  @parameterized.parameters("01 vector add", "05 layer norm forward",
                            "09 matmul, device descriptors")
  def test_a_tutorial_kernel_passes_unchanged(self, name):
    result = self.yardstick.run_case(name, None, small=True)
    self.assertEqual(result["result"], "pass", result)
    self.assertEqual(result["unchanged"], "yes")

  @parameterized.parameters("liger rope", "liger cross_entropy",
                            "liger softmax (single block)")
  def test_a_liger_kernel_passes_unchanged(self, name):
    if (source := _liger_source()) is None:
      self.skipTest("liger_kernel is not installed")
    result = self.yardstick.run_case(name, source, small=True)
    self.assertEqual(result["result"], "pass", result)

  def test_a_kernel_that_cannot_pass_is_reported_with_its_reason(self):
    result = self.yardstick.run_case("08 grouped GEMM", None, small=True)
    self.assertEqual((result["result"], result["unchanged"]), ("fails", "no"))
    self.assertEqual(result["why"], "device pointer arrays: a documented"
                     " limit")
    self.assertIn("data_ptr", result["detail"])

  def test_the_loader_keeps_the_kernels_as_written(self):
    path = os.path.join(self.yardstick.TUTORIALS, "01-vector-add.py")
    kernel = self.yardstick.load(path)["add_kernel"]
    self.assertEqual(kernel.fn.__code__.co_filename, path)
    self.assertIn(kernel.src.strip().splitlines()[0], open(path).read())


if __name__ == "__main__":
  absltest.main()
