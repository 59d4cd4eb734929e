"""Gluon kernels and thread-block clusters (``num_ctas > 1``).

Neither runs on Triton's interpreter: on the CPU both are refused when the
call is lowered, with the kernel named. On GPUs they are checked by
cross-lowering for CUDA where jaxlib's CUDA plugin is installed.
"""

from __future__ import annotations

import os
import re
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
import triton.language as tl

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util
from feature_kernels import copy_kernel
from feature_kernels import gluon_copy_kernel


@gluon.jit
def gluon_future_api_kernel(in_ptr, out_ptr):
  value = gl.jt_dist_test_api_from_the_future(gl.load(in_ptr))
  gl.store(out_ptr, value)


@triton.jit
def tripwire_kernel(in_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # Fails the call (debug=True) if it ever runs: a refusal must come before
  # the launch.
  tl.device_assert(tl.program_id(0) < 0, "tripwire_kernel ran")


def _host_tma_copy_kernel():
  """A Gluon copy through a host TMA descriptor, where Triton has it."""
  from triton.experimental.gluon.language.nvidia import hopper  # pylint: disable=g-import-not-at-top
  if not hasattr(hopper.mbarrier, "allocate_mbarrier"):
    return None  # Triton 3.6.

  @gluon.jit
  def tma_copy(in_desc, out_ptr, M: gl.constexpr, N: gl.constexpr):
    out_desc = hopper.tma.make_tensor_descriptor(
        out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N],
        layout=in_desc.layout)
    smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
    bar = hopper.mbarrier.allocate_mbarrier()
    hopper.mbarrier.init(bar, count=1)
    hopper.mbarrier.expect(bar, bytes_per_cta=in_desc.nbytes_per_cta)
    hopper.tma.async_load(in_desc, [0, 0], bar, smem)
    hopper.mbarrier.wait(bar, phase=0)
    hopper.mbarrier.invalidate(bar)
    hopper.tma.async_store(out_desc, [0, 0], smem)
    hopper.tma.store_wait(0)

  return tma_copy


def _gluon_copy(x, **options):
  return jt_dist.triton_call(
      x, kernel=gluon_copy_kernel, out_shape=x, grid=(triton.cdiv(x.size, 64),),
      size=x.size, block=64, num_warps=1, **options)


def _copy(x, kernel=copy_kernel, **options):
  return jt_dist.triton_call(
      x, x.size, kernel=kernel, out_shape=x,
      grid=(triton.cdiv(x.size, 32),), BLOCK=32, **options)


class CpuRefusalTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("the refusals are the CPU interpreter's")
    jax.clear_caches()

  def _assert_refused_when_lowered(self, f, *args, message):
    # Lowering runs nothing: a refusal there comes before any launch.
    with self.assertRaisesRegex(NotImplementedError, message):
      jax.jit(f).trace(*args).lower()

  @parameterized.parameters(False, True)
  def test_gluon_kernel_is_refused(self, jit):
    x = jnp.asarray(self.random((100,)))
    message = (r"kernel 'gluon_copy_kernel' is a Gluon kernel.*interpreter"
               r" cannot run Gluon")
    self._assert_refused_when_lowered(_gluon_copy, x, message=message)
    f = jax.jit(_gluon_copy) if jit else _gluon_copy
    with self.assertRaisesRegex(NotImplementedError, message):
      f(x)

  def test_eager_gluon_call_is_refused_before_it_runs(self):
    x = jnp.asarray(self.random((100,)))
    message = "'gluon_copy_kernel' is a Gluon kernel"
    self._assert_refused_when_lowered(_gluon_copy, x, message=message)
    with self.assertRaisesRegex(NotImplementedError, message):
      _gluon_copy(x)

  def test_gluon_kernel_is_refused_under_vmap_and_shard_map(self):
    x = jnp.asarray(self.random((2, 64)))
    self._assert_refused_when_lowered(jax.vmap(_gluon_copy), x,
                                      message="gluon_copy_kernel")
    with self.assertRaisesRegex(NotImplementedError, "gluon_copy_kernel"):
      jax.vmap(_gluon_copy)(x)
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    spec = jax.sharding.PartitionSpec("i")
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
    sharded = jax.shard_map(lambda a: _gluon_copy(a[0]), mesh=mesh,
                            in_specs=spec, out_specs=spec)
    self._assert_refused_when_lowered(sharded, x, message="gluon_copy_kernel")
    with self.assertRaisesRegex(NotImplementedError, "gluon_copy_kernel"):
      jax.jit(sharded)(x)

  def test_tripwire_fires_when_run(self):
    # What the refusals below would raise had the kernel run.
    x = jnp.asarray(self.random((100,)))
    with self.assertRaisesRegex(jt_dist.KernelAssertionError,
                                "tripwire_kernel ran"):
      _copy(x, kernel=tripwire_kernel, num_ctas=1, debug=True)

  @parameterized.parameters({"num_ctas": 2}, {"backend_options": {"num_ctas": 4}})
  def test_clusters_are_refused(self, **options):
    x = jnp.asarray(self.random((100,)))
    with self.assertRaisesRegex(
        ValueError, r"kernel 'tripwire_kernel' asks for num_ctas=\d.*clusters"
        r" are not available on the CPU"):
      _copy(x, kernel=tripwire_kernel, debug=True, **options)

  def test_autotuned_cluster_config_is_refused(self):
    tuned = triton.autotune(
        [triton.Config({"BLOCK": 32}, num_ctas=2)], key=["n"])(copy_kernel)
    x = jnp.asarray(self.random((100,)))
    with self.assertRaisesRegex(ValueError, r"num_ctas=2 \(config: BLOCK: 32"):
      jt_dist.triton_call(x, x.size, kernel=tuned, out_shape=x,
                          grid=lambda meta: (triton.cdiv(100, meta["BLOCK"]),))

  def test_one_cta_still_runs(self):
    x = jnp.asarray(self.random((100,)))
    self.assertAllClose(_copy(x, num_ctas=1), x)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaTest(util.IsolatedCacheMixin, testing.TestCase):

  @parameterized.parameters(80, 90)
  def test_gluon_kernel_compiles_with_gluon_stages(self, cc):
    x = jnp.asarray(self.random((100,)))
    with tempfile.TemporaryDirectory() as dump:
      with mock.patch.dict(os.environ, {"JT_DIST_DUMP_DIR": dump}):
        (call,) = util.triton_custom_calls(util.lower(
            lambda a: _gluon_copy(a, compute_capability=cc), x))
      (folder,) = os.listdir(dump)
      files = set(os.listdir(os.path.join(dump, folder)))
    # Gluon starts from its own IR and skips Triton's TTIR-to-TTGIR stage.
    self.assertNotIn("gluon_copy_kernel.ttir", files)
    self.assertIn("gluon_copy_kernel.ttgir", files)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "gluon_copy_kernel")
    self.assertEqual((kernel["num_warps"], kernel["grid"]), (1, (2, 1, 1)))
    self.assertIn(f".target sm_{cc}", kernel["ptx"])
    self.assertEqual(kernel["params"], [("array", 0, 16)] * 2)

  def test_gluon_api_this_triton_lacks_names_the_version(self):
    x = jnp.asarray(self.random((1,)))
    with self.assertRaisesRegex(
        NotImplementedError,
        rf"Gluon kernel 'gluon_future_api_kernel' uses a Gluon API that"
        rf" Triton {re.escape(triton.__version__)} does not have.*"
        r"jt_dist_test_api_from_the_future"):
      util.lower(lambda a: jt_dist.triton_call(
          a, kernel=gluon_future_api_kernel, out_shape=a, grid=1,
          compute_capability=90), x)

  def test_gluon_kernel_under_vmap_lowers_one_launch_per_element(self):
    x = jnp.asarray(self.random((3, 64)))
    calls = util.triton_custom_calls(util.lower(jax.vmap(
        lambda a: _gluon_copy(a, compute_capability=90)), x))
    self.assertNotEmpty(calls)
    self.assertEqual(calls[0]["calls"][0]["name"], "gluon_copy_kernel")
    self.assertEqual(calls[0]["calls"][0]["grid"], (1, 1, 1))

  def test_gluon_kernel_refuses_vmap_method_grid(self):
    x = jnp.asarray(self.random((3, 64)))
    with self.assertRaisesRegex(NotImplementedError,
                                r"'gluon_copy_kernel'.*Gluon kernel"):
      util.lower(jax.vmap(lambda a: _gluon_copy(
          a, compute_capability=90, vmap_method="grid")), x)

  def test_gluon_host_tma_descriptor(self):
    kernel = _host_tma_copy_kernel()
    if kernel is None:
      self.skipTest(f"Triton {triton.__version__} has no"
                    " mbarrier.allocate_mbarrier for Gluon")
    if not hasattr(util.plugin("cuda"), "create_tma_descriptor_parameter"):
      self.skipTest("the installed jaxlib takes no host TMA descriptors")
    x = jnp.asarray(self.random((16, 32)))
    layout = gl.NVMMASharedLayout(128, element_bitwidth=32, rank=2)
    (call,) = util.triton_custom_calls(util.lower(
        lambda a: jt_dist.triton_call(
            jt_dist.TensorDescriptor.from_array(a, (16, 32), layout=layout),
            kernel=kernel, out_shape=a, grid=1, M=16, N=32,
            compute_capability=90), x))
    params = call["calls"][0]["params"]
    self.assertEqual(params[0][0], "tma")
    self.assertEqual(params[1:], [("i32", 16), ("i32", 32), ("i64", 32),
                                  ("i64", 1), ("array", 0, 16)])

  @parameterized.parameters(2, 4)
  def test_cluster_size_reaches_jaxlib(self, num_ctas):
    x = jnp.asarray(self.random((100,)))
    (call,) = util.triton_custom_calls(util.lower(
        lambda a: _copy(a, compute_capability=90,
                        backend_options={"num_ctas": num_ctas}), x))
    (kernel,) = call["calls"]
    # jaxlib launches grid_0 * num_ctas blocks in clusters of num_ctas.
    self.assertEqual((kernel["num_ctas"], kernel["grid"]),
                     (num_ctas, (4, 1, 1)))

  @parameterized.parameters((3, "a power of two"), (16, "at most 8"))
  def test_cluster_size_must_be_portable(self, num_ctas, message):
    x = jnp.asarray(self.random((100,)))
    with self.assertRaisesRegex(ValueError, rf"num_ctas={num_ctas} .*{message}"):
      util.lower(lambda a: _copy(a, compute_capability=90, num_ctas=num_ctas),
                 x)

  def test_cluster_before_hopper_errors(self):
    x = jnp.asarray(self.random((100,)))
    with self.assertRaisesRegex(ValueError, r"num_ctas=2.*sm_80"):
      util.lower(lambda a: _copy(a, compute_capability=80, num_ctas=2), x)


if __name__ == "__main__":
  absltest.main()
