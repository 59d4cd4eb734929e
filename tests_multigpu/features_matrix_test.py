"""jax-triton 0.4's features inside ``sharded_triton_call`` and a ``ShardingRule``.

Each feature's coverage in the other contexts lives beside the feature's own
tests; these fill the gaps: the 0.4 aliasing convention with ``zeroed_outputs``,
keyword operands under ``jax.jit``, float scalars typed fp32/fp64,
``backend_options``, ``has_side_effect`` and ``cost_estimate``, and the
refusals (``TensorDescriptor``, ``jax.Ref`` with a rule, Gluon kernels and
``num_ctas > 1`` on the CPU). The rule runs eagerly on sharded arrays and
under ``jax.jit`` over an explicit mesh. GPU-only behaviour is checked by
cross-lowering for CUDA where jaxlib's CUDA plugin is installed. Runs on 8
virtual CPU devices under pytest, and on every GPU when there are at least 2.
"""

import os
import sys
import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import acc_sum_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import desc_copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import gluon_copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import maybe_bias_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import wide_scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 32
_BLOCK = 8


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _launched(text: str) -> bool:
  return testing.kernel_launches(text) > 0


def _wide_values(rng):
  big = float(10.0 ** rng.uniform(40, 300))
  return big, float(rng.uniform(0.5, 2)) / big, float(rng.uniform(1, 3))


def _wide_expected(x, big, small, scale):
  return (np.asarray(x, np.float64) * big * small).astype(
      np.float32) * np.float32(scale)


class _MeshCase(testing.TestCase):

  def mesh(self, explicit=False):
    types = (AxisType.Explicit,) if explicit else (AxisType.Auto,)
    return jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=types)

  def split(self, *host):
    sharding = NamedSharding(self.mesh(explicit=True), P("i"))
    return [jax.device_put(v, sharding) for v in host]


class ShardedFeaturesTest(_MeshCase):
  """``sharded_triton_call`` with each 0.4 feature."""

  def _sharded(self, *args, in_specs=(P("i"),), **kwargs):
    return jt_dist.sharded_triton_call(
        *args, mesh=self.mesh(), in_specs=in_specs, **kwargs)

  @parameterized.parameters((1,), (0, 1))
  def test_04_aliasing_with_zeroed_outputs(self, *zeroed):
    x, acc = self.random((_N,)), self.random((_N,))
    new_acc, total = self._sharded(
        x, acc, jt_dist.shard_size(0), kernel=acc_sum_kernel,
        out_shape=(_like(acc), jax.ShapeDtypeStruct((1,), jnp.float32)),
        grid=_grid, in_specs=(P("i"), P("i")), out_specs=(P("i"), P()),
        out_reduce=(None, ("sum", "i")), BLOCK=_BLOCK,
        input_output_aliases={1: 0}, zeroed_outputs=zeroed)
    self.assertAllClose(new_acc, x if 0 in zeroed else x + acc)
    self.assertAllClose(total, [x.sum()], rtol=1e-4, atol=1e-4)

  def test_float_scalars_keep_their_width(self):
    x = self.random((_N,))
    big, small, scale = _wide_values(self.np_rng)
    out = self._sharded(
        x, big, small, scale, jt_dist.shard_size(0), kernel=wide_scale_kernel,
        out_shape=_like(x), grid=_grid, out_specs=P("i"), BLOCK=_BLOCK)
    self.assertAllClose(out, _wide_expected(x, big, small, scale), rtol=1e-6)

  @parameterized.parameters(False, True)
  def test_options_together(self, jit):
    x, y = self.random((_N,)), self.random((_N,))
    f = lambda a, b: self._sharded(
        a, n=jt_dist.shard_size(0), y_ptr=b, kernel=add_kernel,
        out_shape=_like(x), grid=_grid, in_specs=(P("i"), P("i")),
        out_specs=P("i"), BLOCK=_BLOCK, backend_options={"num_warps": 2},
        has_side_effect=True, cost_estimate={"flops": _N})
    self.assertAllClose((jax.jit(f) if jit else f)(x, y), x + y)

  @parameterized.parameters(False, True)
  def test_none_arguments(self, jit):
    x = self.random((_N,))
    scale = float(self.np_rng.uniform(1.5, 3.0))
    # None takes no in_specs entry: it is no operand.
    f = lambda a: self._sharded(
        a, None, jt_dist.shard_size(0), kernel=maybe_bias_kernel,
        out_shape=_like(x), grid=_grid, out_specs=P("i"), BLOCK=_BLOCK,
        scale=scale)
    self.assertAllClose((jax.jit(f) if jit else f)(x), x * scale, rtol=1e-6)
    g = lambda a: self._sharded(
        a, n=jt_dist.shard_size(0), bias_ptr=None, kernel=maybe_bias_kernel,
        out_shape=_like(x), grid=_grid, out_specs=P("i"), BLOCK=_BLOCK,
        scale=None)
    self.assertAllClose((jax.jit(g) if jit else g)(x), x)

  def test_keyword_tensor_descriptor_is_refused(self):
    x = jnp.asarray(self.random((16, 16)))
    with self.assertRaises(NotImplementedError) as cm:
      self._sharded(
          kernel=desc_copy_kernel, in_desc=jt_dist.TensorDescriptor.from_array(
              x, (8, 16)), out_shape=_like(x), grid=1, in_specs=None,
          out_specs=P("i"), M=8, N=16)
    for part in ("the keyword operand in_desc= is a TensorDescriptor",
                 "jax.shard_map"):
      self.assertIn(part, str(cm.exception))


