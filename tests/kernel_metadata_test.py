"""``jt_dist.kernel_metadata``: what ``kernel.warmup(...)`` reports.

On the CPU the answer is the documented one; on a GPU the kernel is
compiled for it and its registers read through Triton's driver.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position


@triton.jit
def _copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def _stages_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr,
                   num_stages: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * num_stages)


_X = jax.ShapeDtypeStruct((1000,), jnp.float32)


class KernelMetadataTest(testing.TestCase):

  def test_a_plain_kernel(self):
    info = jt_dist.kernel_metadata(_copy_kernel, _X, 1000, out_shape=_X,
                                   BLOCK=128, num_warps=8, num_stages=2)
    self.assertIsInstance(info, jt_dist.KernelMetadata)
    self.assertEqual((info.num_warps, info.num_stages, info.num_ctas),
                     (8, 2, 1))
    if testing.platform() == "cpu":
      self.assertEqual((info.target, info.shared, info.n_regs, info.n_spills,
                        info.warp_size), ("cpu", 0, None, None, None))
    else:
      self.assertGreater(info.n_regs, 0)
      self.assertEqual(info.warp_size, 32)

  def test_a_launch_option_naming_a_parameter_binds_it(self):
    # Tutorial 02 asks warmup() of a softmax taking num_stages as both.
    info = jt_dist.kernel_metadata(_stages_kernel, _X, out_shape=_X,
                                   BLOCK=128, num_stages=2)
    self.assertEqual(info.num_stages, 2)

  def test_an_autotuned_kernel_gives_one_per_config_as_triton(self):
    kernel = triton.autotune(
        [triton.Config({"BLOCK": 128}, num_warps=2),
         triton.Config({"BLOCK": 256}, num_warps=8)], key=["n"])(_copy_kernel)
    infos = jt_dist.kernel_metadata(kernel, _X, 1000, out_shape=_X)
    self.assertEqual([i.num_warps for i in infos], [2, 8])
    self.assertTrue(infos[1].config.startswith("BLOCK: 256, num_warps: 8"))

  def test_at_trace_time(self):
    seen = []

    def f(x):
      seen.append(jt_dist.kernel_metadata(_copy_kernel, x, x.size,
                                          out_shape=x, BLOCK=128))
      return x

    jax.jit(f).trace(jnp.zeros((1000,), jnp.float32))
    self.assertEqual(seen[0].name, "_copy_kernel")

  def test_binding_errors_are_triton_calls(self):
    with self.assertRaisesRegex(jt_dist.KernelBindingError, "BLOCK"):
      jt_dist.kernel_metadata(_copy_kernel, _X, 1000, out_shape=_X)


if __name__ == "__main__":
  absltest.main()
