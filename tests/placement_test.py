"""The device-validation layer, on 8 virtual CPU devices (or real GPUs)."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

from variants_util import VariantsTestCase  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position


def add(x, y, **kwargs):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
      BLOCK=32, **kwargs)


class PlacementTest(VariantsTestCase):

  def setUp(self):
    super().setUp()
    self.x = self.random((64,))
    self.y = self.random((64,))

  def _mesh(self, shape, names, axis_types=None):
    count = int(np.prod(shape))
    devices = self.devices(count)
    kwargs = {} if axis_types is None else {"axis_types": axis_types}
    return jax.make_mesh(shape, names, devices=devices, **kwargs)

  @chex.variants(with_jit=True, without_jit=True)
  def test_single_device_call_stays_on_its_device(self):
    # Regression: device 3 of a multi-device host, not device 0.
    device = self.devices(4)[3]
    x, y = jax.device_put(self.x, device), jax.device_put(self.y, device)
    out = self.variant(add)(x, y)
    self.assertEqual(out.devices(), {device})
    self.assertAllClose(out, self.x + self.y)

  def test_uncommitted_arrays_run_on_the_committed_ones_device(self):
    device = self.devices(2)[1]
    out = add(jax.device_put(self.x, device), jax.numpy.asarray(self.y))
    self.assertEqual(out.devices(), {device})

  def test_arguments_on_different_devices(self):
    d0, d1 = self.devices(2)
    x, y = jax.device_put(self.x, d0), jax.device_put(self.y, d1)
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      add(x, y)
    message = str(cm.exception)
    for part in ("args[0]", "args[1]", str(d0), str(d1), "add_kernel",
                 "jax.device_put"):
      self.assertIn(part, message)

  @parameterized.named_parameters(
      ("sharded", P("x")), ("replicated", P()))
  def test_array_over_several_devices_eagerly(self, spec):
    mesh = self._mesh((2,), ("x",))
    x = jax.device_put(self.x, NamedSharding(mesh, spec))
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      add(x, jax.device_put(self.y, mesh.devices.flat[0]))
    message = str(cm.exception)
    for part in ("args[0]", "(64,)", "float32", "spans 2 devices",
                 "sharded_triton_call", "jax.shard_map"):
      self.assertIn(part, message)

  def test_explicit_sharding_under_jit_is_refused_at_trace_time(self):
    mesh = self._mesh((2,), ("x",), (AxisType.Explicit,))
    sharding = NamedSharding(mesh, P("x"))
    x = jax.device_put(self.x, sharding)
    y = jax.device_put(self.y, sharding)
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      jax.jit(add).trace(x, y)
    message = str(cm.exception)
    for part in ("args[0]", "['x']", "x=2", "outside shard_map",
                 "sharded_triton_call"):
      self.assertIn(part, message)

  def test_auto_sharding_under_jit_is_refused_at_lowering(self):
    # The silent all-gather case: XLA would replicate the kernel.
    mesh = self._mesh((2,), ("x",), (AxisType.Auto,))
    sharding = NamedSharding(mesh, P("x"))
    x = jax.device_put(self.x, sharding)
    y = jax.device_put(self.y, sharding)
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      jax.jit(add)(x, y)
    message = str(cm.exception)
    for part in ("add_kernel", "for 2 devices", "x_ptr, y_ptr",
                 "all-gather", "sharded_triton_call"):
      self.assertIn(part, message)

  def test_one_device_jit_on_a_multi_device_host_is_allowed(self):
    device = self.devices(6)[5]
    x = jax.device_put(self.x, device)
    out = jax.jit(add)(x, jax.device_put(self.y, device))
    self.assertEqual(out.devices(), {device})
    self.assertAllClose(out, self.x + self.y)

  @chex.variants(with_jit=True, without_jit=True)
  def test_shard_map_1d(self):
    mesh = self._mesh((4,), ("x",))
    f = jax.shard_map(add, mesh=mesh, in_specs=(P("x"), P("x")),
                      out_specs=P("x"))
    sharding = NamedSharding(mesh, P("x"))
    x, y = (jax.device_put(a, sharding) for a in (self.x, self.y))
    self.assertAllClose(self.variant(f)(x, y), self.x + self.y)

  def test_shard_map_2d(self):
    mesh = self._mesh((2, 2), ("x", "y"))
    x = self.random((8, 16))
    y = self.random((8, 16))
    f = jax.jit(jax.shard_map(add, mesh=mesh, in_specs=(P("x", "y"),) * 2,
                              out_specs=P("x", "y")))
    sharding = NamedSharding(mesh, P("x", "y"))
    out = f(jax.device_put(x, sharding), jax.device_put(y, sharding))
    self.assertAllClose(out, x + y)

  def test_partially_manual_shard_map_over_replicated_axes_runs(self):
    mesh = self._mesh((2, 2), ("x", "y"), (AxisType.Explicit,) * 2)
    f = jax.jit(jax.shard_map(add, mesh=mesh, in_specs=(P("x"), P("x")),
                              out_specs=P("x"), axis_names={"x"}))
    sharding = NamedSharding(mesh, P("x"))
    x, y = (jax.device_put(a, sharding) for a in (self.x, self.y))
    self.assertAllClose(f(x, y), self.x + self.y)

  def test_partially_manual_shard_map_split_over_explicit_axis(self):
    mesh = self._mesh((2, 2), ("x", "y"), (AxisType.Explicit,) * 2)
    x = jax.device_put(self.x.reshape(8, 8), NamedSharding(mesh, P("x", "y")))

    def body(a):
      return add(a, a)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), axis_names={"x"}))
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      f(x)
    message = str(cm.exception)
    for part in ("args[0]", "['y']", "y=2", "manual over only ['x']"):
      self.assertIn(part, message)

  def test_partially_manual_shard_map_over_auto_axes(self):
    mesh = self._mesh((2, 2), ("x", "y"), (AxisType.Auto,) * 2)
    f = jax.jit(jax.shard_map(add, mesh=mesh, in_specs=(P("x"), P("x")),
                              out_specs=P("x"), axis_names={"x"}))
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      f(self.x, self.y)
    message = str(cm.exception)
    for part in ("add_kernel", "manual over ['x'] only", "['y']", "y=2",
                 "axis_names="):
      self.assertIn(part, message)

  def test_device_argument_moves_uncommitted_inputs(self):
    device = self.devices(3)[2]
    out = add(self.x, self.y, device=2)
    self.assertEqual(out.devices(), {device})
    self.assertAllClose(out, self.x + self.y)

  def test_device_argument_mismatch(self):
    d0, d1 = self.devices(2)
    x = jax.device_put(self.x, d0)
    with self.assertRaises(jt_dist.DevicePlacementError) as cm:
      add(x, self.y, device=d1)
    message = str(cm.exception)
    for part in ("args[0]", str(d0), str(d1), "device="):
      self.assertIn(part, message)

  def test_device_argument_out_of_range(self):
    count = len(jax.devices())
    with self.assertRaisesRegex(ValueError, f"device={count} .*0 to {count - 1}"):
      add(self.x, self.y, device=count)

  def test_device_argument_of_wrong_type(self):
    with self.assertRaisesRegex(TypeError, "device='gpu0' of type str"):
      add(self.x, self.y, device="gpu0")


if __name__ == "__main__":
  absltest.main()
