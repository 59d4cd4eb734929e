"""jax-triton's helper names: cdiv, next_power_of_2, strides_from_shape,
get_compute_capability."""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import jt_dist
from jt_dist import testing


class HelpersTest(testing.TestCase):

  def test_cdiv_matches_ceil_division(self):
    rng = np.random.default_rng(self.seed)
    for x, y in rng.integers(0, 10_000, size=(50, 2)):
      y = int(y) + 1
      self.assertEqual(jt_dist.cdiv(int(x), y), int(np.ceil(int(x) / y)))
    self.assertEqual(jt_dist.cdiv(np.int64(1000), 128), 8)

  def test_next_power_of_2(self):
    rng = np.random.default_rng(self.seed)
    for x in rng.integers(2, 1 << 20, size=50):
      got = jt_dist.next_power_of_2(int(x))
      self.assertEqual(got & (got - 1), 0)
      self.assertGreaterEqual(got, x)
      self.assertLess(got // 2, x)
    self.assertEqual([jt_dist.next_power_of_2(v) for v in (0, 1, 2, 128)],
                     [1, 1, 2, 128])

  def test_strides_from_shape_match_numpy(self):
    rng = np.random.default_rng(self.seed)
    for ndim in range(5):
      shape = tuple(int(d) for d in rng.integers(1, 6, size=ndim))
      expected = tuple(s // 4 for s in np.zeros(shape, np.float32).strides)
      self.assertEqual(jt_dist.strides_from_shape(shape), expected)
    self.assertEqual(jt_dist.strides_from_shape([4, 0, 2]), (0, 2, 1))

  @parameterized.parameters(
      (lambda: jt_dist.cdiv(1.5, 2), TypeError, "cdiv: x=1.5 of type float"),
      (lambda: jt_dist.cdiv(4, 0), ValueError, "cdiv: y=0 must be at least 1"),
      (lambda: jt_dist.cdiv(True, 2), TypeError, "cdiv: x=True of type bool"),
      (lambda: jt_dist.next_power_of_2(-3), ValueError,
       "next_power_of_2: x=-3 must be at least 0"),
      (lambda: jt_dist.strides_from_shape("ab"), TypeError,
       "strides_from_shape: shape='ab' of type str must be a tuple of ints"),
      (lambda: jt_dist.strides_from_shape((2, -1)), ValueError,
       r"strides_from_shape: shape\[1\]=-1 must be at least 0"),
  )
  def test_bad_input_names_the_argument(self, call, error, words):
    with self.assertRaisesRegex(error, words):
      call()

  def test_compute_capability_of_a_cuda_device(self):
    fake = mock.create_autospec(jax.Device, instance=True)
    fake.platform = "gpu"
    fake.compute_capability = "9.0"
    self.assertEqual(jt_dist.get_compute_capability(fake), 90)
    with mock.patch.object(jax, "local_devices", return_value=[fake]):
      self.assertEqual(jt_dist.get_compute_capability(0), 90)

  def test_compute_capability_refuses_a_cpu_device(self):
    cpu = jax.devices("cpu")[0]
    with self.assertRaisesRegex(ValueError, r"is not a CUDA GPU.*compute_capability="):
      jt_dist.get_compute_capability(cpu)

  def test_compute_capability_index_out_of_range(self):
    n = len(jax.local_devices())
    with self.assertRaisesRegex(
        ValueError, f"device={n} is out of range: this process has {n}"):
      jt_dist.get_compute_capability(n)
    with self.assertRaisesRegex(TypeError, "device='0' of type str"):
      jt_dist.get_compute_capability("0")


if __name__ == "__main__":
  absltest.main()
