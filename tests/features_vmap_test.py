"""jax-triton 0.4's features under ``jax.vmap``, both batching methods.

Fills the gaps beside each feature's own tests: the 0.4 aliasing convention
with ``zeroed_outputs``, keyword operands in one batched launch, float
scalars typed fp32/fp64, a ``TensorDescriptor`` on the batched grid (refused)
and clusters (refused on the CPU; cross-lowered for CUDA with
``backend_options``, where jaxlib's CUDA plugin is installed).
"""

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import acc_sum_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import desc_copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import wide_scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 16
_BLOCK = 8
_METHODS = ("grid", "sequential")


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _launches(f, *args):
  return testing.kernel_launches(jax.jit(f).lower(*args).as_text())


def _add(x, y, **options):
  return jt_dist.triton_call(
      x, n=_N, y_ptr=y, kernel=add_kernel, out_shape=_like(x),
      grid=(_N // _BLOCK,), BLOCK=_BLOCK, **options)


class FeaturesVmapTest(testing.TestCase):

  def assertLaunches(self, method, f, *args):
    # One batched launch on the grid; a loop of launches otherwise.
    if method == "grid":
      self.assertEqual(_launches(f, *args), 1)

  @parameterized.product(method=_METHODS, acc_batched=[False, True],
                         zeroed=[(1,), (0, 1)])
  def test_04_aliasing_with_zeroed_outputs(self, method, acc_batched, zeroed):
    xs = self.random((3, _N))
    acc = self.random((3, _N) if acc_batched else (_N,))

    def f(x, a):
      return jt_dist.triton_call(
          x, a, _N, kernel=acc_sum_kernel,
          out_shape=(_like(a), jax.ShapeDtypeStruct((1,), jnp.float32)),
          grid=(_N // _BLOCK,), BLOCK=_BLOCK, input_output_aliases={1: 0},
          zeroed_outputs=zeroed, vmap_method=method)

    f = jax.vmap(f, in_axes=(0, 0 if acc_batched else None))
    self.assertLaunches(method, f, xs, acc)
    new_acc, total = f(xs, acc)
    self.assertAllClose(new_acc, xs if 0 in zeroed else xs + acc)
    self.assertAllClose(total[:, 0], xs.sum(axis=1), rtol=1e-4, atol=1e-4)

  @parameterized.parameters(*_METHODS)
  def test_keyword_operands(self, method):
    x, ys = self.random((_N,)), self.random((3, _N))
    f = jax.vmap(lambda y: _add(x, y, vmap_method=method))
    self.assertLaunches(method, f, ys)
    self.assertAllClose(f(ys), x + ys)
    both = jax.vmap(lambda a, b: _add(a, b, vmap_method=method))
    self.assertAllClose(both(ys, ys[::-1]), ys + ys[::-1])

  @parameterized.parameters(*_METHODS)
  def test_float_scalars_keep_their_width(self, method):
    xs = self.random((3, _N))
    big = float(10.0 ** self.np_rng.uniform(40, 300))
    small = float(self.np_rng.uniform(0.5, 2)) / big
    scale = float(self.np_rng.uniform(1, 3))
    f = jax.vmap(lambda x: jt_dist.triton_call(
        x, big, small, scale, _N, kernel=wide_scale_kernel,
        out_shape=_like(x), grid=(_N // _BLOCK,), BLOCK=_BLOCK,
        vmap_method=method))
    self.assertLaunches(method, f, xs)
    expected = (np.asarray(xs, np.float64) * big * small).astype(
        np.float32) * np.float32(scale)
    self.assertAllClose(f(xs), expected, rtol=1e-6)

  def test_tensor_descriptor_on_the_grid_is_refused(self):
    xs = jnp.asarray(self.random((3, 8, 16)))
    with self.assertRaises(NotImplementedError) as cm:
      jax.vmap(lambda a: jt_dist.triton_call(
          jt_dist.TensorDescriptor.from_array(a, (8, 16)),
          kernel=desc_copy_kernel, out_shape=_like(a), grid=1, M=8, N=16,
          vmap_method="grid"))(xs)
    for part in ("vmap_method='grid' cannot batch kernel 'desc_copy_kernel'",
                 "TensorDescriptor", "vmap_method='sequential'"):
      self.assertIn(part, str(cm.exception))

  @parameterized.parameters({"num_ctas": 2},
                            {"backend_options": {"num_ctas": 4}})
  def test_clusters_are_refused_on_the_cpu(self, **options):
    if testing.platform() != "cpu":
      self.skipTest("the refusal is the CPU interpreter's; GPUs are checked"
                    " by CudaLoweringTest")
    xs = self.random((3, _N))
    for method in _METHODS:
      with self.subTest(method), self.assertRaises(ValueError) as cm:
        jax.vmap(lambda x: _add(x, x, vmap_method=method, **options))(xs)
      for part in ("kernel 'add_kernel' asks for num_ctas=",
                   "clusters are not available on the CPU"):
        self.assertIn(part, str(cm.exception))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.IsolatedCacheMixin, testing.TestCase):
  """The batched custom call, cross-lowered for CUDA (sm_90)."""

  @parameterized.parameters(*_METHODS)
  def test_options_and_clusters_survive_vmap(self, method):
    xs = jnp.asarray(self.random((5, _N)))
    f = jax.vmap(lambda x: jt_dist.triton_call(
        x, 1e300, 1e-300, 2.0, _N, kernel=wide_scale_kernel,
        out_shape=_like(x), grid=(_N // _BLOCK,), BLOCK=_BLOCK,
        compute_capability=90, vmap_method=method,
        backend_options={"maxnreg": 32, "num_ctas": 2, "num_warps": 2}))
    calls = util.triton_custom_calls(util.lower(f, xs))
    self.assertNotEmpty(calls)
    kernel = calls[0]["calls"][0]
    self.assertIn(".maxnreg 32", kernel["ptx"])
    self.assertEqual((kernel["num_ctas"], kernel["num_warps"]), (2, 2))
    self.assertEqual(kernel["grid"],
                     (_N // _BLOCK, 5 if method == "grid" else 1, 1))
    self.assertEqual(kernel["params"][1:4],
                     [("other", [8]), ("other", [8]), ("f32", 2.0)])


if __name__ == "__main__":
  absltest.main()
