"""ShardingRule: declarations that would give wrong answers, and rules that
do not fit a call's operands, are refused with messages naming the argument,
the dimension and the fix."""

import os
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

import jt_dist
from jt_dist import testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import auto_partitioned_matmul  # pylint: disable=g-import-not-at-top
from examples import sharded_add  # pylint: disable=g-import-not-at-top

testing.configure_cpu_devices()

MATMUL = auto_partitioned_matmul.MATMUL_RULE


class DeclarationTest(testing.TestCase):

  @parameterized.named_parameters(
      ("not_a_str", TypeError, (("i -> i",),), {},
       ["('i -> i',)", "tuple", "must be a str"]),
      ("no_arrow", ValueError, ("i k, k j",), {}, ["exactly one '->'"]),
      ("two_arrows", ValueError, ("i -> j -> k",), {}, ["exactly one '->'"]),
      ("bad_factor", ValueError, ("i-k -> i",), {},
       ["operand 0", "'i-k'", "a factor is a name"]),
      ("repeated_factor", ValueError, ("i i -> i",), {},
       ["operand 0", "['i']", "more than one of its dimensions"]),
      ("no_operands", ValueError, (" -> i",), {}, ["names no operands"]),
      ("unknown_reduction", ValueError, ("i k, k j -> i j",),
       {"reductions": {"k": "mean"}},
       ["reductions['k'] = 'mean'", "['max', 'min', 'sum']"]),
      ("reduction_of_unknown_factor", ValueError, ("i j -> i j",),
       {"reductions": {"z": "sum"}}, ["'z'", "no operand has"]),
      ("reduction_of_kept_factor", ValueError, ("i j -> i j",),
       {"reductions": {"j": "max"}}, ["'j'", "every output keeps it"]),
      ("reductions_not_a_mapping", TypeError, ("i k, k j -> i j",),
       {"reductions": [("k", "sum")]}, ["list", "must map factor names"]),
      ("whole_is_a_str", TypeError, ("r c -> r c",), {"whole": "c"},
       ["whole='c'", "tuple of factor names"]),
      ("whole_unknown", ValueError, ("r c -> r c",), {"whole": ("x",)},
       ["'x'", "['r', 'c']"]),
      ("whole_and_reduced", ValueError, ("i k, k j -> i j",),
       {"reductions": {"k": "sum"}, "whole": ("k",)},
       ["'k' is both whole and a reduction ('sum')"]),
      ("undeclared_contraction", ValueError, ("i k, k j -> i j",), {},
       ["factor 'k'", "missing from output 0 (i j)",
        "reductions={'k': 'sum'}", "whole=('k',)"]),
      ("undeclared_for_one_output", ValueError, ("i j -> i j, i",), {},
       ["factor 'j'", "missing from output 1 (i)"]),
  )
  def test_refused(self, error, args, kwargs, parts):
    with self.assertRaises(error) as ctx:
      jt_dist.ShardingRule(*args, **kwargs)
    for part in parts:
      self.assertIn(part, str(ctx.exception))

  def test_accepted_rules(self):
    rule = jt_dist.ShardingRule("i k, k j -> i j", whole=("k",))
    self.assertEqual(rule.operands, (("i", "k"), ("k", "j")))
    self.assertIsNone(rule.reduction("k"))
    self.assertEqual(MATMUL.reduction("k"), "sum")
    self.assertEqual(repr(MATMUL),
                     "ShardingRule('i k, k j -> i j', reductions={'k': 'sum'})")
    self.assertEqual(MATMUL, jt_dist.ShardingRule(
        "i k, k j -> i j", reductions={"k": "sum"}))
    self.assertEqual(hash(MATMUL), hash(jt_dist.ShardingRule(
        "i k, k j -> i j", reductions={"k": "sum"})))
    scalar = jt_dist.ShardingRule("i, -> i")
    self.assertEqual(scalar.operands, (("i",), ()))


def _matmul_call(a, b, rule=MATMUL, out_shape=None, **kwargs):
  out_shape = out_shape or jax.ShapeDtypeStruct((a.shape[0], b.shape[-1]),
                                                np.float32)
  return jt_dist.triton_call(
      a, b, a.shape[0], b.shape[-1], a.shape[-1],
      kernel=auto_partitioned_matmul.matmul_kernel, out_shape=out_shape,
      grid=(1, 1), sharding_rule=rule, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
      **kwargs)