class RuleFeaturesTest(_MeshCase):
  """``triton_call(..., sharding_rule=...)`` eagerly and under ``jax.jit``."""

  def _run(self, f, jit, *host):
    return (jax.jit(f) if jit else f)(*self.split(*host))

  @parameterized.product(jit=[False, True], zeroed=[(1,), (0, 1)])
  def test_04_aliasing_with_zeroed_outputs(self, jit, zeroed):
    x, acc = self.random((_N,)), self.random((_N,))
    rule = jt_dist.ShardingRule("i, i -> i, ", reductions={"i": "sum"})
    new_acc, total = self._run(lambda a, c: jt_dist.triton_call(
        a, c, jt_dist.shard_size(0), kernel=acc_sum_kernel,
        out_shape=(_like(acc), jax.ShapeDtypeStruct((), jnp.float32)),
        grid=_grid, BLOCK=_BLOCK, input_output_aliases={1: 0},
        zeroed_outputs=zeroed, sharding_rule=rule), jit, x, acc)
    self.assertAllClose(new_acc, x if 0 in zeroed else x + acc)
    self.assertEqual(new_acc.sharding.spec, P("i"))
    self.assertAllClose(total, x.sum(), rtol=1e-4, atol=1e-4)

  @parameterized.parameters(False, True)
  def test_keyword_operands(self, jit):
    x, y = self.random((_N,)), self.random((_N,))
    out = self._run(lambda a, b: jt_dist.triton_call(
        a, n=jt_dist.shard_size(0), y_ptr=b, kernel=add_kernel,
        out_shape=_like(x), grid=_grid, BLOCK=_BLOCK,
        sharding_rule=jt_dist.ShardingRule("i, i -> i")), jit, x, y)
    self.assertAllClose(out, x + y)
    self.assertEqual(out.sharding.spec, P("i"))

  @parameterized.parameters(False, True)
  def test_none_arguments(self, jit):
    x = self.random((_N,))
    # The rule's operands are the arrays: None is none of them.
    out = self._run(lambda a: jt_dist.triton_call(
        a, None, jt_dist.shard_size(0), kernel=maybe_bias_kernel,
        out_shape=_like(x), grid=_grid, BLOCK=_BLOCK, scale=None,
        sharding_rule=jt_dist.ShardingRule("i -> i")), jit, x)
    self.assertAllClose(out, x)
    self.assertEqual(out.sharding.spec, P("i"))

  @parameterized.parameters(False, True)
  def test_float_scalars_keep_their_width(self, jit):
    x = self.random((_N,))
    big, small, scale = _wide_values(self.np_rng)
    out = self._run(lambda a: jt_dist.triton_call(
        a, big, small, scale, jt_dist.shard_size(0), kernel=wide_scale_kernel,
        out_shape=_like(x), grid=_grid, BLOCK=_BLOCK,
        sharding_rule=jt_dist.ShardingRule("i -> i")), jit, x)
    self.assertAllClose(out, _wide_expected(x, big, small, scale), rtol=1e-6)

  @parameterized.parameters(False, True)
  def test_options_together(self, jit):
    x, y = self.random((_N,)), self.random((_N,))
    out = self._run(lambda a, b: jt_dist.triton_call(
        a, b, jt_dist.shard_size(0), kernel=add_kernel, out_shape=_like(x),
        grid=_grid, BLOCK=_BLOCK, backend_options={"num_warps": 2},
        has_side_effect=True, cost_estimate={"flops": _N},
        sharding_rule=jt_dist.ShardingRule("i, i -> i")), jit, x, y)
    self.assertAllClose(out, x + y)

  @parameterized.parameters(True, False)
  def test_xla_keeps_only_a_side_effecting_call(self, has_side_effect):
    args = self.split(self.random((_N,)), self.random((_N,)))

    def f(a, b):
      jt_dist.triton_call(
          a, b, jt_dist.shard_size(0), kernel=add_kernel, out_shape=_like(a),
          grid=_grid, BLOCK=_BLOCK, has_side_effect=has_side_effect,
          sharding_rule=jt_dist.ShardingRule("i, i -> i"))
      return a * 2

    hlo = jax.jit(f).lower(*args).compile().as_text()
    self.assertEqual(_launched(hlo), has_side_effect)
    self.assertAllClose(jax.jit(f)(*args), np.asarray(args[0]) * 2)

  def test_tensor_descriptor_under_jit_is_refused(self):
    (x,) = self.split(self.random((16, 16)))
    with self.assertRaises(NotImplementedError) as cm:
      jax.jit(lambda a: jt_dist.triton_call(
          jt_dist.TensorDescriptor.from_array(a, (8, 16)),
          kernel=desc_copy_kernel, out_shape=_like(a), grid=1, M=8, N=16,
          sharding_rule=jt_dist.ShardingRule("i j -> i j")))(x)
    for part in ("args[0] is a TensorDescriptor", "sharding_rule=",
                 "jax.shard_map"):
      self.assertIn(part, str(cm.exception))

  def test_ref_under_jit_is_refused(self):
    x, acc = self.split(self.random((_N,)), self.random((_N,)))

    def f(a, c):
      ref = jax.new_ref(c)
      jt_dist.triton_call(
          ref, a, jt_dist.shard_size(0), kernel=add_kernel,
          out_shape=_like(a), grid=_grid, BLOCK=_BLOCK,
          sharding_rule=jt_dist.ShardingRule("i, i -> i"))
      return ref[...]

    with self.assertRaises(NotImplementedError) as cm:
      jax.jit(f)(x, acc)
    for part in ("sharding_rule=ShardingRule('i, i -> i')",
                 "cannot be combined with Ref arguments (args[0])",
                 "drop sharding_rule"):
      self.assertIn(part, str(cm.exception))


