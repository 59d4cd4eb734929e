"""Triton calls with a ShardingRule under plain jax.jit, split per shard.

Runs on 8 virtual CPU devices through Triton's interpreter (and on every GPU
when there are at least 2). Each test checks the result against NumPy and
the compiled program's collectives: none where the rule needs none, exactly
the one it names where it does.
"""

import collections
import logging
import math
import os
import re
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

import jt_dist
from jt_dist._core import outputs as _outputs
from jt_dist import _compat
from jt_dist._sharding import partition as _partition
from jt_dist import testing

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
from examples import auto_partitioned_matmul  # pylint: disable=g-import-not-at-top
from examples import sharded_add  # pylint: disable=g-import-not-at-top
from examples import sharded_attention  # pylint: disable=g-import-not-at-top
from examples import softmax as softmax_example  # pylint: disable=g-import-not-at-top

testing.configure_cpu_devices()

ADD_RULE = jt_dist.ShardingRule("i j, i j -> i j")
SOFTMAX_RULE = jt_dist.ShardingRule("r c -> r c", whole=("c",))
ATTENTION_RULE = jt_dist.ShardingRule(
    "b h q d, b h k d, b h k d -> b h q d", whole=("q", "k", "d"))
matmul = auto_partitioned_matmul.matmul

_COLLECTIVE = re.compile(
    r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)"
    r"(?:-start)?\(")


def collectives(f, *args) -> collections.Counter:
  """The collectives in the compiled program of ``jax.jit(f)``."""
  text = jax.jit(f).lower(*args).compile().as_text()
  return collections.Counter(_COLLECTIVE.findall(text))


def spec_of(x) -> P:
  """The spec of ``x``'s sharding without trailing Nones."""
  sharding = x.sharding if hasattr(x, "sharding") else jax.typeof(x).sharding
  entries = list(sharding.spec)
  while entries and entries[-1] is None:
    entries.pop()
  return P(*entries)


def add(a, b):
  return jt_dist.triton_call(
      a, b, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
      out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
      grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),),
      sharding_rule=ADD_RULE, BLOCK=16)


def softmax(x):
  n_cols = jt_dist.shard_size(0, axis=1)
  return jt_dist.triton_call(
      x, n_cols, n_cols, n_cols, kernel=softmax_example.softmax_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (meta["x_ptr"].shape[0],),  # Local rows.
      sharding_rule=SOFTMAX_RULE, BLOCK=triton.next_power_of_2(x.shape[1]))


def attention(q, k, v):
  return jt_dist.triton_call(
      q, k, v, q.shape[2], 1.0 / math.sqrt(q.shape[3]),
      kernel=sharded_attention.attention_kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=sharded_attention._grid, sharding_rule=ATTENTION_RULE,
      HEAD_DIM=q.shape[3], BLOCK_M=16, BLOCK_N=16)


