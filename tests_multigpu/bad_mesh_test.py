"""Bad meshes and specs for ``sharded_triton_call``: what each raises.

A table, like tests/bad_input_test.py, of mistakes that need a mesh of two
devices (virtual CPU devices in CI, GPUs when there are two); it adds to the
cases of tests_multigpu/sharded_test.py's ShardedErrorsTest.
"""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jt_dist
from jt_dist import testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import sharded_add  # pylint: disable=g-import-not-at-top

testing.configure_cpu_devices()

_OUT = jax.ShapeDtypeStruct((8,), jnp.float32)


def _call(t, **kwargs):
  defaults = dict(kernel=sharded_add.add_kernel, out_shape=_OUT, grid=(1,),
                  mesh=t.mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
                  BLOCK=16)
  defaults.update(kwargs)
  return jt_dist.sharded_triton_call(t.x, t.y, jt_dist.shard_size(0),
                                     **defaults)


# (name, call, exception type, pattern the message must match).
_CASES = (
    ("mesh_string", lambda t: _call(t, mesh="x"),
     jt_dist.ShardingSpecError, r"mesh='x' of type str is not a"
     r" jax\.sharding\.Mesh.*jax\.make_mesh"),
    ("mesh_device_list", lambda t: _call(t, mesh=jax.devices()[:2]),
     jt_dist.ShardingSpecError, r"mesh=\[.*\] of type list is not a"
     r" jax\.sharding\.Mesh"),
    ("in_specs_string", lambda t: _call(t, in_specs="x"),
     jt_dist.ShardingSpecError, r"in_specs='x' of type str must be a"
     r" PartitionSpec"),
    ("in_spec_tuple_not_partition_spec",
     lambda t: _call(t, in_specs=(("x",), P("x"))),
     jt_dist.ShardingSpecError, r"spec of args\[0\] is \('x',\) of type"
     r" tuple.*PartitionSpec"),
    ("out_specs_wrong_structure", lambda t: _call(t, out_specs=[P("x"), P()]),
     jt_dist.ShardingSpecError, r"out_specs \[.*\] must be one"
     r" PartitionSpec for every output.*structure"),
    ("out_spec_unknown_axis", lambda t: _call(t, out_specs=P("y")),
     jt_dist.ShardingSpecError, r"spec P\('y',\) of output 0"
     r" names mesh axes \['y'\].*x=2"),
    ("out_specs_left_out_on_split_inputs", lambda t: _call(t, out_specs=None),
     jt_dist.ShardingSpecError, r"output 0 \(out_shape, global shape \(8,\)\)"
     r" varies over mesh axes \['x'\].*out_specs was left out.*pass"
     r" out_specs=P\('x'\).*out_reduce=\('sum', 'x'\)"),
    ("out_spec_on_another_axis", lambda t: _call(
        t, mesh=jax.make_mesh((2, 1), ("x", "y"), devices=t.devices(2)),
        out_specs=P("y")),
     jt_dist.ShardingSpecError, r"its out_specs entry is P\('y'\), which"
     r" does not name \['x'\].*pass out_specs=P\('x'\)"),
    ("out_reduce_unknown_axis", lambda t: _call(
        t, in_specs=(P(), P()), out_specs=P(), out_reduce=("sum", "y")),
     jt_dist.ShardingSpecError, r"out_reduce of output 0 reduces over mesh"
     r" axes \['y'\].*'x': 2"),
    ("out_reduce_wrong_structure", lambda t: _call(
        t, out_specs=P(), out_reduce=[("sum", "x"), None]),
     jt_dist.ShardingSpecError, r"out_reduce .* must be one \(op, axes\)"
     r" pair for every output"),
    ("mesh_axis_not_dividing_output", lambda t: _call(
        t, out_shape=jax.ShapeDtypeStruct((7,), jnp.float32)),
     jt_dist.ShardingSpecError, r"output 0 of shape \(7,\).*not divisible"
     r" by 2.*Pad dimension 0"),
    ("in_specs_for_scalars_too", lambda t: _call(
        t, in_specs=(P("x"), P("x"), P())),
     jt_dist.ShardingSpecError, r"3 in_specs.*2 array arguments.*scalars"
     r" take no spec"),
)


class BadMeshTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.mesh = jax.make_mesh((2,), ("x",), devices=self.devices(2))
    self.x = jnp.asarray(self.random((8,)))
    self.y = jnp.asarray(self.random((8,)))

  @parameterized.named_parameters(*_CASES)
  def test_bad_mesh_raises(self, call, error, pattern):
    with self.assertRaisesRegex(error, pattern):
      jax.block_until_ready(call(self))

  def test_good_call_runs(self):
    # The defaults the table perturbs are a valid call.
    self.assertAllClose(_call(self), self.x + self.y)


if __name__ == "__main__":
  absltest.main()
