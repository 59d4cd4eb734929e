"""``jax.Ref`` arguments, ``has_side_effect`` and ``cost_estimate``.

A Ref argument is mutated in place by the kernel and is not listed in
``out_shape``: eagerly, under ``jax.jit``, under ``jax.vmap``, inside
``jax.shard_map`` and through ``sharded_triton_call``. Inputs are fresh and
random; results are checked against NumPy.
"""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
from jax.interpreters import partial_eval as pe
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from variants_util import VariantsTestCase  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position


@triton.jit
def scale_inplace_kernel(x_ptr, s, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * s,
           mask=mask)


@triton.jit
def n_first_kernel(n, x_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1,
           mask=mask)


@triton.jit
def accumulate_kernel(x_ptr, acc_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # out = x + acc; acc += x (in place).
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  acc = tl.load(acc_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + acc, mask=mask)
  tl.store(acc_ptr + offsets, acc + x, mask=mask)


@triton.jit
def two_refs_kernel(a_ptr, b_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  a = tl.load(a_ptr + offsets, mask=mask)
  b = tl.load(b_ptr + offsets, mask=mask)
  tl.store(a_ptr + offsets, a + b, mask=mask)
  tl.store(b_ptr + offsets, a - b, mask=mask)


_BLOCK = 8


def _grid(n):
  return (triton.cdiv(n, _BLOCK),)


def _scale_inplace(ref, s):
  n = ref.shape[-1]
  return jt_dist.triton_call(ref, s, n, kernel=scale_inplace_kernel,
                             out_type=(), grid=_grid(n), BLOCK=_BLOCK)


def _accumulate(x, acc_ref, **options):
  n = x.shape[-1]
  return jt_dist.triton_call(
      x, acc_ref, n, kernel=accumulate_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_grid(n),
      BLOCK=_BLOCK, **options)


def _add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_grid(x.size),
      BLOCK=_BLOCK, **options)


class RefTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_in_place_with_no_outputs(self):
    x = self.random((20,))
    s = float(np.float32(self.random(())))
    ref = jax.new_ref(jnp.asarray(x))
    # s stays a Python float (passed by value) under jit too.
    self.assertEqual(self.variant(lambda r: _scale_inplace(r, s))(ref), ())
    self.assertAllClose(ref[...], x * np.float32(s))

  @chex.variants(with_jit=True, without_jit=True)
  def test_scalar_before_ref(self):
    x = self.random((13,))
    ref = jax.new_ref(jnp.asarray(x))

    def f(ref):
      return jt_dist.triton_call(13, ref, kernel=n_first_kernel, out_type=(),
                                 grid=_grid(13), BLOCK=_BLOCK)

    self.variant(f)(ref)
    self.assertAllClose(ref[...], x + 1)

  @chex.variants(with_jit=True, without_jit=True)
  def test_ref_beside_allocated_output(self):
    x, acc = self.random((24,)), self.random((24,))
    ref = jax.new_ref(jnp.asarray(acc))
    out = self.variant(_accumulate)(jnp.asarray(x), ref)
    self.assertAllClose(out, x + acc)
    self.assertAllClose(ref[...], acc + x)

  @chex.variants(with_jit=True, without_jit=True)
  def test_two_refs(self):
    a, b = self.random((16,)), self.random((16,))
    a_ref, b_ref = jax.new_ref(jnp.asarray(a)), jax.new_ref(jnp.asarray(b))

    def f(a_ref, b_ref):
      return jt_dist.triton_call(a_ref, b_ref, 16, kernel=two_refs_kernel,
                                 out_type=(), grid=_grid(16), BLOCK=_BLOCK)

    self.variant(f)(a_ref, b_ref)
    self.assertAllClose(a_ref[...], a + b)
    self.assertAllClose(b_ref[...], a - b)

  def test_repeated_eager_calls_see_the_new_value(self):
    x = self.random((8,))
    ref = jax.new_ref(jnp.asarray(x))
    for _ in range(3):
      _scale_inplace(ref, 2.0)
    self.assertAllClose(ref[...], x * 8)

  def test_ref_created_inside_jit(self):
    x, acc = self.random((16,)), self.random((16,))

    @jax.jit
    def f(x, acc):
      ref = jax.new_ref(acc)
      out = _accumulate(x, ref)
      return out, ref[...]

    out, new_acc = f(x, acc)
    self.assertAllClose(out, x + acc)
    self.assertAllClose(new_acc, x + acc)

  @parameterized.parameters("grid", "sequential")
  def test_vmap(self, vmap_method):
    xs, accs = self.random((3, 16)), self.random((3, 16))

    def f(x, acc):
      ref = jax.new_ref(acc)
      out = _accumulate(x, ref, vmap_method=vmap_method)
      return out, ref[...]

    out, new_acc = jax.vmap(f)(xs, accs)
    self.assertAllClose(out, xs + accs)
    self.assertAllClose(new_acc, xs + accs)

  def test_inside_shard_map(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    sharding = NamedSharding(mesh, P("i"))
    x, acc = self.random((32,)), self.random((32,))

    def body(x, acc):
      ref = jax.new_ref(acc)
      out = _accumulate(x, ref)
      return out, ref[...]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")),
                              out_specs=(P("i"), P("i"))))
    out, new_acc = f(jax.device_put(x, sharding), jax.device_put(acc, sharding))
    self.assertAllClose(out, x + acc)
    self.assertAllClose(new_acc, x + acc)

  def test_replicated_ref_updated_from_split_input_is_refused(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    sharding = NamedSharding(mesh, P("i"))

    def body(x, acc):
      ref = jax.new_ref(acc)
      return _accumulate(x, ref)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()),
                              out_specs=P("i")))
    with self.assertRaisesRegex(jt_dist.ShardingSpecError,
                                r"Ref args\[1\].*\['i'\]"):
      f(jax.device_put(jnp.asarray(self.random((32,))), sharding),
        jnp.asarray(self.random((16,))))

  @chex.variants(with_jit=True, without_jit=True)
  def test_sharded_triton_call(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    sharding = NamedSharding(mesh, P("i"))
    x, acc = self.random((32,)), self.random((32,))
    ref = jax.new_ref(jax.device_put(jnp.asarray(acc), sharding))

    def f(x, ref):
      return jt_dist.sharded_triton_call(
          x, ref, jt_dist.shard_size(0), kernel=accumulate_kernel,
          out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=_grid(16),
          mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i"),
          BLOCK=_BLOCK)

    out = self.variant(f)(jax.device_put(jnp.asarray(x), sharding), ref)
    self.assertAllClose(out, x + acc)
    self.assertAllClose(ref[...], x + acc)

  def test_sharded_triton_call_replicated_ref(self):
    # Every input replicated: each device updates its copy alike.
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x = self.random((16,))
    ref = jax.new_ref(jnp.asarray(x))
    out = jt_dist.sharded_triton_call(
        ref, 3.0, 16, kernel=scale_inplace_kernel, out_shape=(),
        grid=_grid(16), mesh=mesh, in_specs=(P(),), BLOCK=_BLOCK)
    self.assertEqual(out, ())
    self.assertAllClose(ref[...], x * 3)

  def test_sharded_triton_call_replicated_ref_split_input_is_refused(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    ref = jax.new_ref(jnp.asarray(self.random((16,))))
    with self.assertRaisesRegex(jt_dist.ShardingSpecError,
                                r"Ref args\[1\].*\['i'\]"):
      jt_dist.sharded_triton_call(
          jnp.asarray(self.random((32,))), ref, 16, kernel=accumulate_kernel,
          out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=_grid(16),
          mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"), BLOCK=_BLOCK)


class RefErrorTest(testing.TestCase):

  def test_input_output_aliases_refused(self):
    ref = jax.new_ref(jnp.asarray(self.random((8,))))
    with self.assertRaisesRegex(
        ValueError,
        r"input_output_aliases=\{0: 0\} cannot be combined with Ref"
        r" arguments \(args\[0\]\)"):
      jt_dist.triton_call(ref, 2.0, 8, kernel=scale_inplace_kernel,
                          out_type=(), grid=(1,), BLOCK=_BLOCK,
                          input_output_aliases={0: 0})

  def test_sharding_rule_refused(self):
    rule = jt_dist.ShardingRule("i, i -> i")
    ref = jax.new_ref(jnp.asarray(self.random((8,))))
    for call in (jt_dist.triton_call, jt_dist.sharded_triton_call):
      with self.assertRaisesRegex(
          NotImplementedError,
          r"sharding_rule=.* cannot be combined with Ref arguments"
          r" \(args\[1\]\)"):
        call(jnp.asarray(self.random((8,))), ref, 8, kernel=accumulate_kernel,
             out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), grid=(1,),
             BLOCK=_BLOCK, sharding_rule=rule)

  def test_ref_inside_a_tuple_refused_by_sharded_triton_call(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    ref = jax.new_ref(jnp.asarray(self.random((8,))))
    with self.assertRaisesRegex(
        NotImplementedError, r"the Ref args\[0\]\[1\] sits inside a pytree"):
      jt_dist.sharded_triton_call(
          (jnp.asarray(self.random((8,))), ref), 8, kernel=two_refs_kernel,
          out_shape=(), grid=(1,), mesh=mesh, in_specs=(P(), P()),
          BLOCK=_BLOCK)

  def test_ref_view_refused(self):
    ref = jax.new_ref(jnp.asarray(self.random((2, 8))))
    with self.assertRaisesRegex(
        NotImplementedError, r"args\[0\] is a view of a jax.Ref"):
      # Under jit: jax 0.10 has no eager ref.at.
      jax.jit(lambda r: jt_dist.triton_call(
          r.at[0], 2.0, 8, kernel=scale_inplace_kernel, out_type=(),
          grid=(1,), BLOCK=_BLOCK))(ref)

  def test_no_outputs_without_refs_refused(self):
    with self.assertRaisesRegex(
        ValueError, r"`out_shape` \(\) holds no outputs.*jax.Ref"):
      jt_dist.triton_call(jnp.asarray(self.random((8,))), 2.0, 8,
                          kernel=scale_inplace_kernel, out_type=(),
                          grid=(1,), BLOCK=_BLOCK)


def _launched(text: str) -> bool:
  return testing.kernel_launches(text) > 0


def _call_eqns(jaxpr):
  return [e for e in jaxpr.eqns if e.primitive.name == "jt_dist_triton_call"]


class SideEffectTest(testing.TestCase):

  @parameterized.parameters(True, False)
  def test_jax_dce_never_drops_a_call(self, has_side_effect):
    # As in jax-triton 0.4, with or without has_side_effect.
    x, y = jnp.asarray(self.random((8,))), jnp.asarray(self.random((8,)))
    closed = jax.make_jaxpr(
        lambda x, y: _add(x, y, has_side_effect=has_side_effect))(x, y)
    (eqn,) = _call_eqns(closed.jaxpr)
    self.assertEqual(eqn.params["spec"].has_side_effect, has_side_effect)
    kept, used_inputs = pe.dce_jaxpr(closed.jaxpr, [False])
    self.assertLen(_call_eqns(kept), 1)
    self.assertEqual(used_inputs, [True, True])
    kept, used_inputs = pe.dce_jaxpr(closed.jaxpr, [True])
    self.assertLen(_call_eqns(kept), 1)
    self.assertEqual(used_inputs, [True, True])

  @parameterized.parameters(True, False)
  def test_xla_keeps_only_a_side_effecting_call(self, has_side_effect):
    x, y = jnp.asarray(self.random((8,))), jnp.asarray(self.random((8,)))

    def f(x, y):
      _add(x, y, has_side_effect=has_side_effect)
      return x * 2

    hlo = jax.jit(f).lower(x, y).compile().as_text()
    self.assertEqual(_launched(hlo), has_side_effect)
    self.assertAllClose(jax.jit(f)(x, y), np.asarray(x) * 2)

  @parameterized.parameters("jit", "shard_map", "cond", "vmap")
  def test_kept_inside_nested_jaxprs(self, where):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x, y = jnp.asarray(self.random((16,))), jnp.asarray(self.random((16,)))
    call = lambda x, y: _add(x, y, has_side_effect=True)
    inner = {
        "jit": jax.jit(call),
        "shard_map": jax.shard_map(call, mesh=mesh, in_specs=P(),
                                   out_specs=P(), check_vma=False),
        "cond": lambda x, y: jax.lax.cond(True, call, lambda x, y: x, x, y),
        "vmap": lambda x, y: jax.vmap(call)(x[None], y[None]),
    }[where]

    def f(x, y):
      inner(x, y)  # Unused.
      return x * 2

    closed = jax.make_jaxpr(f)(x, y)
    kept, _ = pe.dce_jaxpr(closed.jaxpr, [True])
    self.assertIn("jt_dist_triton_call", str(kept))
    self.assertTrue(_launched(jax.jit(f).lower(x, y).compile().as_text()))
    self.assertAllClose(jax.jit(f)(x, y), np.asarray(x) * 2)

  def test_kept_through_sharded_triton_call(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    sharding = NamedSharding(mesh, P("i"))
    x, y = self.random((32,)), self.random((32,))

    def f(x, y, keep):
      jt_dist.sharded_triton_call(
          x, y, jt_dist.shard_size(0), kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=_grid(16),
          mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i"),
          BLOCK=_BLOCK, has_side_effect=keep)
      return x * 2

    args = (jax.device_put(x, sharding), jax.device_put(y, sharding))
    for keep in (True, False):
      compiled = jax.jit(lambda x, y: f(x, y, keep)).lower(*args).compile()
      self.assertEqual(_launched(compiled.as_text()), keep)
    out = jt_dist.sharded_triton_call(
        *args, jt_dist.shard_size(0), kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct((32,), jnp.float32), grid=_grid(16),
        mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i"),
        BLOCK=_BLOCK, has_side_effect=True)
    self.assertAllClose(out, x + y)

  def test_side_effecting_call_still_computes(self):
    x, y = self.random((20,)), self.random((20,))
    out = jax.jit(lambda x, y: _add(x, y, has_side_effect=True))(x, y)
    self.assertAllClose(out, x + y)

  def test_not_a_bool(self):
    with self.assertRaisesRegex(
        TypeError, r"has_side_effect='yes' of type str must be True or"
        r" False"):
      _add(jnp.ones(8), jnp.ones(8), has_side_effect="yes")


class CostEstimateTest(testing.TestCase):

  @parameterized.parameters(
      ([("flops", 1)], TypeError, r"cost_estimate=\[\('flops', 1\)\] of type"
       r" list must be a dict"),
      ({"flop": 1}, ValueError, r"cost_estimate has the key 'flop'; the known"
       r" keys are bytes_accessed, flops, transcendentals"),
      ({"flops": 1.5}, TypeError, r"cost_estimate\['flops'\]=1.5 of type"
       r" float must be an int"),
      ({"bytes_accessed": -1}, ValueError,
       r"cost_estimate\['bytes_accessed'\]=-1 must be at least 0"),
  )
  def test_bad_cost_estimate(self, cost, error, message):
    with self.assertRaisesRegex(error, message):
      _add(jnp.ones(8), jnp.ones(8), cost_estimate=cost)

  def test_cpu_call_runs_with_a_cost_estimate(self):
    x, y = self.random((16,)), self.random((16,))
    out = jax.jit(lambda x, y: _add(
        x, y, cost_estimate={"flops": 16, "bytes_accessed": 192}))(x, y)
    self.assertAllClose(out, x + y)

  @absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_cuda_custom_call_carries_cost_and_side_effect(self):
    flops, nbytes = np.random.default_rng().integers(1, 10**9, size=2)
    x = jnp.asarray(self.random((16,)))
    f = lambda x, y: _add(x, y, compute_capability=90, has_side_effect=True,
                          cost_estimate={"flops": int(flops),
                                         "bytes_accessed": int(nbytes)})
    hlo = util.lower(f, x, x).compiler_ir("hlo").as_hlo_text()
    self.assertRegex(hlo, rf"cost_estimate_json\s*=.*flops\\22\s*:\s*{flops}")
    self.assertRegex(
        hlo, rf"cost_estimate_json\s*=.*bytes_accessed\\22\s*:\s*{nbytes}")
    self.assertIn("custom_call_has_side_effect=true", hlo)
    plain = util.lower(lambda x, y: _add(x, y, compute_capability=90),
                       x, x).compiler_ir("hlo").as_hlo_text()
    self.assertNotIn("cost_estimate_json", plain)
    self.assertNotIn("custom_call_has_side_effect=true", plain)

  @parameterized.parameters("grid", "sequential")
  @absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_cuda_cost_and_side_effect_survive_vmap(self, vmap_method):
    flops = int(np.random.default_rng().integers(1, 10**9))
    xs = jnp.asarray(self.random((2, 16)))
    f = jax.vmap(lambda x, y: _add(
        x, y, compute_capability=90, has_side_effect=True,
        vmap_method=vmap_method, cost_estimate={"flops": flops}))
    hlo = util.lower(f, xs, xs).compiler_ir("hlo").as_hlo_text()
    self.assertRegex(hlo, rf"cost_estimate_json\s*=.*flops\\22\s*:\s*{flops}")
    self.assertIn("custom_call_has_side_effect=true", hlo)

  @absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_cuda_ref_is_an_aliased_output_with_no_parameter(self):
    x = jnp.asarray(self.random((16,)))

    def f(x, acc):
      ref = jax.new_ref(acc)
      out = _accumulate(x, ref, compute_capability=90)
      return out, ref[...]

    hlo = util.lower(f, x, x).compiler_ir("hlo").as_hlo_text()
    self.assertIn("output_to_operand_aliasing={{1}: (1, {})}", hlo)

  @absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_cost_estimate_with_legacy_target_refused(self):
    x = jnp.asarray(self.random((16,)))
    f = lambda x, y: _add(x, y, compute_capability=90,
                          custom_call_target_name="triton_kernel_call",
                          cost_estimate={"flops": 1})
    with self.assertRaisesRegex(
        ValueError, r"cost_estimate=\{'flops': 1\}.*'triton_kernel_call_ffi'"
        r".*custom_call_target_name='triton_kernel_call'"):
      util.lower(f, x, x)


if __name__ == "__main__":
  absltest.main()
