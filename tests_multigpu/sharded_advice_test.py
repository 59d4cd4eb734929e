"""sharded_triton_call's advice, followed.

Every ShardingSpecError that suggests a change is raised here, and the
change it suggests is made, as written in the message, and the result
compared with NumPy; a call refused is refused before any kernel is
lowered.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

import jt_dist
from jt_dist import testing

import os  # pylint: disable=g-bad-import-order,wrong-import-order
import sys  # pylint: disable=g-bad-import-order,wrong-import-order
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import sharded_add  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples import sharded_matmul  # pylint: disable=g-import-not-at-top,wrong-import-position
sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from feature_kernels import double_and_shift_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

testing.configure_cpu_devices()

_OPEN, _CLOSE = "([{", ")]}"


def suggested(message: str, name: str):
  """The value ``message`` suggests for ``name=``, evaluated as written."""
  start = message.index(f"{name}=") + len(name) + 1
  depth, end = 0, start
  while end < len(message):
    char = message[end]
    if char in _OPEN:
      depth += 1
    elif char in _CLOSE:
      if depth == 0:
        break
      depth -= 1
    elif depth == 0 and char in " ;,":
      break
    elif depth == 0 and char == "." and message[end - 1] in _CLOSE:
      break
    end += 1
  return eval(message[start:end], {"P": P})  # pylint: disable=eval-used


class AdviceTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.mesh = jax.make_mesh((4, 2), ("x", "y"), devices=self.devices(8))

  def _refused(self, call):
    """The message of the ShardingSpecError ``call`` raises; nothing was
    lowered (so no kernel ran)."""
    before = jt_dist.cache_info().lowerings
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      call()
    self.assertEqual(jt_dist.cache_info().lowerings, before)
    return str(cm.exception)

  def _add(self, x, y, **kwargs):
    return jt_dist.sharded_triton_call(
        x, y, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda meta: (triton.cdiv(meta["n_elements"], 16),),
        mesh=self.mesh, BLOCK=16, **kwargs)

  def test_inputs_split_over_different_axes(self):
    x, y = self.random((64,)), self.random((64,))
    in_specs = (P("x"), P("y"))
    message = self._refused(lambda: self._add(x, y, in_specs=in_specs))
    # The shards pair x's quarter with y's half: no out_specs alone makes
    # that an add. The advice splits the inputs alike.
    self.assertIn("split differently", message)
    fixed = suggested(message, "in_specs")
    self.assertEqual(len({jt_dist_spec(s) for s in fixed}), 1, fixed)
    out = self._add(x, y, in_specs=fixed,
                    out_specs=suggested(message, "out_specs"))
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  def test_split_inputs_without_out_specs(self):
    x, y = self.random((64,)), self.random((64,))
    message = self._refused(lambda: self._add(x, y, in_specs=(P("x"),) * 2))
    out = self._add(x, y, in_specs=(P("x"),) * 2,
                    out_specs=suggested(message, "out_specs"))
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  def test_out_specs_without_split_inputs(self):
    put = lambda v: jax.device_put(v, NamedSharding(self.mesh, P()))
    x, y = put(self.random((64,))), put(self.random((64,)))
    message = self._refused(lambda: self._add(x, y, out_specs=P("x")))
    out = self._add(x, y, in_specs=suggested(message, "in_specs"),
                    out_specs=P("x"))
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  def _matmul(self, a, b, in_specs, out_spec, out_reduce):
    return sharded_matmul._call(a, b, self.mesh, in_specs, out_spec,
                                out_reduce, (16, 16, 16), jnp.float32)

  def test_k_split_without_out_reduce(self):
    a, b = self.random((16, 64)), self.random((64, 16))
    in_specs = (P(None, "x"), P("x", None))
    message = self._refused(
        lambda: self._matmul(a, b, in_specs, P(), None))
    out = self._matmul(a, b, in_specs, P(), suggested(message, "out_reduce"))
    self.assertAllClose(out, np.asarray(a) @ np.asarray(b), rtol=1e-4,
                        atol=1e-4)

  def test_out_spec_missing_an_axis(self):
    a, b = self.random((32, 16)), self.random((16, 48))
    in_specs = (P("x", None), P(None, "y"))
    message = self._refused(
        lambda: self._matmul(a, b, in_specs, P("x"), None))
    out = self._matmul(a, b, in_specs, suggested(message, "out_specs"), None)
    self.assertAllClose(out, np.asarray(a) @ np.asarray(b), rtol=1e-4,
                        atol=1e-4)

  def test_reduced_output_still_varying_over_another_axis(self):
    a, b = self.random((16, 64)), self.random((64, 48))
    in_specs = (P("y", "x"), P("x", None))
    message = self._refused(
        lambda: self._matmul(a, b, in_specs, P(), ("sum", "x")))
    out = self._matmul(a, b, in_specs, suggested(message, "out_specs"),
                       ("sum", "x"))
    self.assertAllClose(out, np.asarray(a) @ np.asarray(b), rtol=1e-4,
                        atol=1e-4)

  def test_pytree_output_missing_an_axis(self):
    x = self.random((64,))
    out_shape = {"doubled": jax.ShapeDtypeStruct((64,), jnp.float32),
                 "shifted": jax.ShapeDtypeStruct((64,), jnp.float32)}
    call = lambda out_specs: jt_dist.sharded_triton_call(
        x, jt_dist.shard_size(0), kernel=double_and_shift_kernel,
        out_shape=out_shape, grid=(1,), mesh=self.mesh, in_specs=(P("x"),),
        out_specs=out_specs, BLOCK=16)
    message = self._refused(lambda: call({"doubled": P("x"), "shifted": P()}))
    out = call(suggested(message, "out_specs"))
    self.assertAllClose(out["doubled"], np.asarray(x) * 2)
    self.assertAllClose(out["shifted"], np.asarray(x) + 1)

  def test_rule_with_out_specs(self):
    x, y = self.random((64,)), self.random((64,))
    rule = jt_dist.ShardingRule("i, i -> i")
    message = self._refused(lambda: self._add(
        x, y, in_specs=(P("x"),) * 2, out_specs=P("x"), sharding_rule=rule))
    self.assertIn("Leave out_specs out", message)
    out = self._add(x, y, in_specs=(P("x"),) * 2, sharding_rule=rule)
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  def test_indivisible_dimension(self):
    x = self.random((62,))
    message = self._refused(
        lambda: self._add(x, x, in_specs=(P("x"),) * 2, out_specs=P("x")))
    self.assertIn("Pad dimension 0 to a multiple of 4", message)
    padded = np.pad(np.asarray(x), (0, 2))
    out = self._add(padded, padded, in_specs=(P("x"),) * 2,
                    out_specs=P("x"))
    self.assertAllClose(np.asarray(out)[:62], 2 * np.asarray(x))

  def test_no_mesh(self):
    x = self.random((64,))
    call = lambda **mesh: jt_dist.sharded_triton_call(
        x, x, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
        in_specs=(P("x"),) * 2, out_specs=P("x"), BLOCK=16, **mesh)
    message = self._refused(call)
    self.assertIn("Pass mesh=jax.make_mesh(...)", message)
    out = call(mesh=jax.make_mesh((4,), ("x",), devices=self.devices(4)))
    self.assertAllClose(out, 2 * np.asarray(x))


def jt_dist_spec(spec):
  """A spec as a hashable value, P(None) and P() alike."""
  entries = list(spec)
  while entries and entries[-1] is None:
    entries.pop()
  return tuple(entries)


if __name__ == "__main__":
  absltest.main()
