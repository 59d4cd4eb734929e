"""jax-triton 0.4's calling conventions beside 0.3.1's.

The 0.4 aliasing convention (an aliased input is its output's buffer and
its output binds no parameter), kernel operands given as keywords, and
both carried through ``jax.jit``, ``jax.vmap``, ``sharded_triton_call``,
a ``ShardingRule`` and the CPU bounds checker.
"""

from __future__ import annotations

import unittest
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
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

_N = 16


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_inplace_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr,
                       INTO_Y: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  total = tl.load(x_ptr + offsets, mask=mask) + tl.load(
      y_ptr + offsets, mask=mask)
  if INTO_Y:
    tl.store(y_ptr + offsets, total, mask=mask)
  else:
    tl.store(x_ptr + offsets, total, mask=mask)


@triton.jit
def scaled_inc_kernel(n, io_ptr, scale, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets, mask=mask) * scale + 1,
           mask=mask)


@triton.jit
def double_kernel(io_ptr, factor=2.0):
  offsets = tl.arange(0, 16)
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets) * factor)


@triton.jit
def pair_kernel(a_ptr, b_ptr, c_ptr, d_ptr, n, BLOCK: tl.constexpr):
  # a += b; c += d.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(a_ptr + offsets, tl.load(a_ptr + offsets, mask=mask)
           + tl.load(b_ptr + offsets, mask=mask), mask=mask)
  tl.store(c_ptr + offsets, tl.load(c_ptr + offsets, mask=mask)
           + tl.load(d_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def constexpr_first_kernel(x_ptr, BLOCK: tl.constexpr, y_ptr, n, out_ptr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           - tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def out_then_input_kernel(x_ptr, out_ptr, y_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets)
           + tl.load(y_ptr + offsets))


@triton.jit
def overrun_kernel(n, io_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)  # No mask: BLOCK > n overruns.
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets) + 1)


@triton.jit
def tuple_add_kernel(x_ptr, yz, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  y_ptr = yz[0]
  z_ptr = yz[1]
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask)
           + tl.load(z_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def nested_tuple_kernel(scale, ab_c, out_ptr, BLOCK: tl.constexpr):
  ab = ab_c[0]
  a_ptr = ab[0]
  shift = ab[1]
  c_ptr = ab_c[1]
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, scale * tl.load(a_ptr + offsets) + shift
           + tl.load(c_ptr + offsets))


@triton.jit
def tuple_inplace_kernel(xy, n, BLOCK: tl.constexpr):
  # y += x, in place.
  offsets = tl.arange(0, BLOCK)
  mask = offsets < n
  x_ptr = xy[0]
  y_ptr = xy[1]
  tl.store(y_ptr + offsets, tl.load(y_ptr + offsets, mask=mask)
           + tl.load(x_ptr + offsets, mask=mask), mask=mask)


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _inc(n, x, scale, **kwargs):
  return jt_dist.triton_call(
      n, x, scale, kernel=scaled_inc_kernel, out_shape=_like(x),
      grid=(triton.cdiv(n, 8),), BLOCK=8, input_output_aliases={1: 0},
      **kwargs)


class AliasingConventionTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_04_scalar_before_aliased_input(self, jit):
    # Keys count the non-constexpr operands, scalars included: 1 is io_ptr.
    x = self.random((_N,))
    scale = float(self.np_rng.uniform(1, 3))
    f = lambda a: _inc(_N, a, scale)
    out = (jax.jit(f) if jit else f)(x)
    self.assertAllClose(out, x * np.float32(scale) + 1)

  @parameterized.parameters(False, True)
  def test_04_aliased_input_is_zeroed(self, into_y):
    x, y = self.random((_N,)), self.random((_N,))
    out = jt_dist.triton_call(
        x, y, _N, kernel=add_inplace_kernel, out_shape=_like(x), grid=(2,),
        BLOCK=8, INTO_Y=into_y, input_output_aliases={int(into_y): 0},
        zeroed_outputs=(0,))
    self.assertAllClose(out, x if into_y else y)

  @parameterized.parameters(False, True)
  def test_04_two_aliased_outputs_and_donation(self, donate):
    a, b, c, d = (self.random((_N,)) for _ in range(4))
    f = lambda *v: jt_dist.triton_call(
        *v, _N, kernel=pair_kernel, out_shape=(_like(a), _like(c)),
        grid=(2,), BLOCK=8, input_output_aliases={0: 0, 2: 1})
    if donate:
      f = jax.jit(f, donate_argnums=(0, 2))
    outs = f(*(jnp.asarray(v) for v in (a, b, c, d)))
    self.assertAllClose(outs[0], a + b)
    self.assertAllClose(outs[1], c + d)

  def test_031_aliasing_keeps_its_output_parameter(self):
    x, y = self.random((_N,)), self.random((_N,))
    out = jt_dist.triton_call(
        x, y, _N, kernel=add_kernel, out_shape=_like(x), grid=(2,), BLOCK=8,
        input_output_aliases={0: 0})
    self.assertAllClose(out, x + y)

  def test_both_readings_bind_warns_and_follows_04(self):
    x = self.random((_N,))
    with self.assertWarnsRegex(
        DeprecationWarning,
        r"'double_kernel'.*0\.3\.1's convention.*\['factor'\].*follows 0\.4"
        r".*pass factor=\.\.\. by name"):
      out = jt_dist.triton_call(
          x, kernel=double_kernel, out_shape=_like(x), grid=(1,),
          input_output_aliases={0: 0})
    self.assertAllClose(out, x * 2)

  def test_naming_the_default_silences_the_warning(self):
    x = self.random((_N,))
    factor = float(self.np_rng.uniform(1, 3))
    with warnings.catch_warnings():
      warnings.simplefilter("error", DeprecationWarning)
      out = jt_dist.triton_call(
          x, kernel=double_kernel, out_shape=_like(x), grid=(1,),
          input_output_aliases={0: 0}, factor=factor)
    self.assertAllClose(out, x * np.float32(factor))

  def test_neither_reading_binds_names_both(self):
    x, y = self.random((_N,)), self.random((_N,))
    with self.assertRaisesRegex(
        ValueError,
        r"key 2 is not an array argument index.*0\.4's convention.*key 2 is"
        r" operand 'n', a scalar"):
      jt_dist.triton_call(
          x, y, _N, kernel=add_kernel, out_shape=_like(x), grid=(2,),
          BLOCK=8, input_output_aliases={2: 0})

  def test_04_key_past_the_operands(self):
    x = self.random((_N,))
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"output 0 binds 'BLOCK'.*0\.4's convention.*key 5 is not an operand"
        r" index.*\['n', 'io_ptr',"
        r" 'scale'\]"):
      jt_dist.triton_call(
          _N, x, 1.0, kernel=scaled_inc_kernel, out_shape=_like(x),
          grid=(2,), BLOCK=8, input_output_aliases={5: 0})

  def test_output_index_past_the_outputs_under_both_readings(self):
    x, y = self.random((_N,)), self.random((_N,))
    out = int(self.np_rng.integers(1, 100))
    index = (rf"input_output_aliases\[{{key}}\] = {out} is not an output"
             r" index; the call has 1 outputs, indices 0 to 0\.")
    # add_kernel binds under either reading; key 0 is x_ptr in both.
    with self.assertRaisesRegex(
        ValueError, index.format(key=0) + r".*0\.4's convention.*"
        + index.format(key=0)):
      jt_dist.triton_call(
          x, y, _N, kernel=add_kernel, out_shape=_like(x), grid=(2,),
          BLOCK=8, input_output_aliases={0: out})
    # scaled_inc_kernel binds only under 0.4's, where key 1 is io_ptr.
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"output 0 binds 'BLOCK'.*0\.4's convention.*" + index.format(key=1)):
      jt_dist.triton_call(
          _N, x, 1.0, kernel=scaled_inc_kernel, out_shape=_like(x),
          grid=(2,), BLOCK=8, input_output_aliases={1: out})

  def test_bounds_checker_names_the_aliased_parameter(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    x = self.random((_N,))
    with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError, "io_ptr"):
      jax.block_until_ready(jt_dist.triton_call(
          _N, x, kernel=overrun_kernel, out_shape=_like(x), grid=(1,),
          BLOCK=2 * _N, input_output_aliases={1: 0}))

  def test_bounds_checker_passes_the_aliased_buffer(self):
    x = self.random((_N,))
    out = jt_dist.triton_call(
        _N, x, kernel=overrun_kernel, out_shape=_like(x), grid=(1,),
        BLOCK=_N, input_output_aliases={1: 0})
    self.assertAllClose(out, x + 1)

  def test_vmap_of_04_aliasing(self):
    xs = self.random((3, _N))
    scale = float(self.np_rng.uniform(1, 3))
    out = jax.vmap(lambda a: _inc(_N, a, scale))(xs)
    self.assertAllClose(out, xs * np.float32(scale) + 1)

  def test_sharded_triton_call_with_04_aliasing(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x = self.random((2 * _N,))
    scale = float(self.np_rng.uniform(1, 3))
    out = jt_dist.sharded_triton_call(
        jt_dist.shard_size(1), x, scale, kernel=scaled_inc_kernel,
        out_shape=_like(x), grid=(2,), mesh=mesh, in_specs=(P("i"),),
        out_specs=P("i"), BLOCK=8, input_output_aliases={1: 0})
    self.assertAllClose(out, x * np.float32(scale) + 1)

  def test_sharding_rule_with_04_aliasing(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    x = self.random((2 * _N,))
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    out = jt_dist.triton_call(
        jt_dist.shard_size(1), xs, 3.0, kernel=scaled_inc_kernel,
        out_shape=_like(x), grid=(2,), BLOCK=8, input_output_aliases={1: 0},
        sharding_rule=jt_dist.ShardingRule("i -> i"))
    self.assertAllClose(out, x * 3 + 1)
    self.assertEqual(out.sharding.spec, P("i"))


class KeywordOperandTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_out_of_order_keywords(self, jit):
    x, y = self.random((_N,)), self.random((_N,))
    f = lambda a, b: jt_dist.triton_call(
        a, n=_N, y_ptr=b, kernel=add_kernel, out_shape=_like(x), grid=(2,),
        BLOCK=8)
    out = (jax.jit(f) if jit else f)(x, y)
    self.assertAllClose(out, x + y)

  def test_constexpr_before_keyword_operands(self):
    x, y = self.random((_N,)), self.random((_N,))
    out = jt_dist.triton_call(
        x, y_ptr=y, n=_N, kernel=constexpr_first_kernel, out_shape=_like(x),
        grid=(2,), BLOCK=8)
    self.assertAllClose(out, x - y)

  def test_every_operand_by_keyword_with_04_aliasing(self):
    x = self.random((_N,))
    out = jt_dist.triton_call(
        io_ptr=x, n=_N, scale=2.0, kernel=scaled_inc_kernel,
        out_shape=_like(x), grid=(2,), BLOCK=8, input_output_aliases={1: 0})
    self.assertAllClose(out, x * 2 + 1)

  def test_keyword_and_positional_conflict(self):
    x = self.random((_N,))
    with self.assertRaisesRegex(
        TypeError, r"'add_kernel'.*metaparam x_ptr=<array of shape \(16,\),"
        r" dtype float32> binds 'x_ptr'.*multiple values for argument"
        r" 'x_ptr'"):
      jt_dist.triton_call(x, x_ptr=x, kernel=add_kernel, out_shape=_like(x),
                          grid=(1,), BLOCK=8)

  @parameterized.parameters(False, True)
  def test_array_keyword_after_an_output_binds_an_input(self, jit):
    # jax-triton 0.4's reading: the parameter left over is the output.
    x, y = self.random((8,)), self.random((8,))
    f = lambda a, b: jt_dist.triton_call(
        a, y_ptr=b, kernel=out_then_input_kernel, out_shape=_like(a),
        grid=(1,), BLOCK=8)
    self.assertAllClose((jax.jit(f) if jit else f)(x, y), x + y)

  def test_fast_path_sees_new_keyword_operands(self):
    x = self.random((_N,))
    for _ in range(3):
      y = self.random((_N,))
      out = jt_dist.triton_call(x, y_ptr=y, n=_N, kernel=add_kernel,
                                out_shape=_like(x), grid=(2,), BLOCK=8)
      self.assertAllClose(out, x + y)

  def test_vmap_over_a_keyword_operand(self):
    x, ys = self.random((_N,)), self.random((3, _N))
    out = jax.vmap(lambda b: jt_dist.triton_call(
        x, y_ptr=b, n=_N, kernel=add_kernel, out_shape=_like(x), grid=(2,),
        BLOCK=8))(ys)
    self.assertAllClose(out, x + ys)

  def test_sharded_triton_call_shards_keyword_operands(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x, y = self.random((2 * _N,)), self.random((2 * _N,))
    out = jt_dist.sharded_triton_call(
        x, n=jt_dist.shard_size(0), y_ptr=y, kernel=add_kernel,
        out_shape=_like(x), grid=(2,), mesh=mesh, in_specs=(P("i"), P("i")),
        out_specs=P("i"), BLOCK=8)
    self.assertAllClose(out, x + y)

  def test_sharding_rule_sees_keyword_operands(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    x, y = self.random((2 * _N,)), self.random((2 * _N,))
    xs, ys = (jax.device_put(v, NamedSharding(mesh, P("i"))) for v in (x, y))
    out = jt_dist.triton_call(
        xs, n=jt_dist.shard_size(0), y_ptr=ys, kernel=add_kernel,
        out_shape=_like(x), grid=(2,), BLOCK=8,
        sharding_rule=jt_dist.ShardingRule("i, i -> i"))
    self.assertAllClose(out, x + y)


class TupleOperandTest(testing.TestCase):

  def _add(self, x, y, z, **kwargs):
    return jt_dist.triton_call(
        x, (y, z), _N, kernel=tuple_add_kernel, out_shape=_like(x),
        grid=(2,), BLOCK=8, **kwargs)

  @parameterized.parameters(False, True)
  def test_tuple_of_arrays(self, jit):
    x, y, z = (self.random((_N,)) for _ in range(3))
    f = jax.jit(self._add) if jit else self._add
    self.assertAllClose(f(x, y, z), x + y + z)

  def test_nested_tuple_with_a_scalar_leaf(self):
    a, c = self.random((8,)), self.random((8,))
    scale, shift = (float(v) for v in self.np_rng.uniform(1, 3, size=2))
    out = jax.jit(lambda a, c: jt_dist.triton_call(
        scale, ((a, shift), c), kernel=nested_tuple_kernel,
        out_shape=_like(a), grid=(1,), BLOCK=8))(a, c)
    self.assertAllClose(
        out, np.float32(scale) * a + np.float32(shift) + c, rtol=1e-5)

  def test_04_alias_keys_count_tuple_leaves(self):
    x, y = self.random((_N,)), self.random((_N,))
    # Leaves: xy[0] (0), xy[1] (1), n (2); xy[1] is output 0's buffer.
    out = jt_dist.triton_call(
        (x, y), _N, kernel=tuple_inplace_kernel, out_shape=_like(y),
        grid=(1,), BLOCK=_N, input_output_aliases={1: 0})
    self.assertAllClose(out, x + y)

  def test_bounds_checker_names_the_leaf(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    x, y = self.random((_N,)), self.random((_N // 2,))
    with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError, r"yz\[0\]"):
      jax.block_until_ready(self._add(x, y, x))

  def test_vmap_launches_per_element(self):
    xs, y, z = self.random((3, _N)), self.random((_N,)), self.random((_N,))
    out = jax.vmap(lambda x: self._add(x, y, z))(xs)
    self.assertAllClose(out, xs + y + z)

  def test_vmap_grid_batches_tuples(self):
    xs, y, z = self.random((3, _N)), self.random((_N,)), self.random((_N,))
    out = jax.vmap(lambda x: self._add(x, y, z, vmap_method="grid"))(xs)
    self.assertAllClose(out, xs + y + z)

  def test_sharded_triton_call_splits_tuples(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x, y, z = (self.random((_N,)) for _ in range(3))
    out = jt_dist.sharded_triton_call(
        x, (y, z), jt_dist.shard_size(0), kernel=tuple_add_kernel,
        out_shape=_like(x), grid=(1,), mesh=mesh, in_specs=(P("i"), P("i")),
        out_specs=P("i"), BLOCK=8)
    self.assertAllClose(out, x + y + z)

  def test_sharding_rule_counts_tuple_leaves(self):
    x, y, z = (self.random((_N,)) for _ in range(3))
    out = self._add(x, y, z, sharding_rule=jt_dist.ShardingRule("i, i, i -> i"))
    self.assertAllClose(out, x + y + z)

  def test_tuple_of_arrays_for_a_constexpr_is_refused(self):
    x = self.random((8,))
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"args\[1\] is a tuple holding arrays but binds 'BLOCK'"):
      jt_dist.triton_call(x, (x,), x, 8, kernel=constexpr_first_kernel,
                          out_shape=_like(x), grid=(1,))

  def test_non_array_leaf_is_refused(self):
    x = self.random((8,))
    with self.assertRaisesRegex(
        TypeError, r"args\[1\]\[1\] = 'z' of type str is neither"):
      jt_dist.triton_call(x, (x, "z"), 8, kernel=tuple_add_kernel,
                          out_shape=_like(x), grid=(1,), BLOCK=8)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.IsolatedCacheMixin, testing.TestCase):
  """What a cross-lowered CUDA call passes jaxlib, parameter by parameter."""

  def _params(self, f, *args):
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    return call, kernel["params"]

  def test_04_aliased_input_is_the_zeroed_output(self):
    x = jnp.zeros((_N,), jnp.float32)
    call, params = self._params(
        lambda a: _inc(_N, a, 1e300, zeroed_outputs=(0,),
                       compute_capability=90), x)
    # n, then io_ptr zeroed as output 0 (4 bytes each), then scale as a
    # double (1e300 overflows float32); no parameter for the output.
    self.assertEqual(params, [("i32", _N), ("array", 4 * _N, 16),
                              ("other", [8])])
    self.assertIn("operand_index = 0", call["aliases_text"])  # io_ptr.

  def test_keyword_operands_in_parameter_order(self):
    x = jnp.zeros((_N,), jnp.float32)
    _, params = self._params(
        lambda a, b: jt_dist.triton_call(
            a, n=_N, y_ptr=b, kernel=add_kernel, out_shape=_like(a),
            grid=(2,), BLOCK=8, compute_capability=90), x, x)
    self.assertEqual(params, [("array", 0, 16), ("array", 0, 16),
                              ("i32", _N), ("array", 0, 16)])

  def test_tuple_leaves_are_kernel_arguments(self):
    x = jnp.zeros((8,), jnp.float32)
    _, params = self._params(
        lambda a, c: jt_dist.triton_call(
            2.0, ((a, 3.0), c), kernel=nested_tuple_kernel,
            out_shape=_like(a), grid=(1,), BLOCK=8, compute_capability=90),
        x, x)
    self.assertEqual(params, [("f32", 2.0), ("array", 0, 16), ("f32", 3.0),
                              ("array", 0, 16), ("array", 0, 16)])


if __name__ == "__main__":
  absltest.main()