def softmax_reference(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


class AutoPartitionTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.devices(2)  # Skips on a host with fewer.
    devices = jax.devices()
    self.count = min(len(devices), 8) - min(len(devices), 8) % 2
    self.devs = devices[:self.count]
    self.mesh1d = self.mesh((self.count,), ("x",))
    self.mesh2d = self.mesh((2, self.count // 2), ("x", "y"))

  def mesh(self, shape, names, explicit=True):
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh(shape, names, devices=self.devs,
                         axis_types=(kind,) * len(names))

  def put(self, x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))

  @parameterized.named_parameters(
      ("1d_rows", "mesh1d", P("x")),
      ("1d_cols", "mesh1d", P(None, "x")),
      ("2d", "mesh2d", P("x", "y")),
      ("2d_transposed", "mesh2d", P("y", "x")),
  )
  def test_add(self, mesh_name, spec):
    mesh = getattr(self, mesh_name)
    shape = (4 * self.count, 2 * self.count)
    x, y = self.random(shape), self.random(shape)
    xs, ys = self.put(x, mesh, spec), self.put(y, mesh, spec)
    out = jax.jit(add)(xs, ys)
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), spec)
    self.assertEqual(collectives(add, xs, ys), collections.Counter())

  def test_add_eagerly_on_sharded_arrays(self):
    shape = (4 * self.count, 8)
    x, y = self.random(shape), self.random(shape)
    out = add(self.put(x, self.mesh1d, P("x")), self.put(y, self.mesh1d, P("x")))
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x"))

  def test_add_operands_that_disagree_are_resharded(self):
    shape = (4 * self.count, 2 * self.count)
    x, y = self.random(shape), self.random(shape)
    xs = self.put(x, self.mesh1d, P("x"))
    ys = self.put(y, self.mesh1d, P(None, "x"))
    with self.assertLogs("jt_dist", logging.DEBUG) as logs:
      out = jax.jit(add)(xs, ys)
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x"))
    text = "\n".join(logs.output)
    self.assertIn("args[1] dimension 1 (factor 'j'): all-gather over mesh"
                  " axes ['x']", text)
    self.assertNotIn("args[0]", text)
    self.assertEqual(collectives(add, xs, ys), collections.Counter(
        {"all-to-all": 1}))

  @parameterized.named_parameters(
      ("rows", (P("x", None), P()), P("x")),
      ("cols", (P(), P(None, "x")), P(None, "x")),
  )
  def test_matmul_split_without_communication(self, specs, out_spec):
    m, k, n = 2 * self.count, 32, 2 * self.count
    a, b = self.random((m, k)), self.random((k, n))
    args = [self.put(v, self.mesh1d, s) for v, s in zip((a, b), specs)]
    out = jax.jit(matmul)(*args)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(spec_of(out), out_spec)
    self.assertEqual(collectives(matmul, *args), collections.Counter())

  def test_matmul_rows_and_cols_on_2d_mesh(self):
    m, k, n = 16, 24, 8 * self.count
    a, b = self.random((m, k)), self.random((k, n))
    args = (self.put(a, self.mesh2d, P("x", None)),
            self.put(b, self.mesh2d, P(None, "y")))
    out = jax.jit(matmul)(*args)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(spec_of(out), P("x", "y"))
    self.assertEqual(collectives(matmul, *args), collections.Counter())

  @parameterized.named_parameters(("1d", False), ("2d", True))
  def test_matmul_k_split_is_one_all_reduce(self, two_d):
    mesh = self.mesh2d if two_d else self.mesh1d
    k_axes = ("x", "y") if two_d else "x"
    m, k, n = 16, 16 * self.count, 16
    a, b = self.random((m, k)), self.random((k, n))
    args = (self.put(a, mesh, P(None, k_axes)), self.put(b, mesh, P(k_axes)))
    with self.assertLogs("jt_dist", logging.DEBUG) as logs:
      out = jax.jit(matmul)(*args)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(spec_of(out), P())
    self.assertIn("output 0: all-reduce (sum)", "\n".join(logs.output))
    self.assertEqual(collectives(matmul, *args),
                     collections.Counter({"all-reduce": 1}))

  def test_softmax_rows_split_whole_row_kept(self):
    rows, cols = 2 * self.count, 24
    x = self.random((rows, cols))
    xs = self.put(x, self.mesh1d, P("x"))
    out = jax.jit(softmax)(xs)
    self.assertAllClose(out, softmax_reference(x), rtol=1e-5, atol=1e-6)
    self.assertEqual(spec_of(out), P("x"))
    self.assertEqual(collectives(softmax, xs), collections.Counter())

  def test_softmax_sharded_along_the_whole_row_is_gathered(self):
    rows, cols = 6, 4 * self.count
    x = self.random((rows, cols))
    xs = self.put(x, self.mesh1d, P(None, "x"))
    with self.assertLogs("jt_dist", logging.DEBUG) as logs:
      out = jax.jit(softmax)(xs)
    self.assertAllClose(out, softmax_reference(x), rtol=1e-5, atol=1e-6)
    self.assertEqual(spec_of(out), P())
    self.assertIn("args[0] dimension 1 (factor 'c'): all-gather over mesh"
                  " axes ['x']", "\n".join(logs.output))
    self.assertEqual(collectives(softmax, xs),
                     collections.Counter({"all-gather": 1}))

  def test_attention_over_batch_and_heads(self):
    shape = (2, self.count // 2, 16, 16)
    q, k, v = (self.random(shape, low=-1, high=1) for _ in range(3))
    args = [self.put(t, self.mesh2d, P("x", "y")) for t in (q, k, v)]
    out = jax.jit(attention)(*args)
    self.assertDotClose(out, sharded_attention.reference(q, k, v))
    self.assertEqual(spec_of(out), P("x", "y"))
    self.assertEqual(collectives(attention, *args), collections.Counter())

  def test_ambient_mesh_and_jnp_inputs(self):
    shape = (2 * self.count, 8)
    x, y = self.random(shape), self.random(shape)

    def f(a, b):
      a = jax.sharding.reshard(jnp.asarray(a), P("x"))
      return add(a, b * 1.0)

    with jax.set_mesh(self.mesh1d):
      out = jax.jit(f)(x, self.put(y, self.mesh1d, P("x")))
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x"))

  def test_inside_partially_manual_shard_map(self):
    mesh = self.mesh2d
    shape = (4 * self.count, 2 * self.count)
    x, y = self.random(shape), self.random(shape)
    xs, ys = self.put(x, mesh, P("x", "y")), self.put(y, mesh, P("x", "y"))

    def over_x(op):
      return jax.shard_map(op, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                           axis_names={"x"})

    out = jax.jit(over_x(add))(xs, ys)
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x", "y"))
    # A partially manual shard_map brings collectives of its own; the
    # kernel call adds none beyond those of XLA's own add in its place.
    self.assertEqual(collectives(over_x(add), xs, ys),
                     collections.Counter(collectives(over_x(jnp.add), xs, ys)))

  def test_inside_fully_manual_shard_map_runs_per_shard(self):
    shape = (2 * self.count, 8)
    x, y = self.random(shape), self.random(shape)
    f = jax.shard_map(add, mesh=self.mesh1d, in_specs=P("x"), out_specs=P("x"))
    out = jax.jit(f)(self.put(x, self.mesh1d, P("x")),
                     self.put(y, self.mesh1d, P("x")))
    self.assertAllClose(out, x + y)

  def test_grad_of_custom_vjp_with_partitioned_fwd_and_bwd(self):
    m, k, n = 2 * self.count, 16, 16
    a, b = self.random((m, k)), self.random((k, n))

    @jax.custom_vjp
    def mm(x, y):
      return matmul(x, y)

    def fwd(x, y):
      return matmul(x, y), (x, y)

    def bwd(res, g):
      x, y = res
      return matmul(g, y.T), matmul(x.T, g)

    mm.defvjp(fwd, bwd)
    loss = lambda x, y: jnp.sum(mm(x, y) ** 2)
    args = (self.put(a, self.mesh1d, P("x")), self.put(b, self.mesh1d, P()))
    grad = jax.grad(loss, argnums=(0, 1))
    da, db = jax.jit(grad)(*args)
    c = a.astype(np.float64) @ b
    self.assertDotClose(da, 2 * c @ b.T)
    self.assertDotClose(db, 2 * a.T @ c)
    self.assertEqual(spec_of(da), P("x"))
    # dB contracts over the row-split M: one all-reduce. Nothing else
    # communicates: the loss's own value is not needed for its gradient.
    self.assertEqual(collectives(grad, *args),
                     collections.Counter({"all-reduce": 1}))

  def test_vmap_over_a_sharded_batch_names_the_fix(self):
    x = self.random((self.count, 4, 8))
    xs = self.put(x, self.mesh1d, P("x", None, None))
    with self.assertRaisesRegex(
        NotImplementedError,
        r"kernel 'add_kernel' with sharding_rule .* cannot be split over mesh"
        r" \{'x': \d+\}: under jax.vmap, the batch dimension is sharded.*"
        r"batch as a factor of its own.*jax.sharding.reshard"):
      jax.jit(jax.vmap(add))(xs, xs)

  def test_vmap_over_a_replicated_batch_runs(self):
    shape = (3, 2 * self.count, 8)
    x, y = self.random(shape), self.random(shape)
    spec = P(None, "x", None)
    out = jax.jit(jax.vmap(add))(self.put(x, self.mesh1d, spec),
                                 self.put(y, self.mesh1d, spec))
    self.assertAllClose(out, x + y)

  def test_without_a_rule_the_placement_error_points_to_it(self):
    shape = (2 * self.count,)
    xs = self.put(self.random(shape), self.mesh1d, P("x"))

    def no_rule(a):
      return jt_dist.triton_call(
          a, a, a.size, kernel=sharded_add.add_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(1,),
          BLOCK=64)

    with self.assertRaisesRegex(jt_dist.DevicePlacementError,
                                r"args\[0\].*sharding_rule=jt_dist\."
                                r"ShardingRule"):
      jax.jit(no_rule)(xs)

  def test_auto_axes_raise_a_clear_error_on_the_cpu(self):
    if testing.platform() == "gpu":
      self.skipTest("on GPUs automatic axes go through custom_partitioning")
    mesh = self.mesh((self.count,), ("x",), explicit=False)
    shape = (2 * self.count, 8)
    xs = self.put(self.random(shape), mesh, P("x"))
    with self.assertRaises(NotImplementedError) as ctx:
      jax.jit(add)(xs, xs)
    self.assertIsInstance(ctx.exception, jt_dist.AutoAxesError)
    message = str(ctx.exception)
    for part in ("ShardingRule('i j, i j -> i j')", "['x']", "on cpu",
                 "custom_partitioning crashes the process",
                 "AxisType.Explicit", "sharded_triton_call"):
      self.assertIn(part, message)

  def test_auto_axes_given_to_jit_raise_at_lowering(self):
    mesh = self.mesh((self.count,), ("x",), explicit=False)
    shape = (2 * self.count, 8)
    x = self.random(shape)
    f = jax.jit(add, in_shardings=NamedSharding(mesh, P("x")))
    with self.assertRaisesRegex(
        jt_dist.AutoAxesError,
        rf"add_kernel.*lowered under jax.jit for {self.count} devices.*"
        r"given only to jax.jit.*AxisType.Explicit.*jax.set_mesh"):
      f(x, x)

  def test_auto_axes_on_gpus_are_partitioned_by_xla(self):
    if testing.platform() != "gpu":
      self.skipTest("needs GPUs: on the CPU automatic axes are refused")
    mesh = self.mesh((self.count,), ("k",), explicit=False)
    m, k, n = 32, 32 * self.count, 32
    a, b = self.random((m, k)), self.random((k, n))
    args = (self.put(a, mesh, P(None, "k")), self.put(b, mesh, P("k")))
    with jax.set_mesh(mesh):
      out = jax.jit(matmul)(*args)
      found = collectives(matmul, *args)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(found, collections.Counter({"all-reduce": 1}))

  def test_auto_axes_eagerly_split_by_the_arrays_shardings(self):
    mesh = self.mesh((self.count,), ("x",), explicit=False)
    shape = (2 * self.count, 8)
    x, y = self.random(shape), self.random(shape)
    out = add(self.put(x, mesh, P("x")), self.put(y, mesh, P("x")))
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x"))

  def test_sharded_triton_call_takes_the_rule_for_specs(self):
    m, k, n = 16, 8 * self.count, 16
    a, b = self.random((m, k)), self.random((k, n))
    mesh = self.mesh((self.count,), ("k",), explicit=False)
    out = jt_dist.sharded_triton_call(
        a, b, jt_dist.shard_size(0, 0), jt_dist.shard_size(1, 1),
        jt_dist.shard_size(0, 1),
        kernel=auto_partitioned_matmul.matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), np.float32),
        grid=lambda meta: (triton.cdiv(meta["M"], 16),
                           triton.cdiv(meta["N"], 16)),
        mesh=mesh, in_specs=(P(None, "k"), P("k")),
        sharding_rule=auto_partitioned_matmul.MATMUL_RULE,
        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(spec_of(out), P())

  def test_sharded_triton_call_with_rule_and_inferred_specs_under_jit(self):
    shape = (4 * self.count, 8)
    x, y = self.random(shape), self.random(shape)
    xs, ys = (self.put(v, self.mesh2d, P("x", "y")) for v in (x, y))

    def f(a, b):
      return jt_dist.sharded_triton_call(
          a, b, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          grid=lambda meta: (triton.cdiv(meta["n_elements"], 16),),
          sharding_rule=ADD_RULE, BLOCK=16)

    out = jax.jit(f)(xs, ys)
    self.assertAllClose(out, x + y)
    self.assertEqual(spec_of(out), P("x", "y"))
    self.assertEqual(collectives(f, xs, ys), collections.Counter())


