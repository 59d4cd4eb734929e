"""``jax.export`` of ``sharded_triton_call`` over a mesh.

With 8 virtual CPU devices, the function is exported for CUDA (JAX's CUDA
plugin cross-lowers) and the artifact checked; on a host with >= 2 CUDA
GPUs, one exported over all of them is deserialised and run.
"""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

import jt_dist
from jt_dist import testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import sharded_add  # pylint: disable=g-import-not-at-top
sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

testing.configure_cpu_devices()


def _export(f, *args, **options):
  with jt_dist.export_options(**options):
    return jax.export.export(
        jax.jit(f), platforms=("cuda",),
        disabled_checks=jt_dist.export_safety_checks())(*args)


@absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class ExportShardedTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.all = self.devices(2)
    self.count = min(len(self.all), 8)
    self.mesh = jax.make_mesh((self.count,), ("x",),
                              devices=self.all[:self.count])

  def _specs(self, per_device):
    n = per_device * self.count
    sharding = NamedSharding(self.mesh, P("x"))
    spec = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)
    return spec, spec

  @parameterized.parameters(False, True)
  def test_round_trip_over_the_mesh(self, cubin):
    if testing.platform() == "gpu":
      self.skipTest("cross-lowering check; the GPU run is below")
    per_device = int(self.np_rng.integers(1, 64)) * 16
    f = lambda a, b: sharded_add.sharded_add(a, b, self.mesh, block=256)
    exported = _export(f, *self._specs(per_device), compute_capability=90,
                       cubin=cubin)
    loaded = jax.export.deserialize(exported.serialize())
    self.assertEqual(loaded.nr_devices, self.count)
    self.assertEqual(loaded.platforms, ("cuda",))
    (call,) = jt_dist.exported_versions(loaded)
    self.assertEqual((call.compute_capability, call.binary),
                     (90, "cubin" if cubin else "ptx"))
    self.assertEqual(call.kernels, ("add_kernel",))
    text = loaded.mlir_module()
    # Each device's launch sees its own shard.
    self.assertRegex(
        text, rf"custom_call @triton_kernel_call_ffi\(.*\).*"
        rf"tensor<{per_device}xf32>")
    self.assertIn('jt_dist_triton = "', text)

  def test_missing_capability_names_the_kernel(self):
    if testing.platform() == "gpu":
      self.skipTest("cross-lowering check")
    f = lambda a, b: sharded_add.sharded_add(a, b, self.mesh, block=256)
    with self.assertRaisesRegex(
        jt_dist.ExportError, "'add_kernel'.*compute_capability="):
      jax.export.export(
          jax.jit(f), platforms=("cuda",),
          disabled_checks=jt_dist.export_safety_checks())(*self._specs(64))

  def test_exported_over_gpus_runs(self):
    if testing.platform() != "gpu":
      self.skipTest("needs >= 2 CUDA GPUs to run the artifact")
    capability = int(float(self.all[0].compute_capability) * 10)
    per_device = int(self.np_rng.integers(1, 1000)) * 16
    f = lambda a, b: sharded_add.sharded_add(a, b, self.mesh, block=256)
    exported = _export(f, *self._specs(per_device),
                       compute_capability=capability)
    loaded = jax.export.deserialize(exported.serialize())
    self.assertEqual(jt_dist.check_exported(loaded), [])
    x = self.random(per_device * self.count)
    y = self.random(x.size)
    sharding = NamedSharding(self.mesh, P("x"))
    out = jax.jit(loaded.call)(jax.device_put(x, sharding),
                               jax.device_put(y, sharding))
    np.testing.assert_array_equal(np.asarray(out), x + y)


if __name__ == "__main__":
  absltest.main()
