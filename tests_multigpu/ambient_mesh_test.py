"""Eager ``sharded_triton_call`` under ``jax.set_mesh`` on host arrays.

The mesh set with ``jax.set_mesh`` stands in for ``mesh=``: NumPy arrays and
arrays on one device are laid out by ``in_specs`` on its devices, and the
result equals the same call with ``mesh=mesh``. Where ``in_specs`` are left
out, each argument's spec comes from its sharding (replicated when it has
none on the mesh); if that leaves an axis unsplit over which ``out_specs``
splits an output, every shard would get whole inputs and a fraction of the
output buffer, and the call is refused with the ``in_specs`` to pass
before any kernel runs (the CPU's bounds check would otherwise report the
kernel's out-of-bounds store). Under ``jax.jit`` the ambient mesh is the
abstract one, also when every argument is a constant.
"""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 64


def _add(x, y, **options):
  """The docs' vector add over a mesh, global shapes in and out."""
  return jt_dist.sharded_triton_call(
      x, y, jt_dist.shard_size(0), kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
      BLOCK=_BLOCK, **options)


_SPLIT = dict(in_specs=(P("x"), P("x")), out_specs=P("x"))
_AXIS_TYPES = (("explicit", AxisType.Explicit), ("auto", AxisType.Auto))
# How the inputs are held: NumPy, an uncommitted array on one device, or
# (made under jax.set_mesh) an array replicated over the mesh.
_HOLDERS = ("numpy", "one_device", "made_under_set_mesh")


class AmbientMeshTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.devices(2)
    self.all = self.devices()
    self.count = min(len(self.all), 8) // 2 * 2

  def _mesh(self, axis_type=AxisType.Explicit, devices=None):
    devices = self.all[:self.count] if devices is None else devices
    return jax.make_mesh((len(devices),), ("x",), devices=devices,
                         axis_types=(axis_type,))

  def _inputs(self):
    n = 4 * _BLOCK * self.count
    return self.random((n,)), self.random((n,))

  def _held(self, arrays, holder, mesh):
    """``arrays`` (NumPy) held as ``holder`` says."""
    if holder == "numpy":
      return list(arrays)
    if holder == "one_device":
      held = [jnp.asarray(a) for a in arrays]
      for a in held:
        self.assertEqual(len(a.sharding.device_set), 1)
        self.assertFalse(a.committed)
      return held
    with jax.set_mesh(mesh):
      held = [jnp.asarray(a) for a in arrays]
    for a in held:
      self.assertIsInstance(a.sharding, NamedSharding)
      self.assertEqual(a.sharding.mesh, mesh)
      self.assertTrue(a.sharding.is_fully_replicated)
    return held

  def _assert_placed(self, out, mesh, spec, expected):
    self.assertEqual(out.sharding, NamedSharding(mesh, spec))
    self.assertEqual([s.device for s in out.addressable_shards],
                     list(mesh.devices.flat))
    self.assertAllClose(out, expected)

  @parameterized.named_parameters(
      (f"{type_name}_{holder}", axis_type, holder)
      for type_name, axis_type in _AXIS_TYPES for holder in _HOLDERS)
  def test_placed_by_in_specs(self, axis_type, holder):
    mesh = self._mesh(axis_type)
    x, y = self._inputs()
    xs, ys = self._held((x, y), holder, mesh)
    given = _add(xs, ys, mesh=mesh, **_SPLIT)
    with jax.set_mesh(mesh):
      ambient = _add(xs, ys, **_SPLIT)
    self._assert_placed(ambient, mesh, P("x"), x.astype(np.float64) + y)
    np.testing.assert_array_equal(np.asarray(ambient), np.asarray(given))

  def test_placed_on_the_ambient_meshs_devices_in_order(self):
    # Half the devices, reversed: the output lives where the mesh says.
    devices = self.all[:self.count][::-1][:self.count // 2]
    mesh = self._mesh(devices=devices)
    x, y = self._inputs()
    with jax.set_mesh(mesh):
      out = _add(x, y, **_SPLIT)
    self._assert_placed(out, mesh, P("x"), x.astype(np.float64) + y)

  @parameterized.named_parameters(
      (f"{holder}_{'jit' if jit else 'eager'}", holder, jit)
      for holder in ("numpy", "one_device") for jit in (False, True))
  def test_replicated_by_default(self, holder, jit):
    # No specs at all: replicated inputs, a replicated output, as with
    # mesh=mesh.
    mesh = self._mesh()
    x, y = self._inputs()
    xs, ys = self._held((x, y), holder, mesh)
    given = _add(xs, ys, mesh=mesh)
    with jax.set_mesh(mesh):
      ambient = (jax.jit(_add) if jit else _add)(xs, ys)
    self.assertTrue(ambient.sharding.is_fully_replicated)
    self.assertEqual(ambient.sharding.device_set, set(mesh.devices.flat))
    self.assertAllClose(ambient, x.astype(np.float64) + y)
    np.testing.assert_array_equal(np.asarray(ambient), np.asarray(given))

  @parameterized.named_parameters(
      (f"{where}_{holder}_{'jit' if jit else 'eager'}", where, holder, jit)
      for where in ("set_mesh", "mesh_given") for holder in _HOLDERS
      for jit in (False, True))
  def test_split_output_of_unsplit_inputs_is_refused(self, where, holder,
                                                     jit):
    mesh = self._mesh()
    x, y = self._inputs()
    call = lambda a, b: _add(a, b, out_specs=P("x"),
                             **({"mesh": mesh} if where == "mesh_given"
                                else {}))
    call = jax.jit(call) if jit else call
    # NumPy and one-device arrays have no sharding on the mesh; those made
    # under jax.set_mesh are replicated over it.
    xs, ys = self._held((x, y), holder, mesh)
    with jax.set_mesh(mesh), self.assertRaises(
        jt_dist.ShardingSpecError) as cm:
      jax.block_until_ready(call(xs, ys))
    message = str(cm.exception)
    for part in ("out_specs split output 0", "over mesh axes ['x']",
                 "in_specs were left out", "args[0] P(), args[1] P()",
                 f"a shard of shape ({x.size // self.count},)",
                 "pass in_specs=(P('x'), P('x'))"):
      self.assertIn(part, message)
    # The fix the message names works.
    with jax.set_mesh(mesh):
      out = _add(xs, ys, **_SPLIT)
    self._assert_placed(out, mesh, P("x"), x.astype(np.float64) + y)

  def test_split_inputs_keep_their_inferred_specs(self):
    # Arrays already split on the mesh need no in_specs.
    mesh = self._mesh()
    x, y = self._inputs()
    split = NamedSharding(mesh, P("x"))
    with jax.set_mesh(mesh):
      out = _add(jax.device_put(x, split), jax.device_put(y, split),
                 out_specs=P("x"))
    self._assert_placed(out, mesh, P("x"), x.astype(np.float64) + y)

  def test_jit_with_only_constant_arguments(self):
    # Inside jax.jit there is no concrete mesh to ask for, even when no
    # argument is a tracer.
    mesh = self._mesh()
    x, y = self._inputs()
    with jax.set_mesh(mesh):
      out = jax.jit(lambda: _add(x, y, **_SPLIT))()
    self._assert_placed(out, mesh, P("x"), x.astype(np.float64) + y)

  @parameterized.parameters(False, True)
  def test_no_mesh_is_refused(self, jit):
    # Neither mesh= nor jax.set_mesh, and inputs on no mesh.
    x, y = self._inputs()
    call = jax.jit(_add) if jit else _add
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      call(x, y)
    for part in ("no mesh to run on", "mesh=jax.make_mesh(", "jax.set_mesh"):
      self.assertIn(part, str(cm.exception))


if __name__ == "__main__":
  absltest.main()
