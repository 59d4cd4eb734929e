"""sharded_triton_call over meshes of >= 2 devices.

Runs on virtual CPU devices through Triton's interpreter (8 under pytest)
and on every real GPU when there are at least 2. Results are compared with
NumPy in float64, or with the same kernel unsharded on one device.
"""

import functools
import os
import re
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import layernorm_training  # pylint: disable=g-import-not-at-top
from examples import sharded_add  # pylint: disable=g-import-not-at-top
from examples import sharded_attention  # pylint: disable=g-import-not-at-top
from examples import sharded_matmul  # pylint: disable=g-import-not-at-top
sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
import script_util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import double_and_shift_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

testing.configure_cpu_devices()


def _gpu():
  return testing.platform() == "gpu"


def _program_text(f, args, platform):
  """The lowered module of ``jax.jit(f)`` without source locations, nor the
  process-wide index each CPU kernel call gets."""
  lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))
  text = lowered.as_text()
  text = re.sub(r"loc\((#loc\d*|\"[^\"]*\"[^)]*)\)", "", text)
  text = re.sub(r"#loc\d*( = .*)?", "", text)
  text = re.sub(r"index = \d+ : ui64", "index", text)
  return re.sub(r"jit_\w+", "jit_fn", text)


def _rel_error(actual, expected):
  actual = np.asarray(actual, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@triton.jit
def scale_rows_kernel(x_ptr, s_ptr, n_cols, out_ptr, BLOCK: tl.constexpr):
  """out[r, :] = x[r, :] * s[:] -- s is the same on every shard."""
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
  s = tl.load(s_ptr + cols, mask=mask)
  tl.store(out_ptr + row * n_cols + cols, x * s, mask=mask)


@triton.jit
def reciprocal_kernel(x_ptr, out_ptr, Z: tl.constexpr, BLOCK: tl.constexpr):
  """out = 1 / Z, whatever x: the sign of a zero Z shows."""
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, 1.0 / tl.full((BLOCK,), Z, tl.float32))


class ShardedTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.all = self.devices(2)
    count = min(len(self.all), 8)
    self.count = count - count % 2
    self.mesh1d = jax.make_mesh((self.count,), ("x",),
                                devices=self.all[:self.count])
    self.mesh2d = jax.make_mesh((2, self.count // 2), ("x", "y"),
                                devices=self.all[:self.count])

  @parameterized.parameters(False, True)
  def test_add_1d(self, jit):
    n = 64 * self.count
    x, y = self.random((n,)), self.random((n,))
    fn = functools.partial(sharded_add.sharded_add, mesh=self.mesh1d, block=32)
    out = (jax.jit(fn) if jit else fn)(x, y)
    self.assertAllClose(out, x + y)
    self.assertEqual(out.sharding.spec, P("x"))

  def test_add_2d_mesh(self):
    shape = (4, 8 * self.count)
    x, y = self.random(shape), self.random(shape)
    out = jt_dist.sharded_triton_call(
        x, y, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(shape, x.dtype),
        grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),),
        mesh=self.mesh2d, in_specs=(P("x", "y"),) * 2, out_specs=P("x", "y"),
        BLOCK=16)
    self.assertAllClose(out, x + y)

  def test_inferred_specs_and_replicated_operand(self):
    rows, cols = 4 * self.count, 24
    x = jax.device_put(self.random((rows, cols)),
                       NamedSharding(self.mesh1d, P("x")))
    s = jax.device_put(self.random((cols,)), NamedSharding(self.mesh1d, P()))
    out = jt_dist.sharded_triton_call(
        x, s, cols, kernel=scale_rows_kernel,
        out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.float32),
        grid=lambda meta: (meta["x_ptr"].shape[0],), out_specs=P("x"),
        BLOCK=32)
    self.assertAllClose(out, np.asarray(x) * np.asarray(s)[None, :])

  def test_truly_replicated_output(self):
    n = 96
    x, y = self.random((n,)), self.random((n,))
    out = jt_dist.sharded_triton_call(
        x, y, n, kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
        grid=(triton.cdiv(n, 32),), mesh=self.mesh1d,
        in_specs=(P(), P()), out_specs=P(), BLOCK=32)
    self.assertAllClose(out, x + y)
    self.assertEqual(len(out.sharding.device_set), self.count)

  def test_replicated_inputs_default_to_a_replicated_output(self):
    # P() is right when no input is split: the output varies over nothing.
    n = 96
    x, y = self.random((n,)), self.random((n,))
    out = jt_dist.sharded_triton_call(
        x, y, n, kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
        grid=(triton.cdiv(n, 32),), mesh=self.mesh1d, BLOCK=32)
    self.assertAllClose(out, x + y)
    # Replicated over the whole mesh: P() or its spelling P(None,).
    self.assertTrue(out.sharding.is_fully_replicated, out.sharding)
    self.assertEqual(len(out.sharding.device_set), self.count)

  def test_ambient_mesh(self):
    n = 32 * self.count
    x, y = self.random((n,)), self.random((n,))
    with jax.set_mesh(self.mesh1d):
      out = jax.jit(lambda a, b: sharded_add.sharded_add(a, b, None, 32))(x, y)
    self.assertAllClose(out, x + y)

  @parameterized.parameters("cpu", "cuda")
  def test_same_program_as_a_hand_written_shard_map(self, platform):
    # sharded_triton_call must cost nothing over jax.shard_map around
    # triton_call: no extra copies, reshapes, collectives or casts.
    if platform == "cuda" and not util.HAS_TRITON_CALL:
      self.skipTest(util.SKIP_REASON)
    n = 32 * self.count
    x, y = (jax.device_put(self.random((n,)), NamedSharding(self.mesh1d, P("x")))
            for _ in range(2))
    options = dict(kernel=sharded_add.add_kernel, BLOCK=32,
                   grid=lambda meta: (triton.cdiv(meta["n_elements"], 32),))
    if platform == "cuda":
      options["compute_capability"] = 90

    def by_hand(a, b):
      return jt_dist.triton_call(
          a, b, a.size, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          **options)

    def sharded(a, b):
      return jt_dist.sharded_triton_call(
          a, b, jt_dist.shard_size(0), mesh=self.mesh1d, in_specs=(P("x"),) * 2,
          out_specs=P("x"), out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          **options)

    hand = jax.shard_map(by_hand, mesh=self.mesh1d, in_specs=(P("x"),) * 2,
                         out_specs=P("x"))
    texts = [_program_text(f, (x, y), platform) for f in (hand, sharded)]
    self.assertIn("custom_call", texts[0])
    self.assertEqual(texts[0], texts[1])

  def test_matmul_rows_cols(self):
    m, k, n = 16 * 2, 32, 16 * (self.count // 2)
    a, b = self.random((m, k)), self.random((k, n))
    out = jax.jit(lambda p, q: sharded_matmul.matmul_rows_cols(
        p, q, self.mesh2d, (16, 16, 16)))(a, b)
    self.assertLess(_rel_error(out, a.astype(np.float64) @ b), 1e-2)
    self.assertEqual(out.sharding.spec, P("x", "y"))

  def test_matmul_rows_only_matches_unsharded(self):
    m, k, n = 16 * self.count, 32, 32
    a, b = self.random((m, k)), self.random((k, n))
    grid = lambda meta: (triton.cdiv(meta["M"], 16), triton.cdiv(meta["N"], 16))
    common = dict(kernel=sharded_matmul.matmul_kernel, grid=grid,
                  BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    sharded = jt_dist.sharded_triton_call(
        a, b, jt_dist.shard_size(0, axis=0), n, k,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        mesh=self.mesh1d, in_specs=(P("x"), P()), out_specs=P("x"), **common)
    single = jt_dist.triton_call(
        a, b, m, n, k, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        **common)
    self.assertAllClose(sharded, single, rtol=1e-5, atol=1e-5)

  def test_matmul_k_split_with_reduction(self):
    m, k, n = 32, 16 * self.count, 32
    mesh = jax.make_mesh((self.count,), ("k",), devices=self.all[:self.count])
    a, b = self.random((m, k)), self.random((k, n))
    out = jax.jit(lambda p, q: sharded_matmul.matmul_k_split(
        p, q, mesh, (16, 16, 16)))(a, b)
    self.assertLess(_rel_error(out, a.astype(np.float64) @ b), 1e-2)
    self.assertEqual(len(out.sharding.device_set), self.count)

  @parameterized.named_parameters(("batch", (2, 1)), ("batch_and_heads", (1, 2)))
  def test_attention_over_batch_and_heads(self, split):
    b_axis = self.count // 2 if split == (1, 2) else self.count
    h_axis = 2 if split == (1, 2) else 1
    mesh = jax.make_mesh((b_axis, h_axis), ("b", "h"),
                         devices=self.all[:self.count])
    shape = (b_axis, 2 * h_axis, 32, 16)
    q, k, v = (self.random(shape, low=-1, high=1) for _ in range(3))
    blocks = (64, 64) if _gpu() else (16, 16)
    out = jax.jit(lambda a, b, c: sharded_attention.attention(
        a, b, c, mesh, *blocks))(q, k, v)
    self.assertLess(_rel_error(out, sharded_attention.reference(q, k, v)),
                    1e-2)

  @parameterized.parameters(False, True)
  def test_custom_vjp_training_step(self, remat):
    mesh = jax.make_mesh((2,), ("data",), devices=self.all[:2])
    rows, d = 8, 32
    x = self.random((rows, d)) * 3 + 1
    target = self.random((rows, d))
    params = {"w": jnp.asarray(self.random((d,), low=0.5, high=1.5)),
              "b": jnp.asarray(self.random((d,)))}
    grads = jax.jit(jax.grad(functools.partial(
        layernorm_training.loss_fn, mesh=mesh, remat=remat)))(
            params, x, target)

    def reference_loss(p):
      y = layernorm_training.layer_norm_reference(x, p["w"], p["b"])
      return jnp.mean(jnp.sum((y - target) ** 2, axis=-1))

    expected = jax.grad(reference_loss)(params)
    for name in ("w", "b"):
      self.assertAllClose(grads[name], expected[name], rtol=1e-4, atol=1e-4,
                          msg=name)
    _, losses = layernorm_training.train(x, target, params, mesh, steps=5,
                                         remat=remat)
    self.assertLess(losses[-1], losses[0])


class PlacementByLayoutTest(testing.TestCase):
  """Arrays on another mesh object are moved by one device_put, or taken."""

  def setUp(self):
    super().setUp()
    self.devices8 = self.devices(8)
    self.mesh = jax.make_mesh((8,), ("x",), devices=self.devices8)

  def _add(self, x, y, **kwargs):
    # Blocks of 8 over a whole replicated array: enough for any shard.
    out = jax.ShapeDtypeStruct((64,), jnp.float32)
    return jt_dist.sharded_triton_call(
        x, y, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=out, grid=(8,), mesh=self.mesh, BLOCK=8, **kwargs)

  @parameterized.named_parameters(
      ("auto_axes", ("x",), jax.sharding.AxisType.Auto, P("x")),
      ("other_name", ("z",), jax.sharding.AxisType.Explicit, P("z")),
      ("auto_replicated", ("x",), jax.sharding.AxisType.Auto, P()))
  def test_arrays_on_another_mesh_object(self, names, kind, spec):
    other = jax.sharding.Mesh(np.array(self.devices8), names,
                              axis_types=(kind,))
    x, y = self.random((64,)), self.random((64,))
    a, b = (jax.device_put(v, NamedSharding(other, spec)) for v in (x, y))
    # Left out, in_specs are the arrays' own where their mesh's axes are
    # the call's (else replicated).
    inferred = spec if names == ("x",) else P()
    for in_specs, out_specs in (((P("x"),) * 2, P("x")), (None, inferred)):
      out = self._add(a, b, in_specs=in_specs, out_specs=out_specs)
      self.assertAllClose(out, x + y)

  def test_other_mesh_object_under_a_held_call(self):
    other = jax.sharding.Mesh(np.array(self.devices8), ("x",),
                              axis_types=(jax.sharding.AxisType.Auto,))
    x, y = self.random((64,)), self.random((64,))
    add = jt_dist.sharded_kernel_call(
        sharded_add.add_kernel, out_shape=jax.ShapeDtypeStruct((64,),
                                                               jnp.float32),
        grid=(1,), mesh=self.mesh, in_specs=(P("x"),) * 2, out_specs=P("x"),
        n_elements=jt_dist.shard_size(0), BLOCK=16)
    a, b = (jax.device_put(v, NamedSharding(other, P("x"))) for v in (x, y))
    self.assertAllClose(add(a, b), x + y)
    out = add(add(a, b), jnp.asarray(y))  # Its own output, then a moved one.
    self.assertAllClose(out, x + 2 * y)
    self.assertEqual(out.sharding, NamedSharding(self.mesh, P("x")))


class ShardedKernelCallTest(testing.TestCase):
  """The held sharded call: the same answers as sharded_triton_call."""

  def setUp(self):
    super().setUp()
    self.mesh = jax.make_mesh((4, 2), ("x", "y"), devices=self.devices(8))

  def _held(self, **kwargs):
    options = dict(out_shape=jax.ShapeDtypeStruct((64,), jnp.float32),
                   grid=lambda meta: (triton.cdiv(meta["n_elements"], 8),),
                   mesh=self.mesh, n_elements=jt_dist.shard_size(0), BLOCK=8)
    options.update(kwargs)
    return jt_dist.sharded_kernel_call(sharded_add.add_kernel, **options)

  @parameterized.parameters(False, True)
  def test_eager_and_under_jit(self, jit):
    add = self._held(in_specs=(P(("x", "y")),) * 2, out_specs=P(("x", "y")))
    x, y = self.random((64,)), self.random((64,))
    f = jax.jit(add) if jit else add
    out = f(x, y)
    for _ in range(3):
      out = f(out, y)
    self.assertAllClose(out, x + 4 * y)
    self.assertEqual(out.sharding.spec, P(("x", "y")))
    self.assertIn("sharded_kernel_call(add_kernel", repr(add))

  def test_out_reduce_and_rule(self):
    x, y = self.random((64,)), self.random((64,))
    reduced = self._held(in_specs=(P("x"),) * 2, out_specs=P(),
                         out_reduce=("sum", "x"),
                         out_shape=jax.ShapeDtypeStruct((16,), jnp.float32))
    self.assertAllClose(reduced(x, y),
                        (np.asarray(x) + np.asarray(y)).reshape(4, 16).sum(0))
    ruled = self._held(in_specs=(P("x"), P("y")),
                       sharding_rule=jt_dist.ShardingRule("i, i -> i"))
    self.assertAllClose(ruled(x, y), x + y)

  def test_inferred_specs_and_mesh(self):
    put = lambda v: jax.device_put(v, NamedSharding(self.mesh, P("y")))
    x, y = put(self.random((64,))), put(self.random((64,)))
    add = self._held(mesh=None, out_specs=P("y"))
    self.assertAllClose(add(x, y), x + y)
    self.assertEqual(add(x, y).sharding.spec, P("y"))

  def test_float_metaparams_keyed_by_their_bits(self):
    x = jnp.asarray(self.random((64,)))
    call = lambda z: jt_dist.sharded_triton_call(
        x, kernel=reciprocal_kernel,
        out_shape=jax.ShapeDtypeStruct((64,), jnp.float32), grid=(1,),
        mesh=self.mesh, in_specs=(P("x"),), out_specs=P("x"), Z=z, BLOCK=16)
    # As one device computes it (Triton's versions differ on -0.0).
    for z in (0.0, -0.0, 0.0):
      single = jt_dist.triton_call(
          x[:16], kernel=reciprocal_kernel, grid=(1,), Z=z, BLOCK=16,
          out_shape=jax.ShapeDtypeStruct((16,), jnp.float32))
      np.testing.assert_array_equal(jax.device_get(call(z)),
                                    np.tile(np.asarray(single), 4))

  @parameterized.named_parameters(
      ("replicated", lambda mesh, v: jax.device_put(
          v, NamedSharding(mesh, P()))),
      ("other_axis", lambda mesh, v: jax.device_put(
          v, NamedSharding(mesh, P("y")))),
      ("one_device", lambda mesh, v: jax.device_put(v, mesh.devices.flat[1])),
      ("numpy", lambda mesh, v: v),
      ("uncommitted", lambda mesh, v: jnp.asarray(v)),
      ("other_mesh_object", lambda mesh, v: jax.device_put(v, NamedSharding(
          jax.sharding.Mesh(mesh.devices, mesh.axis_names,
                            axis_types=(jax.sharding.AxisType.Auto,) * 2),
          P(("x", "y"))))))
  def test_operands_laid_out_otherwise_after_laid_out_ones(self, lay_out):
    # Once a call has taken jax's dispatch alone, operands on any other
    # layout are still moved to in_specs' first, never passed through.
    add = self._held(in_specs=(P(("x", "y")),) * 2, out_specs=P(("x", "y")))
    x, y = self.random((64,)), self.random((64,))
    laid = lambda v: jax.device_put(v, NamedSharding(self.mesh, P(("x", "y"))))
    out = add(add(laid(x), laid(y)), laid(y))  # The second: the fast path.
    np.testing.assert_allclose(jax.device_get(out), x + 2 * y, rtol=1e-6)
    z = self.random((64,))
    out = add(lay_out(self.mesh, z), lay_out(self.mesh, y))
    np.testing.assert_allclose(jax.device_get(out), z + y, rtol=1e-6)
    self.assertEqual(out.sharding, NamedSharding(self.mesh, P(("x", "y"))))

  def test_repeated_calls_are_jax_dispatch_in_a_fresh_process(self):
    # In a process that never called sharded_triton_call, too: a repeated
    # call on laid-out operands resolves and places nothing again.
    result = script_util.run_python(["-c", _HELD_IN_A_FRESH_PROCESS])
    script_util.assert_quiet_success(self, result, "a held call")
    self.assertEqual(result.stdout.split(), ["0", "0"])

  def test_bad_specs_at_the_first_call(self):
    add = self._held(in_specs=(P("x"), P("y")))
    with self.assertRaisesRegex(jt_dist.ShardingSpecError, "split"
                                " differently"):
      add(self.random((64,)), self.random((64,)))


_HELD_IN_A_FRESH_PROCESS = """
import cProfile, os, pstats
import jt_dist
import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from examples import sharded_add
for size in (1, len(jax.devices())):
  mesh = jax.make_mesh((size,), ("x",), devices=jax.devices()[:size])
  add = jt_dist.sharded_kernel_call(
      sharded_add.add_kernel, out_shape=jax.ShapeDtypeStruct((64,),
      jnp.float32), grid=(1,), mesh=mesh, in_specs=(P("x"),) * 2,
      out_specs=P("x"), n_elements=jt_dist.shard_size(0), BLOCK=64)
  x = y = jnp.ones(64)
  out = add(add(x, y), y)
  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(3):
    out = add(out, y)
  profiler.disable()
  jax.block_until_ready(out)
  assert float(out[0]) == 6.0, out
  print(sum(1 for (path, *_) in pstats.Stats(profiler).stats
            if os.sep + "_sharding" + os.sep in path))
"""


_COLLECTIVES = ("all_reduce", "all_gather", "all_to_all",
                "collective_permute", "reduce_scatter")


def _program_ops(f, args, platform):
  """The lowered program's kernel custom calls and collectives, counted."""
  text = _program_text(f, args, platform)
  counts = {"kernels": testing.kernel_launches(
      text, "gpu" if platform == "cuda" else "cpu")}
  for op in _COLLECTIVES:
    if n := len(re.findall(rf"stablehlo\.{op}\b", text)):
      counts[op] = n
  # Before partitioning, a reshard is a constraint XLA turns into one. Some
  # jax versions (0.12) constrain every shard_map's result to its out_specs
  # themselves: those are jax's, counted on a bare shard_map and taken off.
  shard_maps = len(re.findall(r"sdy\.manual_computation\b", text))
  reshards = (len(re.findall(r"sdy\.sharding_constraint\b", text))
              - shard_maps * _constraints_per_shard_map(platform))
  for name, n in (("shard_maps", shard_maps), ("reshards", reshards)):
    if n:
      counts[name] = n
  return counts


def _constraints_per_shard_map(platform):
  """The sharding constraints jax itself adds to a bare jax.shard_map."""
  mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
  f = jax.shard_map(lambda a: a, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  x = jax.ShapeDtypeStruct((4,), jnp.float32,
                           sharding=NamedSharding(mesh, P("x")))
  text = _program_text(f, (x,), platform)
  return len(re.findall(r"sdy\.sharding_constraint\b", text))


class ShardedProgramTest(testing.TestCase):
  """Under jax.jit a sharded call is one kernel launch per shard, and the
  collectives its plan needs: nothing the front door adds."""

  def setUp(self):
    super().setUp()
    self.mesh = jax.make_mesh((4, 2), ("x", "y"), devices=self.devices(8))

  def _plain(self, a, b):
    return jt_dist.sharded_triton_call(
        a, b, jt_dist.shard_size(0), kernel=sharded_add.add_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=lambda meta: (triton.cdiv(meta["n_elements"], 16),),
        mesh=self.mesh, in_specs=(P(("x", "y")),) * 2,
        out_specs=P(("x", "y")), BLOCK=16, **self.options)

  def _reduced(self, a, b):
    return sharded_matmul._call(a, b, self.mesh, (P(None, "x"), P("x", None)),
                                P(), ("sum", "x"), (16, 16, 16), jnp.float32)

  def _ruled(self, a, b):
    rule = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})
    return jt_dist.sharded_triton_call(
        a, b, jt_dist.shard_size(0, axis=0), jt_dist.shard_size(1, axis=1),
        jt_dist.shard_size(0, axis=1), kernel=sharded_matmul.matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
        grid=(1, 1), mesh=self.mesh, sharding_rule=rule, BLOCK_M=16,
        BLOCK_N=16, BLOCK_K=16, **self.options)

  @parameterized.product(platform=("cpu", "cuda"), case=(
      ("plain", {"kernels": 1, "shard_maps": 1}),
      # Host arrays: laid out by the specs inside the program.
      ("reduced", {"kernels": 1, "all_reduce": 1, "shard_maps": 1,
                   "reshards": 2}),
      ("ruled", {"kernels": 1, "all_reduce": 1, "shard_maps": 1}),
      ("ruled_resharded", {"kernels": 1, "all_reduce": 1, "shard_maps": 1,
                           "reshards": 1})))
  def test_one_kernel_per_shard_and_the_plan_s_collectives(self, platform,
                                                           case):
    name, expected = case
    if platform == "cuda" and not util.HAS_TRITON_CALL:
      self.skipTest(util.SKIP_REASON)
    self.options = {"compute_capability": 90} if platform == "cuda" else {}
    put = lambda x, spec: jax.device_put(x, NamedSharding(self.mesh, spec))
    if name == "plain":
      f, args = self._plain, [put(self.random((64,)), P(("x", "y")))] * 2
    elif name == "reduced":
      if platform == "cuda":
        self.skipTest("sharded_matmul takes no compute_capability")
      f, args = self._reduced, (self.random((16, 32)), self.random((32, 16)))
    else:
      # Resharded: B split along K over "y", where the plan (from A) splits
      # K over "x": moved first.
      b_spec = P("y", None) if name == "ruled_resharded" else P("x", None)
      f, args = self._ruled, (put(self.random((16, 32)), P(None, "x")),
                              put(self.random((32, 16)), b_spec))
    self.assertEqual(_program_ops(f, args, platform), expected)


class ShardedErrorsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    devices = self.devices(2)
    self.mesh = jax.make_mesh((2,), ("x",), devices=devices[:2])

  def _call(self, *args, **kwargs):
    defaults = dict(kernel=sharded_add.add_kernel, grid=(1,), mesh=self.mesh,
                    BLOCK=16)
    defaults.update(kwargs)
    return jt_dist.sharded_triton_call(*args, **defaults)

  def _out(self, n):
    return jax.ShapeDtypeStruct((n,), jnp.float32)

  def test_indivisible_dimension(self):
    x = self.random((9,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 9, out_shape=self._out(9), in_specs=(P("x"), P("x")),
                 out_specs=P("x"))
    message = str(cm.exception)
    for part in ("args[0]", "(9,)", "dimension 0", "size 9", "('x',)",
                 "x=2", "not divisible by 2"):
      self.assertIn(part, message)

  def test_unknown_axis(self):
    x = self.random((8,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 8, out_shape=self._out(8), in_specs=(P("x"), P("z")))
    message = str(cm.exception)
    for part in ("args[1]", "['z']", "x=2"):
      self.assertIn(part, message)

  def test_wrong_number_of_in_specs(self):
    x = self.random((8,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 8, out_shape=self._out(8), in_specs=(P("x"),))
    message = str(cm.exception)
    for part in ("1 in_specs", "2 array arguments", "args[0, 1]"):
      self.assertIn(part, message)

  def test_spec_longer_than_rank(self):
    x = self.random((8,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 8, out_shape=self._out(8),
                 in_specs=(P("x", None), P("x")))
    message = str(cm.exception)
    for part in ("args[0]", "2 entries", "(8,)", "rank 1"):
      self.assertIn(part, message)

  def test_axis_used_twice(self):
    mesh = jax.make_mesh((2, 1), ("x", "y"), devices=self.devices(2)[:2])
    x = self.random((4, 4))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 16, out_shape=jax.ShapeDtypeStruct((4, 4), jnp.float32),
                 mesh=mesh, in_specs=(P("x", "x"), P()))
    message = str(cm.exception)
    for part in ("args[0]", "['x']", "more than once"):
      self.assertIn(part, message)

  def test_out_specs_checked_against_global_out_shape(self):
    x = self.random((8,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, x, 8, out_shape=self._out(7), in_specs=(P(), P()),
                 out_specs=P("x"))
    self.assertIn("output 0 of shape (7,)", str(cm.exception))

  @parameterized.named_parameters(
      ("scalar", 2, "a scalar"), ("missing", 5, "has 3 positional arguments"))
  def test_shard_size_pointing_at_nothing(self, index, expected):
    x = self.random((8,))
    with self.assertRaises(ValueError) as cm:
      self._call(x, x, jt_dist.shard_size(index), out_shape=self._out(8),
                 in_specs=(P("x"), P("x")), out_specs=P("x"))
    message = str(cm.exception)
    self.assertIn(f"args[{index}]", message)
    self.assertIn(expected, message)

  def test_bad_reduction(self):
    x = self.random((8,))
    with self.assertRaisesRegex(ValueError, "'mean'.*one of"):
      self._call(x, x, 8, out_shape=self._out(8), in_specs=(P(), P()),
                 out_reduce=("mean", "x"))

  def _assert_names(self, caught, parts):
    message = str(caught.exception)
    for part in parts:
      self.assertIn(part, message)
    # Neither shard_map's internals nor its advice, which would be wrong.
    for part in ("per_shard", "_rem_singleton", "check_vma"):
      self.assertNotIn(part, message)

  @parameterized.parameters(False, True)
  def test_split_inputs_without_out_specs(self, jit):
    x = jax.device_put(self.random((8,)), NamedSharding(self.mesh, P("x")))
    call = lambda a: self._call(a, a, jt_dist.shard_size(0),
                                out_shape=self._out(8))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      (jax.jit(call) if jit else call)(x)
    self._assert_names(cm, (
        "output 0 (out_shape, global shape (8,))", "mesh axes ['x']",
        "args[0] with spec P('x')", "args[1] with spec P('x')",
        "out_specs was left out", "out_specs=P('x')",
        "out_reduce=('sum', 'x')"))

  def test_out_spec_missing_an_axis_names_the_inferred_spec(self):
    mesh = jax.make_mesh((2, 1), ("x", "y"), devices=self.devices(2)[:2])
    m, k, n = 32, 16, 48  # M != N: each axis maps to one output dimension.
    a, b = self.random((m, k)), self.random((k, n))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      sharded_matmul._call(a, b, mesh, (P("x", None), P(None, "y")), P("x"),
                           None, (16, 16, 16), jnp.float32)
    self._assert_names(cm, (
        "global shape (32, 48)", "mesh axes ['x', 'y']",
        "its out_specs entry is P('x')", "does not name ['y']",
        "args[1] with spec P(None, 'y')", "out_specs=P('x', 'y')",
        "out_reduce=('sum', 'y')"))

  def test_k_split_without_out_reduce(self):
    mesh = jax.make_mesh((2,), ("k",), devices=self.devices(2)[:2])
    m, k, n = 16, 32, 16
    a, b = self.random((m, k)), self.random((k, n))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      sharded_matmul._call(a, b, mesh, (P(None, "k"), P("k", None)), P(),
                           None, (16, 16, 16), jnp.float32)
    # No output dimension has K's size: no spec is guessed.
    self._assert_names(cm, (
        "its out_specs entry is P()", "name mesh axes ['k'] in its"
        " out_specs entry", "out_reduce=('sum', 'k')"))
    self.assertNotIn("out_specs=P(", str(cm.exception))

  def test_reduced_output_still_varying_over_another_axis(self):
    mesh = jax.make_mesh((2, 1), ("k", "y"), devices=self.devices(2)[:2])
    m, k, n = 16, 32, 48
    a, b = self.random((m, k)), self.random((k, n))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      sharded_matmul._call(a, b, mesh, (P("y", "k"), P("k", None)), P(),
                           ("sum", "k"), (16, 16, 16), jnp.float32)
    self._assert_names(cm, (
        "varies over mesh axes ['y']", "args[0] with spec P('y', 'k')",
        "its out_specs entry is P()", "pass out_specs=P('y')",
        "partial over ['y'] too", "out_reduce=('sum', ('k', 'y'))"))

  def test_pytree_output_names_its_path(self):
    x = self.random((8,))
    with self.assertRaises(jt_dist.ShardingSpecError) as cm:
      self._call(x, jt_dist.shard_size(0), kernel=double_and_shift_kernel,
                 out_shape={"doubled": self._out(8), "shifted": self._out(8)},
                 in_specs=(P("x"),),
                 out_specs={"doubled": P("x"), "shifted": P()})
    self._assert_names(cm, (
        "output 1 (out_shape['shifted']", "its out_specs entry is P()",
        "out_specs={'doubled': P('x'), 'shifted': P('x')}",
        "give out_shape['shifted'] the pair ('sum', 'x') in out_reduce"))

  def test_no_mesh(self):
    x = self.random((8,))
    with self.assertRaisesRegex(jt_dist.ShardingSpecError, "no mesh"):
      self._call(x, x, 8, out_shape=self._out(8), mesh=None)


if __name__ == "__main__":
  absltest.main()