class AutoAxesPlumbingTest(testing.TestCase):
  """The custom_partitioning route with a jnp body in place of the kernel.

  The route is for GPUs; on the CPU the kernel itself cannot run inside
  custom_partitioning, but the partitioner's plan, its per-device body and
  the reductions can, with XLA's own ops standing in for the kernel.
  """

  def _matmul(self, a, b):
    def stand_in(x, y, *, kernel, out_shape, grid):
      del kernel, grid
      self.assertEqual(out_shape.shape, (x.shape[0], y.shape[1]))
      return jnp.dot(x, y, preferred_element_type=jnp.float32)

    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    shapes, tree = _outputs.flatten_out_shape(out)
    return _partition.run_auto((a, b), stand_in, None, shapes, tree, None,
                               auto_partitioned_matmul.MATMUL_RULE, {}, "test")

  @parameterized.named_parameters(
      ("k_split", P(None, "x"), P("x"), P(), {"all-reduce": 1}),
      ("rows", P("x"), P(), P("x"), {}),
  )
  def test_partitioned_by_the_rule(self, spec_a, spec_b, out_spec, expected):
    self.devices(2)
    count = min(len(jax.devices()), 8)
    mesh = jax.make_mesh((count,), ("x",), devices=jax.devices()[:count],
                         axis_types=(AxisType.Auto,))
    a, b = self.random((8 * count, 16 * count)), self.random((16 * count, 8))
    f = jax.jit(self._matmul, in_shardings=(NamedSharding(mesh, spec_a),
                                            NamedSharding(mesh, spec_b)))
    out = f(a, b)
    self.assertDotClose(out, a.astype(np.float64) @ b)
    self.assertEqual(spec_of(out), out_spec)
    self.assertEqual(collectives(f, a, b), collections.Counter(expected))