class CallTest(testing.TestCase):

  def assertRaisesParts(self, error, parts, fn, *args, **kwargs):
    with self.assertRaises(error) as ctx:
      fn(*args, **kwargs)
    for part in parts:
      self.assertIn(part, str(ctx.exception))
    return ctx.exception

  def test_wrong_number_of_factors_names_the_argument(self):
    a, b = self.random((16, 8)), self.random((8, 16, 2))
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["args[1] has shape (8, 16, 2) (rank 3)", "2 factors ['k', 'j']"],
        _matmul_call, a, b)

  def test_factor_sizes_disagree_names_both_dimensions(self):
    a, b = self.random((16, 8)), self.random((12, 16))
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["factor 'k' is args[1] dimension 0 (size 12)",
         "args[0] dimension 1 (size 8)"], _matmul_call, a, b)

  def test_output_size_disagrees_names_the_output(self):
    a, b = self.random((16, 8)), self.random((8, 16))
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["factor 'j' is output 0 dimension 1 (size 4)",
         "args[1] dimension 1 (size 16)"],
        _matmul_call, a, b, out_shape=jax.ShapeDtypeStruct((16, 4), np.float32))

  def test_wrong_number_of_operands(self):
    a, b = self.random((16, 8)), self.random((8, 16))
    rule = jt_dist.ShardingRule("i k -> i", reductions={"k": "sum"})
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["lists 1 array operands, but the call has 2 (args[0], args[1])"],
        _matmul_call, a, b, rule=rule)

  def test_wrong_number_of_outputs(self):
    a, b = self.random((16, 8)), self.random((8, 16))
    rule = jt_dist.ShardingRule("i k, k j -> i j, i j",
                                reductions={"k": "sum"})
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["lists 2 outputs, but the call has 1 (output 0)"],
        _matmul_call, a, b, rule=rule)

  def test_rule_of_the_wrong_type(self):
    a, b = self.random((16, 8)), self.random((8, 16))
    self.assertRaisesParts(
        TypeError, ["triton_call: sharding_rule='i k, k j -> i j'", "str",
                    "jt_dist.ShardingRule"],
        _matmul_call, a, b, rule="i k, k j -> i j")

  def _sharded_add(self, x, **kwargs):
    return jt_dist.sharded_triton_call(
        x, x, x.size, kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(1,), BLOCK=16, **kwargs)

  def test_sharded_triton_call_rule_of_the_wrong_type(self):
    mesh = jax.make_mesh((2,), ("x",), devices=self.devices(2))
    self.assertRaisesParts(
        TypeError, ["sharded_triton_call: sharding_rule=3", "int"],
        self._sharded_add, self.random((16,)), mesh=mesh, sharding_rule=3)

  def test_sharded_triton_call_rule_with_out_specs(self):
    mesh = jax.make_mesh((2,), ("x",), devices=self.devices(2))
    self.assertRaisesParts(
        jt_dist.ShardingSpecError,
        ["sharding_rule=ShardingRule('i, i -> i')", "['out_specs',"
         " 'out_reduce']", "Leave out_specs and out_reduce out"],
        self._sharded_add, self.random((16,)), mesh=mesh,
        sharding_rule=jt_dist.ShardingRule("i, i -> i"), out_specs=P("x"),
        out_reduce=("sum", "x"))

  def test_device_with_a_split_call(self):
    mesh = jax.make_mesh((2,), ("x",), devices=self.devices(2),
                         axis_types=(AxisType.Explicit,))
    a = jax.device_put(self.random((16, 32)), NamedSharding(mesh, P("x")))
    b = jax.device_put(self.random((32, 16)), NamedSharding(mesh, P()))
    self.assertRaisesParts(
        jt_dist.DevicePlacementError,
        ["device=0 asks for one device", "is split over mesh {'x': 2}",
         "Drop device="], _matmul_call, a, b, device=0)

  @parameterized.named_parameters(
      ("other_axes", (4,), ("y",), slice(0, 4),
       "args[0] lives on mesh {'x': 2} over devices [0, 1] but args[1] on"
       " mesh {'y': 4} over devices [0, 1, 2, 3]"),
      # The same axes over other devices: jit's own refusal named neither.
      ("other_devices", (2,), ("x",), slice(2, 4),
       "args[0] lives on mesh {'x': 2} over devices [0, 1] but args[1] on"
       " mesh {'x': 2} over devices [2, 3]"))
  def test_operands_on_different_meshes(self, shape, names, second, message):
    devices = self.devices(4)
    m1 = jax.make_mesh((2,), ("x",), devices=devices[:2],
                       axis_types=(AxisType.Explicit,))
    m2 = jax.make_mesh(shape, names, devices=devices[second],
                       axis_types=(AxisType.Explicit,))
    a = jax.device_put(self.random((16, 32)), NamedSharding(m1, P("x")))
    b = jax.device_put(self.random((32, 16)), NamedSharding(m2, P(names)))
    self.assertRaisesParts(jt_dist.ShardingSpecError,
                           [message, "Put every operand on the same mesh"],
                           _matmul_call, a, b)

  @parameterized.named_parameters(("numpy", np.asarray),
                                  ("closed_over_array", jax.numpy.asarray))
  def test_constant_operand_beside_a_sharded_one_under_jit(self, make):
    # The constant is no tracer: it is laid out as the plan wants too.
    mesh = jax.make_mesh((2,), ("x",), axis_types=(AxisType.Explicit,),
                         devices=self.devices(2))
    x = jax.device_put(self.random((64,)), NamedSharding(mesh, P("x")))
    y = make(self.random((64,)))
    call = lambda a: jt_dist.triton_call(
        a, y, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(4,),
        sharding_rule=jt_dist.ShardingRule("i, i -> i"), BLOCK=16)
    with jax.set_mesh(mesh):
      out = jax.jit(call)(x)
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  def test_rule_fits_and_runs_on_one_device(self):
    a, b = self.random((16, 8)), self.random((8, 16))
    out = _matmul_call(a, b)
    self.assertDotClose(out, a.astype(np.float64) @ b)


if __name__ == "__main__":
  absltest.main()
