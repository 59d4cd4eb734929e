"""``jax.vmap`` of Triton calls on a mesh: one batched launch per shard.

Runs on virtual CPU devices through Triton's interpreter (8 under pytest)
and on every real GPU when there are at least 2.
"""

import functools
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import triton

import jt_dist
from jt_dist import testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import sharded_add  # pylint: disable=g-import-not-at-top

testing.configure_cpu_devices()


def _add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=sharded_add.add_kernel, out_shape=x,
      grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),), BLOCK=16,
      **options)


def _launches(text):
  return testing.kernel_launches(text)


class VmapShardedTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    devices = jax.devices()
    self.devices(2)  # Skips with fewer.
    self.count = min(len(devices), 8)
    self.mesh = jax.make_mesh((self.count,), ("x",),
                              devices=devices[:self.count])

  @parameterized.parameters(None, "grid")
  def test_vmap_inside_shard_map(self, method):
    sharding = NamedSharding(self.mesh, P("x"))
    xs = jax.device_put(self.random((2 * self.count, 40)), sharding)
    ys = jax.device_put(self.random((2 * self.count, 40)), sharding)
    fn = jax.jit(jax.shard_map(
        jax.vmap(functools.partial(_add, vmap_method=method)),
        mesh=self.mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    out = fn(xs, ys)
    self.assertAllClose(out, xs + ys)
    self.assertEqual(out.sharding.spec[0], "x")
    text = fn.lower(xs, ys).as_text()
    self.assertEqual(_launches(text), 1)
    self.assertNotIn("stablehlo.while", text)

  def test_vmap_of_sharded_triton_call(self):
    n = 16 * self.count
    xs, ys = self.random((3, n)), self.random((3, n))

    def one(x, y):
      return jt_dist.sharded_triton_call(
          x, y, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),),
          mesh=self.mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
          BLOCK=8)

    fn = jax.jit(jax.vmap(one))
    self.assertAllClose(fn(xs, ys), xs + ys)
    text = fn.lower(xs, ys).as_text()
    self.assertEqual(_launches(text), 1)
    self.assertNotIn("stablehlo.while", text)


if __name__ == "__main__":
  absltest.main()
