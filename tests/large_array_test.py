"""Arrays of more than 2**31 elements, on a GPU.

A kernel that indexes such an array must compute its offsets in 64 bits:
``tl.program_id(0) * BLOCK`` is an int32 product and wraps past 2**31 - 1.
These tests run kernels that ask for int64 offsets on int8 and bfloat16
arrays of 2**31 + 2**20 elements and compare with XLA on the device.
"""

from __future__ import annotations

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

_N = 2**31 + 2**20
_BLOCK = 4096


@triton.jit
def twice_plus_one_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # int64 offsets: pid * BLOCK reaches past 2**31 - 1 on these arrays.
  offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x * 2 + 1, mask=mask)


def _twice_plus_one(x):
  return jt_dist.triton_call(
      x, x.size, kernel=twice_plus_one_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
      BLOCK=_BLOCK)


class LargeArrayTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if testing.platform() != "gpu":
      self.skipTest(
          "needs a GPU: arrays of more than 2**31 elements take GiBs, and the"
          " CPU interpreter would run 500k+ program instances; the int32"
          " overflow pattern is checked at small scale in bounds_check_test")

  def _random(self, dtype):
    key = jax.random.key(self.seed)
    if dtype == jnp.int8:
      return jax.random.randint(key, (_N,), -128, 128, dtype=jnp.int8)
    return jax.random.normal(key, (_N,), dtype=jnp.bfloat16)

  @parameterized.parameters(jnp.int8, jnp.bfloat16)
  def test_more_than_2_31_elements_with_int64_offsets(self, dtype):
    x = self._random(dtype)
    self.assertGreater(x.size, 2**31)
    out = jax.jit(_twice_plus_one)(x)
    expected = x * jnp.asarray(2, dtype) + jnp.asarray(1, dtype)
    mismatches = int(jnp.sum(out != expected))
    self.assertEqual(mismatches, 0, f"seed {self.seed}")
    # The elements past 2**31 are where int32 offsets would have wrapped.
    tail = slice(2**31 - 8, 2**31 + 8)
    np.testing.assert_array_equal(
        np.asarray(out[tail]).astype(np.float32),
        np.asarray(expected[tail]).astype(np.float32))
    del x, out, expected


if __name__ == "__main__":
  absltest.main()
