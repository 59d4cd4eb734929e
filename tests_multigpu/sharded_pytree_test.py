"""Tuple operands split over a mesh.

``sharded_triton_call``'s ``in_specs`` are a prefix of the arguments (one
``PartitionSpec`` for a tuple's arrays, or a tuple of entries with one per
element); a ``ShardingRule``'s operands count the array leaves in flattened
order. Each array leaf is placed and split like a positional array, and the
kernel gets tuples of its shards. Runs on 8 virtual CPU devices under pytest
and on every GPU when there are at least 2.
"""

import os
import re
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from feature_kernels import tuple_add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 32
_BLOCK = 8


@triton.jit
def nested_scale_kernel(ab_c, n, out_ptr, BLOCK: tl.constexpr):
  # out = ab_c[0][1] * ab_c[0][0] + ab_c[1], with a scalar leaf.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  ab = ab_c[0]
  tl.store(out_ptr + offsets, ab[1] * tl.load(ab[0] + offsets, mask=mask)
           + tl.load(ab_c[1] + offsets, mask=mask), mask=mask)


@triton.jit
def scale_n_kernel(x_ptr, scale_n, out_ptr, BLOCK: tl.constexpr):
  # out = scale_n[0] * x over the first scale_n[1] elements.
  offsets = tl.arange(0, BLOCK)
  mask = offsets < scale_n[1]
  tl.store(out_ptr + offsets,
           scale_n[0] * tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def row_sum_kernel(xy, n_cols, out_ptr, BLOCK: tl.constexpr):
  # out[r] = sum(x[r, :] * y[:]) over a shard's columns.
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(xy[0] + row * n_cols + cols, mask=mask, other=0.0)
  y = tl.load(xy[1] + cols, mask=mask, other=0.0)
  tl.store(out_ptr + row, tl.sum(x * y, axis=0))


def _struct(shape):
  return jax.ShapeDtypeStruct(shape, np.float32)


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


class ShardedTupleTest(testing.TestCase):
  """``sharded_triton_call`` with tuple operands."""

  def _mesh(self, explicit=False):
    types = (AxisType.Explicit,) if explicit else (AxisType.Auto,)
    return jax.make_mesh((4,), ("i",), devices=self.devices(4),
                         axis_types=types)

  def _add(self, x, y, z, **kwargs):
    return jt_dist.sharded_triton_call(
        x, (y, z), jt_dist.shard_size(0), kernel=tuple_add_kernel,
        out_shape=_struct(x.shape), grid=_grid, BLOCK=_BLOCK, **kwargs)

  @parameterized.named_parameters(
      ("one_spec_for_the_tuple", (P("i"), P("i"))),
      ("one_spec_per_leaf", (P("i"), (P("i"), P("i")))),
      ("list_per_leaf", [P("i"), [P("i"), P("i")]]),
  )
  def test_given_specs(self, in_specs):
    x, y, z = (self.random((_N,)) for _ in range(3))
    out = self._add(x, y, z, mesh=self._mesh(), in_specs=in_specs,
                    out_specs=P("i"))
    self.assertAllClose(out, x + y + z)
    self.assertEqual(out.sharding.spec, P("i"))

  def test_inferred_specs_per_leaf(self):
    mesh = self._mesh()
    x, y, z = (self.random((_N,)) for _ in range(3))
    xs, ys, zs = (jax.device_put(v, NamedSharding(mesh, P("i")))
                  for v in (x, y, z))
    out = self._add(xs, ys, zs, out_specs=P("i"))
    self.assertAllClose(out, x + y + z)

  @parameterized.parameters(False, True)
  def test_replicated_leaf_beside_split_ones(self, jit):
    # y is whole on every device, and each shard's kernel reads its first
    # n_local elements.
    x, y, z = (self.random((_N,)) for _ in range(3))
    mesh = self._mesh()

    def f(x, y, z):
      return self._add(x, y, z, mesh=mesh,
                       in_specs=(P("i"), (P(), P("i"))), out_specs=P("i"))

    out = (jax.jit(f) if jit else f)(x, y, z)
    self.assertAllClose(out, x + np.tile(y[:_N // 4], 4) + z)

  def test_nested_tuple_with_a_scalar_leaf(self):
    a, c = self.random((_N,)), self.random((_N,))
    scale = float(self.np_rng.uniform(1, 3))
    out = jt_dist.sharded_triton_call(
        ((a, scale), c), _N // 4, kernel=nested_scale_kernel,
        out_shape=_struct(a.shape), grid=_grid, mesh=self._mesh(),
        in_specs=(((P("i"), None), P("i")),), out_specs=P("i"), BLOCK=_BLOCK)
    self.assertAllClose(out, np.float32(scale) * a + c, rtol=1e-5)

  def test_nested_tuple_inferred_specs_stay_with_their_leaves(self):
    # a is whole on every device and c split: with in_specs left out each
    # leaf keeps its own spec, the nested tuple's included.
    mesh = self._mesh()
    a, c = self.random((_N,)), self.random((_N,))
    scale = float(self.np_rng.uniform(1, 3))
    out = jt_dist.sharded_triton_call(
        ((jax.device_put(a, NamedSharding(mesh, P())), scale),
         jax.device_put(c, NamedSharding(mesh, P("i")))), _N // 4,
        kernel=nested_scale_kernel, out_shape=_struct(a.shape), grid=_grid,
        out_specs=P("i"), BLOCK=_BLOCK)
    self.assertAllClose(out, np.float32(scale) * np.tile(a[:_N // 4], 4) + c,
                        rtol=1e-5)

  def test_contracted_leaf_with_out_reduce(self):
    # Columns split over i: each shard sums its columns; psum adds them.
    x, y = self.random((4, _N)), self.random((_N,))
    out = jt_dist.sharded_triton_call(
        (x, y), _N // 4, kernel=row_sum_kernel,
        out_shape=_struct((4,)), grid=(4,), mesh=self._mesh(),
        in_specs=((P(None, "i"), P("i")),), out_specs=P(),
        out_reduce=("sum", "i"), BLOCK=_N // 4)
    self.assertAllClose(out, x @ y, rtol=1e-4, atol=1e-4)

  def test_shard_size_inside_a_tuple(self):
    # The placeholder is a leaf of a tuple; its index counts the positional
    # arguments, and it resolves to the shard's size.
    x = self.random((_N,))
    scale = float(self.np_rng.uniform(1, 3))
    out = jt_dist.sharded_triton_call(
        x, (scale, jt_dist.shard_size(0)), kernel=scale_n_kernel,
        out_shape=_struct(x.shape), grid=(1,), mesh=self._mesh(),
        in_specs=(P("i"),), out_specs=P("i"), BLOCK=_N // 4)
    self.assertAllClose(out, np.float32(scale) * x)

  def test_with_a_sharding_rule(self):
    x, y, z = (self.random((_N,)) for _ in range(3))
    out = self._add(x, y, z, mesh=self._mesh(), in_specs=(P("i"), P()),
                    sharding_rule=jt_dist.ShardingRule("i, i, i -> i"))
    self.assertAllClose(out, x + y + z)


  def test_bounds_checker_names_the_leaf_per_shard(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    # Each shard of yz[1] holds 4 elements; the kernel reads 8 (x's shard).
    x, short = self.random((_N,)), self.random((_N // 2,))
    # Over several devices the fault may come back inside jax's runtime
    # error; either way the message names the leaf.
    with self.assertRaisesRegex(
        (jt_dist.OutOfBoundsAccessError, jax.errors.JaxRuntimeError),
        r"load through 'yz\[1\]'"):
      jax.block_until_ready(self._add(
          x, x, short, mesh=self._mesh(), in_specs=(P("i"), P("i")),
          out_specs=P("i")))


  @parameterized.parameters("cpu", "cuda")
  def test_lowers_like_shard_map_by_hand(self, platform):
    if platform == "cuda" and not util.HAS_TRITON_CALL:
      self.skipTest(util.SKIP_REASON)
    mesh = self._mesh()
    extra = {"compute_capability": 90} if platform == "cuda" else {}
    args = [jax.ShapeDtypeStruct((_N,), np.float32)] * 3

    def local(x, y, z):
      return jt_dist.triton_call(
          x, (y, z), x.size, kernel=tuple_add_kernel,
          out_shape=_struct(x.shape), grid=(1,), BLOCK=_N // 4, **extra)

    def by_hand(x, y, z):
      return jax.shard_map(local, mesh=mesh, in_specs=(P("i"),) * 3,
                           out_specs=P("i"))(x, y, z)

    def sharded(x, y, z):
      return jt_dist.sharded_triton_call(
          x, (y, z), jt_dist.shard_size(0), kernel=tuple_add_kernel,
          out_shape=_struct(x.shape), grid=(1,), mesh=mesh,
          in_specs=(P("i"), P("i")), out_specs=P("i"), BLOCK=_N // 4,
          **extra)

    texts = []
    for f in (by_hand, sharded):
      lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))
      text = re.sub(r"loc\((#loc\d*|\"[^\"]*\"[^)]*)\)", "",
                    lowered.as_text())
      text = re.sub(r"#loc\d*( = .*)?", "", text)
      # Each CPU kernel call has an index of its own in the process.
      text = re.sub(r"index = \d+ : ui64", "index", text)
      texts.append(re.sub(r"jit_\w+", "jit_fn", text))
    self.assertIn("custom_call", texts[0])
    self.assertEqual(texts[0], texts[1])


class ShardedTupleErrorTest(testing.TestCase):
  """Mistakes in a tuple's specs name the leaf, its spec and the fix."""

  def _call(self, args, in_specs, kernel=tuple_add_kernel):
    mesh = jax.make_mesh((4,), ("i",), devices=self.devices(4))
    return jt_dist.sharded_triton_call(
        *args, kernel=kernel, out_shape=_struct((_N,)), grid=(1,),
        mesh=mesh, in_specs=in_specs, out_specs=P("i"), BLOCK=_BLOCK)

  def test_wrong_count_names_the_tuple(self):
    x = self.random((_N,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call((x, (x, x), _N), (P("i"), P("i"), P("i")))
    for part in ("3 in_specs", "2 array arguments", "args[0, 1]",
                 "tuple operands args[1] take one entry each"):
      self.assertIn(part, str(cm.exception))

  def test_wrong_structure_names_the_path(self):
    x = self.random((_N,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call((x, (x, x), _N), (P("i"), (P("i"),)))
    for part in (f"({P('i')!r},)", "args[1], a tuple of 2 elements",
                 "a tuple of 2 entries"):
      self.assertIn(part, str(cm.exception))

  def test_spec_for_a_scalar_leaf(self):
    a = self.random((_N,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call((((a, 2.0), a), _N), (((P("i"), P("i")), P("i")),),
                 kernel=nested_scale_kernel)
    for part in ("args[0][0][1] = 2.0, a scalar", "Put None in its place"):
      self.assertIn(part, str(cm.exception))

  def test_indivisible_leaf_names_its_path(self):
    x, w = self.random((_N,)), self.random((_N + 2,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call((x, (x, w), _N), (P("i"), P("i")))
    for part in ("args[1][1] of shape (34,)", f"spec {P('i')}",
                 "not divisible by 4", "Pad dimension 0"):
      self.assertIn(part, str(cm.exception))

  def test_shard_size_of_a_tuple(self):
    x = self.random((_N,))
    with self.assertRaises(ValueError) as cm:
      self._call((x, (x, x), jt_dist.shard_size(1)), (P("i"), P("i")))
    for part in ("points at args[1], a tuple operand", "Point it at an array"):
      self.assertIn(part, str(cm.exception))


class RuleTupleTest(testing.TestCase):
  """``triton_call(..., sharding_rule=...)`` with tuple operands."""

  def _mesh(self):
    return jax.make_mesh((4,), ("i",), devices=self.devices(4),
                         axis_types=(AxisType.Explicit,))

  def _add(self, x, y, z, rule="i, i, i -> i"):
    return jt_dist.triton_call(
        x, (y, z), jt_dist.shard_size(0), kernel=tuple_add_kernel,
        out_shape=_struct(x.shape), grid=_grid, BLOCK=_BLOCK,
        sharding_rule=jt_dist.ShardingRule(rule))

  def _inputs(self, mesh, specs):
    host = [self.random((_N,)) for _ in range(3)]
    return host, [jax.device_put(v, NamedSharding(mesh, s))
                  for v, s in zip(host, specs)]

  def test_eager_on_sharded_arrays(self):
    mesh = self._mesh()
    (x, y, z), args = self._inputs(mesh, [P("i")] * 3)
    out = self._add(*args)
    self.assertAllClose(out, x + y + z)
    self.assertEqual(out.sharding.spec, P("i"))

  def test_eager_reshards_a_replicated_leaf(self):
    mesh = self._mesh()
    (x, y, z), args = self._inputs(mesh, [P("i"), P("i"), P()])
    self.assertAllClose(self._add(*args), x + y + z)

  def test_under_jit_over_an_explicit_mesh(self):
    mesh = self._mesh()
    (x, y, z), args = self._inputs(mesh, [P("i")] * 3)
    out = jax.jit(self._add)(*args)
    self.assertAllClose(out, x + y + z)
    self.assertEqual(out.sharding.spec, P("i"))

  def test_contraction_over_tuple_leaves_under_jit(self):
    mesh = self._mesh()
    x, y = self.random((4, _N)), self.random((_N,))
    xs = jax.device_put(x, NamedSharding(mesh, P(None, "i")))
    ys = jax.device_put(y, NamedSharding(mesh, P("i")))
    rule = jt_dist.ShardingRule("r k, k -> r", reductions={"k": "sum"})
    out = jax.jit(lambda a, b: jt_dist.triton_call(
        (a, b), _N // 4, kernel=row_sum_kernel,
        out_shape=_struct((4,)), grid=(4,), BLOCK=_N // 4,
        sharding_rule=rule))(xs, ys)
    self.assertAllClose(out, x @ y, rtol=1e-4, atol=1e-4)

  def test_too_few_rule_operands_name_the_leaves(self):
    mesh = self._mesh()
    _, args = self._inputs(mesh, [P("i")] * 3)
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._add(*args, rule="i, i -> i")
    for part in ("lists 2 array operands", "the call has 3",
                 "args[0], args[1][0], args[1][1]",
                 "each array in a tuple operand its own"):
      self.assertIn(part, str(cm.exception))

  def test_rank_mismatch_names_the_leaf(self):
    mesh = self._mesh()
    _, args = self._inputs(mesh, [P("i")] * 3)
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._add(*args, rule="i, i, i j -> i j")
    for part in ("args[1][1] has shape (32,)", "2 factors ['i', 'j']"):
      self.assertIn(part, str(cm.exception))


if __name__ == "__main__":
  absltest.main()