def _can_lower_for_cuda():
  module = _compat.gpu_triton_module()
  return hasattr(getattr(module, "_cuda_triton", None), "TritonKernel")


class ExportTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.devices(2)  # Skips on a host with fewer.
    devices = jax.devices()
    self.count = min(len(devices), 8) - min(len(devices), 8) % 2
    self.mesh = jax.make_mesh((self.count,), ("x",), devices=devices[
        :self.count], axis_types=(AxisType.Explicit,))

  def _exported(self, platform, cc):
    shape = (4 * self.count, 8)
    arg = jax.ShapeDtypeStruct(shape, np.float32,
                               sharding=NamedSharding(self.mesh, P("x")))

    def f(a, b):
      return jt_dist.triton_call(
          a, b, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          grid=lambda meta: (triton.cdiv(meta["n_elements"], 16),),
          sharding_rule=ADD_RULE, compute_capability=cc, BLOCK=16)

    checks = [jax.export.DisabledSafetyCheck.custom_call(name)
              for name in ("triton_kernel_call", "triton_kernel_call_ffi")]
    return jax.export.export(jax.jit(f), platforms=[platform],
                             disabled_checks=checks)(arg, arg)

  @unittest.skipUnless(_can_lower_for_cuda(),
                       "needs jaxlib's Triton custom call (jax-cuda12-plugin)")
  def test_export_for_cuda_splits_per_shard(self):
    on_gpu = testing.platform() == "gpu"
    exported = self._exported("cuda", None if on_gpu else 90)
    text = exported.mlir_module()
    self.assertEqual(exported.nr_devices, self.count)
    self.assertEqual(len(re.findall(r"custom_call @triton_kernel_call", text)),
                     1)
    self.assertIn("sdy.manual_computation", text)
    self.assertNotIn("all_gather", text)
    self.assertEqual(spec_of(exported.out_avals[0]), P("x"))
    again = jax.export.deserialize(exported.serialize())
    self.assertEqual(again.out_avals, exported.out_avals)
    if not on_gpu:
      return
    shape = exported.in_avals[0].shape
    x, y = self.random(shape), self.random(shape)
    put = lambda v: jax.device_put(v, NamedSharding(self.mesh, P("x")))
    out = again.call(put(x), put(y))
    self.assertAllClose(out, x + y)

  def test_export_for_cpu_is_refused_per_shard(self):
    # The CPU path is a host callback, which jax.export cannot serialize;
    # the explicit-axes program itself is exportable (see the CUDA test).
    # jt_dist refuses inside the split, naming the kernel and the fix.
    with self.assertRaisesRegex(
        NotImplementedError,
        r"kernel 'add_kernel' cannot be exported .* for the CPU.*"
        r"platforms=\['cuda'\]"):
      self._exported("cpu", None)


if __name__ == "__main__":
  absltest.main()
