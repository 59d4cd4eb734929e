"""Outputs of every rank, 0-d included, and zero-size arrays."""

from __future__ import annotations

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util
from feature_kernels import copy_kernel
from feature_kernels import unmasked_copy_kernel

testing.configure_cpu_devices()


@triton.jit
def sum_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
  tl.store(out_ptr, tl.sum(x, axis=0))


def _copy(x):
  return jt_dist.triton_call(
      x, x.size, kernel=copy_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),), BLOCK=32)


def _sum(x, **options):
  return jt_dist.triton_call(
      x, x.size, kernel=sum_kernel,
      out_shape=jax.ShapeDtypeStruct((), x.dtype), grid=(1,), BLOCK=128,
      **options)


class OutputShapesTest(testing.TestCase):

  @parameterized.parameters(((),), ((7,),), ((3, 5),), ((2, 3, 4),),
                            ((2, 1, 3, 2),))
  def test_outputs_of_every_rank(self, shape):
    x = self.random(shape)
    for f in (_copy, jax.jit(_copy)):
      out = f(jnp.asarray(x))
      self.assertEqual(out.shape, shape)
      self.assertAllClose(out, x)

  @parameterized.parameters(np.float32, np.int32)
  def test_zero_dimensional_output(self, dtype):
    x = self.random((100,), dtype)
    for f in (_sum, jax.jit(_sum)):
      out = f(jnp.asarray(x))
      self.assertEqual(out.shape, ())
      self.assertAllClose(out, x.sum(dtype=dtype), rtol=1e-5, atol=1e-4)

  @parameterized.parameters(((0,),), ((4, 0),), ((0, 3, 2),))
  def test_zero_size_outputs_launch_nothing(self, shape):
    x = jnp.asarray(self.random((16,)))
    call = lambda x: jt_dist.triton_call(
        x, kernel=unmasked_copy_kernel,
        out_shape=jax.ShapeDtypeStruct(shape, x.dtype),
        # A grid computed from the size rounds to 0 blocks.
        grid=lambda meta: (triton.cdiv(0, 16),), BLOCK=16)
    for f in (call, jax.jit(call)):
      out = f(x)
      self.assertEqual(out.shape, shape)
      self.assertEqual(out.dtype, jnp.float32)

  def test_empty_outputs_live_beside_the_inputs(self):
    device = self.devices()[-1]
    x = jax.device_put(jnp.asarray(self.random((16,))), device)
    out = jt_dist.triton_call(
        x, kernel=unmasked_copy_kernel,
        out_shape=jax.ShapeDtypeStruct((0,), x.dtype), grid=(1,), BLOCK=16)
    self.assertEqual(out.devices(), {device})

  def test_zero_size_input_and_output(self):
    out = jax.jit(_copy)(jnp.zeros((3, 0), jnp.float32))
    self.assertEqual(out.shape, (3, 0))

  def test_zero_size_input_with_an_output(self):
    out = _sum(jnp.zeros((0,), jnp.float32))
    self.assertEqual(out.shape, ())
    self.assertEqual(float(out), 0.0)

  def test_empty_outputs_still_check_the_binding(self):
    with self.assertRaisesRegex(jt_dist.KernelBindingError, "sum_kernel"):
      jt_dist.triton_call(
          jnp.zeros((0,)), kernel=sum_kernel,
          out_shape=jax.ShapeDtypeStruct((0,), jnp.float32), grid=(1,),
          BLOCK=128)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaOutputShapesTest(util.IsolatedCacheMixin, testing.TestCase):
  """The same shapes, cross-lowered for CUDA on any host."""

  def _lower(self, f, *args):
    return jax.jit(lambda *a: f(*a)).trace(*args).lower(
        lowering_platforms=("cuda",))

  def test_zero_dimensional_output_lowers_to_one_kernel_call(self):
    x = jnp.asarray(self.random((100,)))
    lowered = self._lower(lambda x: _sum(x, compute_capability=90), x)
    (call,) = util.triton_custom_calls(lowered)
    self.assertTrue(call)
    self.assertIn("-> tensor<f32>", lowered.as_text())

  def test_zero_size_output_lowers_to_no_kernel_call(self):
    x = jnp.asarray(self.random((16,)))
    lowered = self._lower(
        lambda x: jt_dist.triton_call(
            x, kernel=unmasked_copy_kernel,
            out_shape=jax.ShapeDtypeStruct((0, 4), x.dtype), grid=(1,),
            BLOCK=16, compute_capability=90), x)
    self.assertEqual(util.triton_custom_calls(lowered), [])
    self.assertIn("tensor<0x4xf32>", lowered.as_text())


if __name__ == "__main__":
  absltest.main()