class GpuOnlyFeaturesTest(_MeshCase):
  """Gluon kernels and clusters: refused on the CPU, in either context."""

  def _contexts(self, kernel, *args, **kwargs):
    mesh = self.mesh()
    rule = jt_dist.ShardingRule("i -> i")
    (split,) = self.split(self.random((_N,)))
    yield "sharded_triton_call", lambda: jt_dist.sharded_triton_call(
        self.random((_N,)), *args, kernel=kernel, mesh=mesh,
        in_specs=(P("i"),), out_specs=P("i"), **kwargs)
    yield "rule", lambda: jt_dist.triton_call(
        split, *args, kernel=kernel, sharding_rule=rule, **kwargs)
    yield "rule_jit", lambda: jax.jit(lambda a: jt_dist.triton_call(
        a, *args, kernel=kernel, sharding_rule=rule, **kwargs))(split)

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("the refusals are the CPU interpreter's; GPUs are"
                    " checked by CudaLoweringTest")

  def test_gluon_kernel_is_refused(self):
    for name, call in self._contexts(
        gluon_copy_kernel, out_shape=jax.ShapeDtypeStruct((_N,), jnp.float32),
        grid=1, size=_N // 2, block=_N // 2, num_warps=1):
      with self.subTest(name), self.assertRaises(NotImplementedError) as cm:
        call()
      for part in ("kernel 'gluon_copy_kernel' is a Gluon kernel",
                   "interpreter cannot run Gluon"):
        self.assertIn(part, str(cm.exception))

  @parameterized.parameters({"num_ctas": 2},
                            {"backend_options": {"num_ctas": 4}})
  def test_clusters_are_refused(self, **options):
    for name, call in self._contexts(
        copy_kernel, jt_dist.shard_size(0),
        out_shape=jax.ShapeDtypeStruct((_N,), jnp.float32), grid=_grid,
        BLOCK=_BLOCK, **options):
      with self.subTest(name), self.assertRaises(ValueError) as cm:
        call()
      for part in ("kernel 'copy_kernel' asks for num_ctas=",
                   "clusters are not available on the CPU"):
        self.assertIn(part, str(cm.exception))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.IsolatedCacheMixin, _MeshCase):
  """The per-shard custom call, cross-lowered for CUDA (sm_90)."""

  def _lower(self, context, kernel, *args, **kwargs):
    kwargs.update(compute_capability=90, out_shape=jax.ShapeDtypeStruct(
        (2 * _N,), jnp.float32))
    if context == "sharded_triton_call":
      mesh = self.mesh()
      f = lambda a: jt_dist.sharded_triton_call(
          a, *args, kernel=kernel, mesh=mesh, in_specs=(P("i"),),
          out_specs=P("i"), **kwargs)
      arg = jax.ShapeDtypeStruct((2 * _N,), jnp.float32)
    else:
      f = lambda a: jt_dist.triton_call(
          a, *args, kernel=kernel,
          sharding_rule=jt_dist.ShardingRule("i -> i"), **kwargs)
      arg = jax.ShapeDtypeStruct((2 * _N,), jnp.float32, sharding=NamedSharding(
          self.mesh(explicit=True), P("i")))
    return util.lower(f, arg)

  @parameterized.parameters("sharded_triton_call", "rule")
  def test_options_reach_the_shards_call(self, context):
    flops = int(self.np_rng.integers(1, 10**9))
    lowered = self._lower(
        context, wide_scale_kernel, 1e300, 1e-300, 2.0,
        jt_dist.shard_size(0), grid=_grid, BLOCK=_BLOCK,
        has_side_effect=True, cost_estimate={"flops": flops},
        backend_options={"maxnreg": 32, "num_ctas": 2})
    hlo = lowered.compiler_ir("hlo").as_hlo_text()
    self.assertRegex(hlo, rf"cost_estimate_json\s*=.*flops\\22\s*:\s*{flops}")
    self.assertIn("custom_call_has_side_effect=true", hlo)
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    self.assertIn(".maxnreg 32", kernel["ptx"])
    # The shard's grid (32 elements in blocks of 8), in clusters of 2.
    self.assertEqual((kernel["num_ctas"], kernel["grid"]), (2, (4, 1, 1)))
    # The doubles go as fp64 (proto field 8), the float32 as f32.
    self.assertEqual(kernel["params"][1:4],
                     [("other", [8]), ("other", [8]), ("f32", 2.0)])

  @parameterized.parameters("sharded_triton_call", "rule")
  def test_gluon_kernel_compiles_per_shard(self, context):
    (call,) = util.triton_custom_calls(self._lower(
        context, gluon_copy_kernel, grid=1, size=_N, block=_N, num_warps=1))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "gluon_copy_kernel")
    self.assertEqual(kernel["params"], [("array", 0, 16)] * 2)
    self.assertIn(".target sm_90", kernel["ptx"])


if __name__ == "__main__":
  absltest.main()
