"""``sharded_triton_call`` inside a ``jax.shard_map`` manual over other axes.

The caller's ``shard_map`` is manual over mesh axis ``a``; inside it,
``sharded_triton_call`` splits over ``b``. Values there vary over ``a``
already, and the caller's ``out_specs`` account for it: the call's own
``out_specs`` name only the axes it splits over, as a hand-written inner
``jax.shard_map`` around ``jt_dist.triton_call`` does. Each result is
compared with that hand-written nesting and with NumPy, on a 2x4 and a 2x2
mesh, with the call's mesh inferred from its arguments or given as the
ambient abstract mesh, and its ``in_specs`` given or inferred.
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
import triton

import jt_dist
from jt_dist import testing

testing.configure_cpu_devices()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.join(_ROOT, "tests"))
from examples import sharded_matmul  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 8


def _add_grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _matmul_grid(meta):
  return (triton.cdiv(meta["M"], meta["BLOCK_M"]),
          triton.cdiv(meta["N"], meta["BLOCK_N"]))


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


# How the inner call finds its mesh and in_specs.
_FORMS = (
    ("mesh_and_specs_inferred", dict(mesh=False, in_specs=False)),
    ("specs_given", dict(mesh=False, in_specs=True)),
    ("abstract_mesh_given", dict(mesh=True, in_specs=True)),
)
_MESHES = (("mesh_2x4", (2, 4)), ("mesh_2x2", (2, 2)))


def _cases():
  for form_name, form in _FORMS:
    for mesh_name, shape in _MESHES:
      for jit in (False, True):
        yield (f"{form_name}_{mesh_name}_{'jit' if jit else 'eager'}",
               form, shape, jit)


class NestedShardMapTest(testing.TestCase):

  def _mesh(self, shape):
    count = shape[0] * shape[1]
    devices = self.devices(count)[:count]
    return jax.make_mesh(shape, ("a", "b"), devices=devices)

  def _inner_options(self, form, specs):
    options = {}
    if form["mesh"]:
      options["mesh"] = jax.sharding.get_abstract_mesh()
    if form["in_specs"]:
      options["in_specs"] = specs
    return options

  def _outer(self, mesh, inner, in_specs, out_specs, jit):
    mapped = jax.shard_map(inner, mesh=mesh, in_specs=in_specs,
                           out_specs=out_specs, axis_names={"a"})
    return jax.jit(mapped) if jit else mapped

  @parameterized.named_parameters(*_cases())
  def test_vector_add(self, form, shape, jit):
    mesh = self._mesh(shape)
    n = 8 * _BLOCK * shape[0] * shape[1]
    x, y = self.random((n,)), self.random((n,))
    split = NamedSharding(mesh, P(("a", "b")))
    xs, ys = jax.device_put(x, split), jax.device_put(y, split)

    def inner_sharded(u, v):
      return jt_dist.sharded_triton_call(
          u, v, jt_dist.shard_size(0), kernel=add_kernel, out_shape=_like(u),
          grid=_add_grid, out_specs=P("b"), BLOCK=_BLOCK,
          **self._inner_options(form, (P("b"), P("b"))))

    def inner_by_hand(u, v):
      return jax.shard_map(
          lambda p, q: jt_dist.triton_call(
              p, q, p.size, kernel=add_kernel, out_shape=_like(p),
              grid=_add_grid, BLOCK=_BLOCK),
          in_specs=(P("b"), P("b")), out_specs=P("b"))(u, v)

    results = [self._outer(mesh, inner, (P("a"), P("a")), P("a"), jit)(xs, ys)
               for inner in (inner_sharded, inner_by_hand)]
    sharded, by_hand = (np.asarray(r) for r in results)
    np.testing.assert_array_equal(sharded, by_hand)
    self.assertAllClose(sharded, x.astype(np.float64) + y)

  @parameterized.named_parameters(*_MESHES)
  def test_matmul_rows_outside_columns_inside(self, shape):
    # The caller splits A's rows over "a"; the call splits B's and C's
    # columns over "b". Under jax.jit only: eagerly, jax's own nested
    # shard_map refuses an inner operand replicated over "b".
    mesh = self._mesh(shape)
    m, k, n = 16 * shape[0], 32, 16 * shape[1]
    a, b = self.random((m, k)), self.random((k, n))
    a_rows = jax.device_put(a, NamedSharding(mesh, P("a", None)))
    b_all = jax.device_put(b, NamedSharding(mesh, P()))
    sizes = (jt_dist.shard_size(0, axis=0), jt_dist.shard_size(1, axis=1),
             jt_dist.shard_size(0, axis=1))
    blocks = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)

    def inner_sharded(p, q):
      return jt_dist.sharded_triton_call(
          p, q, *sizes, kernel=sharded_matmul.matmul_kernel,
          out_shape=jax.ShapeDtypeStruct((p.shape[0], q.shape[1]),
                                         jnp.float32),
          grid=_matmul_grid, in_specs=(P(), P(None, "b")),
          out_specs=P(None, "b"), **blocks)

    # The same nesting written with jax.shard_map is no reference here:
    # jax 0.12's inner shard_map refuses the operand replicated over "b"
    # (its in_spec splits it) unless resharded first. NumPy is.
    sharded = np.asarray(self._outer(mesh, inner_sharded, (P("a", None), P()),
                                     P("a", None), jit=True)(a_rows, b_all))
    self.assertAllClose(sharded, a.astype(np.float64) @ b, rtol=1e-4,
                        atol=1e-4)

  def test_inner_axis_left_out_is_still_refused(self):
    # The check still holds for the axes the call splits over, and names
    # only those: the caller's axis "a" is neither missing nor to reduce.
    mesh = self._mesh((2, 2))
    n = 8 * _BLOCK * 4
    x = jax.device_put(self.random((n,)), NamedSharding(mesh, P(("a", "b"))))

    def inner(u):
      return jt_dist.sharded_triton_call(
          u, u, jt_dist.shard_size(0), kernel=add_kernel, out_shape=_like(u),
          grid=_add_grid, in_specs=(P("b"), P("b")), BLOCK=_BLOCK)

    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._outer(mesh, inner, P("a"), P("a"), jit=True)(x)
    message = str(cm.exception)
    self.assertIn("varies over mesh axes ['b']", message)
    self.assertIn("does not name ['b']", message)
    self.assertIn("out_specs=P('b')", message)
    self.assertIn("out_reduce=('sum', 'b')", message)
    self.assertNotIn("'a'", message.replace("{'a': 2, 'b': 2}", ""))


if __name__ == "__main__":
  absltest.main()
