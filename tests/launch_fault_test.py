"""A device fault reported by jaxlib names the kernel and launch behind it."""

from __future__ import annotations

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

_ILLEGAL = ("INTERNAL: Failed to launch: CUDA_ERROR_ILLEGAL_ADDRESS: an"
            " illegal memory access was encountered")


def scale_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # Undecorated: each test jits its own (see LaunchFaultTest.setUp).
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 3,
           mask=mask)


def _scale(x, kernel, **options):
  return jt_dist.triton_call(
      x, x.size, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(4,), BLOCK=32,
      name="scaler", **options)


def _failing_jit(message):
  """Stands in for jax.jit: the function it makes fails as jaxlib would."""
  def run(*args):
    del args
    raise jax.errors.JaxRuntimeError(message)
  return lambda fn, **kwargs: run


class LaunchFaultTest(testing.TestCase):
  """jaxlib's runtime error is simulated: a real one needs a faulty GPU run."""

  def setUp(self):
    super().setUp()
    # A call keeps the jitted function it was made with, mocked or not: a
    # kernel of its own keeps each test's calls apart from every other's.
    self.kernel = triton.jit(scale_kernel)

  @parameterized.parameters(
      _ILLEGAL, "INTERNAL: hipErrorLaunchFailure: unspecified launch failure",
      "INTERNAL: CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address")
  def test_device_fault_names_kernel_and_launch(self, message):
    x = jnp.asarray(self.random((100,)))
    with mock.patch.object(jax, "jit", _failing_jit(message)):
      with self.assertRaises(jt_dist.KernelLaunchError) as caught:
        _scale(x, self.kernel)
    text = str(caught.exception)
    for part in ("kernel 'scale_kernel'", "name='scaler'", "grid (4,)",
                 "{'BLOCK': 32}", "num_warps=", "JT_DIST_SYNC_LAUNCHES=1",
                 "launched before it", message):
      self.assertIn(part, text)
    self.assertIsInstance(caught.exception.__cause__,
                          jax.errors.JaxRuntimeError)

  def test_other_errors_pass_through(self):
    x = jnp.asarray(self.random((100,)))
    with mock.patch.object(jax, "jit",
                           _failing_jit("RESOURCE_EXHAUSTED: oom")):
      with self.assertRaisesRegex(jax.errors.JaxRuntimeError,
                                  "RESOURCE_EXHAUSTED"):
        _scale(x, self.kernel)

  def test_synced_launches_wait_and_blame_this_call(self):
    x = self.random((100,))
    waited = []

    def block(outs):
      waited.append(outs)
      raise jax.errors.JaxRuntimeError(_ILLEGAL)

    with mock.patch.dict(os.environ, {"JT_DIST_SYNC_LAUNCHES": "1"}):
      # The setting is read when a call is first made.
      self.kernel = triton.jit(scale_kernel)
      with mock.patch.object(jax, "block_until_ready", block):
        with self.assertRaisesRegex(jt_dist.KernelLaunchError,
                                    "fault in this call's kernel"):
          _scale(jnp.asarray(x), self.kernel)
      self.assertLen(waited, 1)
      self.assertAllClose(_scale(jnp.asarray(x), self.kernel), x * 3)


if __name__ == "__main__":
  absltest.main()
