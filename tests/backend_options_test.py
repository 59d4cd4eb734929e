"""``backend_options`` and ``CUSTOM_CALL_TARGET_NAME`` (jax-triton 0.4).

Runs on the CPU interpreter (or a GPU); the compiler options themselves are
checked by cross-lowering for CUDA where jaxlib's CUDA plugin is installed.
"""

from __future__ import annotations

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import triton

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util
from feature_kernels import add_kernel


def _add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, 32),), BLOCK=32, **options)


class BackendOptionsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    jax.clear_caches()

  def _inputs(self, n=70):
    return (jnp.asarray(self.random((n,))), jnp.asarray(self.random((n,))))

  @parameterized.parameters(
      {"num_warps": 2}, {"num_stages": 2}, {"debug": True},
      {"enable_fp_fusion": False}, {"maxnreg": 128})
  def test_runs_with_option(self, **option):
    x, y = self._inputs()
    self.assertAllClose(_add(x, y, backend_options=option), x + y)
    self.assertAllClose(jax.jit(lambda a, b: _add(
        a, b, backend_options=option))(x, y), x + y)

  @parameterized.parameters(
      ("num_warps", 4, 2), ("num_stages", 3, 2), ("num_ctas", 1, 1),
      ("debug", True, False), ("enable_fp_fusion", False, True))
  def test_same_option_both_ways_errors(self, name, value, other):
    x, y = self._inputs()
    with self.assertRaisesRegex(
        ValueError, rf"{name} given both as an argument and in"
        r" backend_options"):
      _add(x, y, backend_options={name: other}, **{name: value})

  def test_unhashable_value_errors(self):
    x, y = self._inputs()
    with self.assertRaisesRegex(
        TypeError, r"backend_options\['extern_libs'\] must be hashable.*dict"):
      _add(x, y, backend_options={"extern_libs": {"libdevice": "/p"}})

  @parameterized.parameters([[("maxnreg", 128)]], ["maxnreg"])
  def test_not_a_mapping_errors(self, given):
    x, y = self._inputs()
    with self.assertRaisesRegex(TypeError, r"backend_options=.* must be a"
                                r" dict"):
      _add(x, y, backend_options=given)

  def test_non_str_key_errors(self):
    x, y = self._inputs()
    with self.assertRaisesRegex(TypeError, r"backend_options key 3 of type"
                                r" int must be a str"):
      _add(x, y, backend_options={3: 1})

  def test_named_options_merge_into_the_launch(self):
    x, y = self._inputs()
    (eqn,) = util.bound_calls(lambda a, b: _add(
        a, b, backend_options={"num_warps": 2, "num_stages": 1,
                               "maxnreg": 96}), x, y)
    spec = eqn.params["spec"]
    (launch,) = spec.launches
    self.assertEqual(launch.config.num_warps, 2)
    self.assertEqual(launch.config.num_stages, 1)
    self.assertEqual(dict(spec.backend_options), {"maxnreg": 96})

  def test_inside_sharded_triton_call_and_vmap(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x, y = self._inputs(64)
    out = jt_dist.sharded_triton_call(
        x, y, jt_dist.shard_size(0), kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda meta: (triton.cdiv(meta["n"], 32),), mesh=mesh,
        in_specs=(P("i"), P("i")), out_specs=P("i"), BLOCK=32,
        backend_options={"num_warps": 2})
    self.assertAllClose(out, x + y)
    xs, ys = self._inputs(3 * 40)
    xs, ys = xs.reshape(3, 40), ys.reshape(3, 40)
    out = jax.vmap(lambda a, b: _add(a, b, backend_options={"num_warps": 2}))(
        xs, ys)
    self.assertAllClose(out, xs + ys)

  def test_under_a_sharding_rule(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    x, y = self._inputs(64)
    sharding = jax.sharding.NamedSharding(mesh, P("i"))
    x, y = jax.device_put(x, sharding), jax.device_put(y, sharding)
    rule = jt_dist.ShardingRule("i, i -> i")
    out = jt_dist.triton_call(
        x, y, jt_dist.shard_size(0), kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda meta: (triton.cdiv(meta["n"], 32),), BLOCK=32,
        sharding_rule=rule, backend_options={"num_warps": 2})
    self.assertAllClose(out, x + y)

  def test_custom_call_target_name(self):
    self.assertEqual(jt_dist.CUSTOM_CALL_TARGET_NAME, "triton_kernel_call_ffi")
    self.assertIn("CUSTOM_CALL_TARGET_NAME", jt_dist.__all__)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class BackendOptionsCudaTest(util.IsolatedCacheMixin, testing.TestCase):

  def _lower(self, **options):
    x = jnp.asarray(self.random((100,)))
    return util.lower(lambda a: _add(a, a, compute_capability=90, **options),
                      x)

  def test_options_reach_the_compiler_and_its_cache_key(self):
    # The same kernel twice: the options must key the compiled kernel, or
    # the second lowering would reuse the first's.
    (plain,) = util.triton_custom_calls(self._lower())
    (limited,) = util.triton_custom_calls(
        self._lower(backend_options={"maxnreg": 32, "num_warps": 2}))
    self.assertEqual(plain["calls"][0]["num_warps"], 4)
    self.assertEqual(limited["calls"][0]["num_warps"], 2)
    self.assertIn(".maxnreg 32", limited["calls"][0]["ptx"])
    self.assertNotIn(".maxnreg", plain["calls"][0]["ptx"])
    self.assertEqual(limited["target"], plain["target"])

  def test_unknown_option_errors(self):
    with self.assertRaisesRegex(
        ValueError, r"backend_options \['max_nreg'\] are not options of"
        r" Triton's cuda backend"):
      self._lower(backend_options={"max_nreg": 32})


if __name__ == "__main__":
  absltest.main()
