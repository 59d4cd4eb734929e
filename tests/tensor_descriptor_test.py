"""``jt_dist.TensorDescriptor``: host-side TMA descriptors as arguments
and as outputs declared in ``out_shape``.

On the CPU the interpreter runs the descriptor's accesses through the
bounds checker; on CUDA the call is cross-lowered where jaxlib's CUDA
plugin is installed: a TMA descriptor parameter on Hopper (jaxlib 0.11.2
and later), the base pointer with its shape and strides before Hopper.
"""

from __future__ import annotations

import re
import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import jaxlib
import numpy as np
import triton
import triton.language as tl
from triton.tools import tensor_descriptor as host_descriptor

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util
from feature_kernels import desc_copy_kernel
from feature_kernels import desc_double_in_place_kernel
from feature_kernels import desc_double_kernel
from feature_kernels import rows_to_desc_kernel


@triton.jit
def desc_tile_kernel(in_desc, scale, out_ptr, N: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr):
  """Each program copies one (BM, BN) tile, times ``scale``."""
  i, j = tl.program_id(0), tl.program_id(1)
  block = in_desc.load([i * BM, j * BN]) * scale
  rows = i * BM + tl.arange(0, BM)[:, None]
  cols = j * BN + tl.arange(0, BN)[None, :]
  tl.store(out_ptr + rows * N + cols, block)


def _triton_rounds_to_tf32() -> bool:
  """Whether Triton's host descriptors take ``round_f32_to_tf32`` (3.9)."""
  return "round_f32_to_tf32" in getattr(host_descriptor.TensorDescriptor,
                                        "__dataclass_fields__", {})


def _copy(desc, m, n, **options):
  return jt_dist.triton_call(
      desc, kernel=desc_copy_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), desc.base.dtype), grid=1, M=m,
      N=n, **options)


def _tiles(desc, scale, bm=8, bn=16, **options):
  m, n = desc.base.shape
  return jt_dist.triton_call(
      desc, scale, kernel=desc_tile_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), desc.base.dtype),
      grid=(m // bm, n // bn), N=n, BM=bm, BN=bn, **options)


class TensorDescriptorTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    jax.clear_caches()

  @parameterized.product(shape=[(8, 16), (16, 32)],
                         dtype=[np.float32, np.float16, np.int8])
  def test_copy(self, shape, dtype):
    x = jnp.asarray(self.random(shape, dtype))
    desc = jt_dist.TensorDescriptor.from_array(x, block_shape=shape)
    np.testing.assert_array_equal(_copy(desc, *shape), x)
    np.testing.assert_array_equal(jax.jit(lambda d: _copy(d, *shape))(desc), x)

  @parameterized.parameters("zero", "nan")
  def test_view_smaller_than_the_block_pads(self, padding):
    x = jnp.asarray(self.random((8, 16)))
    rows = int(self.np_rng.integers(1, 8))
    desc = jt_dist.TensorDescriptor(x, (rows, 16), (16, 1), (8, 16),
                                    padding=padding)
    out = np.asarray(_copy(desc, 8, 16))
    np.testing.assert_array_equal(out[:rows], np.asarray(x)[:rows])
    if padding == "zero":
      np.testing.assert_array_equal(out[rows:], np.zeros_like(out[rows:]))
    else:
      self.assertTrue(np.isnan(out[rows:]).all())

  def test_tiles_with_a_scalar_and_the_fast_path(self):
    x = jnp.asarray(self.random((16, 32)))
    desc = jt_dist.TensorDescriptor.from_array(x, block_shape=(8, 16))
    for scale in (2.0, 3.0):
      self.assertAllClose(_tiles(desc, scale), x * scale)
    # A different view of the same array is another signature, never stale.
    half = jt_dist.TensorDescriptor(x, (16, 16), (32, 1), (8, 16))
    out = np.asarray(_tiles(half, 1.0))
    self.assertAllClose(out[:, :16], np.asarray(x)[:, :16])
    np.testing.assert_array_equal(out[:, 16:], np.zeros((16, 16), np.float32))

  def test_descriptor_is_typed_as_triton_types_it(self):
    x = jnp.asarray(self.random((8, 16)))
    (eqn,) = util.bound_calls(lambda a: _copy(
        jt_dist.TensorDescriptor.from_array(a, (8, 16)), 8, 16), x)
    operand = eqn.params["spec"].operands[0]
    self.assertEqual(operand.name, "in_desc")
    self.assertEqual(operand.type, "tensordesc<fp32[8,16]>")

  def test_under_vmap_one_launch_per_element(self):
    xs = jnp.asarray(self.random((3, 8, 16)))
    out = jax.vmap(lambda a: _copy(
        jt_dist.TensorDescriptor.from_array(a, (8, 16)), 8, 16))(xs)
    np.testing.assert_array_equal(out, xs)

  def test_inside_shard_map(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x = jax.device_put(jnp.asarray(self.random((16, 16))),
                       jax.sharding.NamedSharding(mesh, P("i")))
    f = jax.shard_map(
        lambda a: _copy(jt_dist.TensorDescriptor.from_array(a, (8, 16)), 8,
                        16),
        mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    np.testing.assert_array_equal(jax.jit(f)(x), x)

  def test_sharded_triton_call_refuses_it(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x = jnp.asarray(self.random((16, 16)))
    with self.assertRaisesRegex(NotImplementedError,
                                r"args\[0\] is a TensorDescriptor.*shard_map"):
      jt_dist.sharded_triton_call(
          jt_dist.TensorDescriptor.from_array(x, (8, 16)),
          kernel=desc_copy_kernel, out_shape=x, grid=1, mesh=mesh,
          out_specs=P("i"), M=8, N=16)

  def test_sharding_rule_refuses_it(self):
    x = jnp.asarray(self.random((8, 16)))
    with self.assertRaisesRegex(NotImplementedError,
                                r"args\[0\] is a TensorDescriptor.*sharding_rule"):
      _copy(jt_dist.TensorDescriptor.from_array(x, (8, 16)), 8, 16,
            sharding_rule=jt_dist.ShardingRule("i j -> i j"))

  @parameterized.named_parameters(
      ("ranks", dict(shape=(8, 16), strides=(1,), block_shape=(8, 16)),
       ValueError, r"strides \(1,\) .* same length"),
      ("padding", dict(padding="inf"), ValueError, r"padding='inf'"),
      ("last_stride", dict(strides=(1, 8)), ValueError,
       r"strides \(1, 8\) must end in 1"),
      ("block", dict(block_shape=(8, 12)), ValueError,
       r"block_shape \(8, 12\) must hold powers of two"),
      ("shape", dict(shape=(0, 16)), ValueError,
       r"shape \(0, 16\) must be positive"),
      ("not_ints", dict(shape="ab"), TypeError, r"shape='ab'"))
  def test_bad_descriptor(self, changes, error, message):
    x = jnp.zeros((8, 16), jnp.float32)
    fields = dict(shape=(8, 16), strides=(16, 1), block_shape=(8, 16))
    fields.update(changes)
    with self.assertRaisesRegex(error, f"TensorDescriptor: .*{message}"):
      jt_dist.TensorDescriptor(x, **fields)

  @parameterized.named_parameters(
      ("nan_int", np.int32, dict(padding="nan"), ValueError,
       r"int32 with padding='nan'"),
      ("tf32_half", np.float16, dict(round_f32_to_tf32=True), ValueError,
       r"float16 with round_f32_to_tf32=True"),
      ("too_big", np.float32, dict(shape=(9, 16)), ValueError,
       r"address 144 elements, but its base has shape \(8, 16\)"))
  def test_bad_descriptor_for_its_array(self, dtype, changes, error, message):
    x = jnp.zeros((8, 16), dtype)
    fields = dict(shape=(8, 16), strides=(16, 1), block_shape=(8, 16))
    fields.update(changes)
    with self.assertRaisesRegex(error, rf"args\[0\] .*{message}"):
      _copy(jt_dist.TensorDescriptor(x, **fields), 8, 16)

  def test_base_not_an_array(self):
    desc = jt_dist.TensorDescriptor([1.0], (1,), (1,), (1,))
    with self.assertRaisesRegex(TypeError, r"args\[0\] is a TensorDescriptor"
                                r" whose base is \[1.0\] of type list"):
      jt_dist.triton_call(desc, kernel=desc_copy_kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.float32), grid=1, M=1, N=1)

  def test_tf32_rounding(self):
    if not _triton_rounds_to_tf32():
      x = jnp.zeros((8, 16), jnp.float32)
      with self.assertRaisesRegex(NotImplementedError,
                                  r"round_f32_to_tf32=True.*Triton"):
        _copy(jt_dist.TensorDescriptor.from_array(
            x, (8, 16), round_f32_to_tf32=True), 8, 16)
      return
    x = jnp.asarray(self.random((8, 16)))
    out = _copy(jt_dist.TensorDescriptor.from_array(
        x, (8, 16), round_f32_to_tf32=True), 8, 16)
    if testing.platform() == "cpu":
      expected = jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)
      np.testing.assert_array_equal(out, expected)

  def test_public_and_a_pytree(self):
    self.assertIn("TensorDescriptor", jt_dist.__all__)
    x = jnp.zeros((8, 16))
    desc = jt_dist.TensorDescriptor.from_array(x, (8, 16))
    leaves, tree = jax.tree_util.tree_flatten(desc)
    self.assertLen(leaves, 1)
    self.assertIs(leaves[0], x)
    self.assertEqual(jax.tree_util.tree_unflatten(tree, leaves), desc)
    self.assertEqual(desc.strides, (16, 1))


def _out_desc(shape, dtype=jnp.float32, rows=None, block=(8, 16)):
  """An output declared as a descriptor of its first ``rows`` rows."""
  rows = shape[0] if rows is None else rows
  return jt_dist.TensorDescriptor(jax.ShapeDtypeStruct(shape, dtype),
                                  (rows, shape[1]), (shape[1], 1), block)


def _double(x, out_shape, **options):
  return jt_dist.triton_call(
      jt_dist.TensorDescriptor.from_array(x, (8, 16)), kernel=desc_double_kernel,
      out_shape=out_shape, grid=(x.shape[0] // 8,), BM=8, **options)


def _tma_device() -> bool:
  """Whether the default device builds TMA descriptors (Hopper and later)."""
  device = jax.devices()[0]
  return device.platform == "gpu" and float(device.compute_capability) >= 9


class DescriptorOutputTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_the_kernel_stores_through_it_and_the_call_returns_the_array(
      self, jit):
    x = jnp.asarray(self.random((32, 16)))
    call = lambda a: _double(a, {"y": _out_desc(a.shape)})
    out = (jax.jit(call) if jit else call)(x)
    self.assertIsInstance(out["y"], jax.Array)
    np.testing.assert_array_equal(out["y"], 2 * x)

  def test_it_binds_a_descriptor_parameter(self):
    (eqn,) = util.bound_calls(lambda a: _double(a, _out_desc(a.shape)),
                              jnp.zeros((32, 16)))
    self.assertEqual([(op.name, op.kind, op.type)
                      for op in eqn.params["spec"].operands],
                     [("in_desc", "array", "tensordesc<fp32[8,16]>"),
                      ("out_desc", "output", "tensordesc<fp32[8,16]>")])

  def test_rows_outside_its_shape_are_not_written(self):
    x = jnp.asarray(self.random((32, 16)))
    call = lambda: _double(x, [_out_desc(x.shape, rows=20)],
                           zeroed_outputs=[0])[0]
    # The fix the refusal on Hopper gives: a zeros input, aliased, is the
    # descriptor.
    zeros = jt_dist.TensorDescriptor(jnp.zeros_like(x), (20, 16), (16, 1),
                                     (8, 16))
    fixed = lambda: jt_dist.triton_call(
        jt_dist.TensorDescriptor.from_array(x, (8, 16)), zeros,
        kernel=desc_double_kernel, out_shape=[jax.ShapeDtypeStruct(
            x.shape, x.dtype)], grid=(4,), BM=8, input_output_aliases={1: 0})[0]
    if _tma_device():
      with self.assertRaisesRegex(
          NotImplementedError, r"'out_desc' takes a TensorDescriptor of a"
          r" zeroed output.*alias a jnp.zeros input to it"):
        call()
      call = fixed
    for out in (call(), fixed()):
      np.testing.assert_array_equal(out[:20], 2 * x[:20])
      np.testing.assert_array_equal(out[20:], 0)

  def test_eager_calls_of_descriptors_differing_in_shape_each_bind_their_own(
      self):
    x = jnp.asarray(self.random((32, 16)))
    # Hopper's TMA descriptors cannot be zeroed (tested above); there the
    # rows past the descriptor are left as they were.
    zeroed = [] if _tma_device() else [0]
    for rows in (32, 16, 32, 8):  # One array and block: only shape differs.
      out = jt_dist.triton_call(
          x, kernel=rows_to_desc_kernel,
          out_shape=_out_desc(x.shape, rows=rows), grid=(4,), N=16, BM=8,
          zeroed_outputs=zeroed)
      np.testing.assert_array_equal(out[:rows], 2 * x[:rows])
      if zeroed:
        np.testing.assert_array_equal(out[rows:], 0)

  def test_one_larger_than_its_array_is_refused(self):
    bad = jt_dist.TensorDescriptor(jax.ShapeDtypeStruct((32, 16), jnp.float32),
                                   (40, 16), (16, 1), (8, 16))
    with self.assertRaisesRegex(
        ValueError, r"out_shape\['y'\] is a TensorDescriptor with shape"
        r" \(40, 16\).*Describe a view inside the array"):
      _double(jnp.zeros((32, 16)), {"y": bad})

  def test_an_aliased_output_descriptor_is_refused_and_the_fix_works(self):
    x = jnp.asarray(self.random((32, 16)))
    # The message names the entry by its path in out_shape.
    for out_shape, where in (([_out_desc(x.shape)], r"out_shape\[0\]"),
                             ({"c": _out_desc(x.shape)}, r"out_shape\['c'\]")):
      with self.assertRaisesRegex(
          jt_dist.KernelBindingError, rf"out_shape declares output 0"
          rf" \({where}\) as a TensorDescriptor.*aliased to array argument"
          rf" 0.*Pass that input as the TensorDescriptor, and {where} as its"
          r" jax.ShapeDtypeStruct"):
        jt_dist.triton_call(x, kernel=desc_double_in_place_kernel,
                            out_shape=out_shape, grid=(4,), BM=8,
                            input_output_aliases={0: 0})
    (out,) = jt_dist.triton_call(
        jt_dist.TensorDescriptor.from_array(x, (8, 16)),
        kernel=desc_double_in_place_kernel,
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)], grid=(4,), BM=8,
        input_output_aliases={0: 0})
    np.testing.assert_array_equal(out, 2 * x)

  @parameterized.named_parameters(("sharded_triton_call", "sharded"),
                                  ("sharding_rule", "rule"))
  def test_split_calls_refuse_one_and_the_fix_works(self, how):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    x = jax.device_put(jnp.asarray(self.random((32, 16))),
                       jax.sharding.NamedSharding(mesh, P("i")))
    options = dict(kernel=rows_to_desc_kernel, grid=(2,), N=16, BM=8)
    with self.assertRaisesRegex(
        NotImplementedError, r"call: out_shape\[0\] is a TensorDescriptor"
        r".*inside jax.shard_map"):
      if how == "sharded":
        jt_dist.sharded_triton_call(
            x, out_shape=[_out_desc((32, 16))], mesh=mesh, in_specs=P("i"),
            out_specs=[P("i")], **options)
      else:
        jt_dist.triton_call(x, out_shape=[_out_desc((32, 16))],
                            sharding_rule=jt_dist.ShardingRule("i j -> i j"),
                            **options)
    # The fix: each shard declares its own.
    f = jax.shard_map(
        lambda a: jt_dist.triton_call(a, out_shape=[_out_desc(a.shape)],
                                      **options),
        mesh=mesh, in_specs=P("i"), out_specs=[P("i")])
    np.testing.assert_array_equal(jax.jit(f)(x)[0], 2 * x)


def _ptx_params(ptx: str) -> int:
  entry = ptx[ptx.index(".entry"):]
  return len(re.findall(r"\.param \.", entry[:entry.index("{")]))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class TensorDescriptorCudaTest(util.IsolatedCacheMixin, testing.TestCase):

  def _lower(self, cc, shape=(8, 16)):
    x = jnp.asarray(self.random(shape))
    return util.lower(lambda a: _copy(jt_dist.TensorDescriptor.from_array(
        a, shape), *shape, compute_capability=cc), x)

  def test_before_hopper_passes_pointer_shape_and_strides(self):
    (call,) = util.triton_custom_calls(self._lower(80))
    (kernel,) = call["calls"]
    # padding == "nan", then on Triton 3.9 round_f32_to_tf32.
    flags = [("bool", False)] * (1 + _triton_rounds_to_tf32())
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("i64", 8), ("i64", 16), ("i64", 16), ("i64", 1),
        *flags, ("i32", 8), ("i32", 16), ("i64", 16), ("i64", 1),
        ("array", 0, 16)])
    # Triton appends its scratch pointers, which jaxlib passes itself.
    plain = _ptx_params(kernel["ptx"]) - len(kernel["params"])
    self.assertIn(plain, (0, 1, 2))

  def test_on_hopper_a_tma_descriptor(self):
    if not hasattr(util.plugin("cuda"), "create_tma_descriptor_parameter"):
      with self.assertRaisesRegex(
          NotImplementedError, r"create_tma_descriptor_parameter.*installed"
          r" jaxlib \(" + re.escape(jaxlib.__version__)):
        self._lower(90)
      return
    (call,) = util.triton_custom_calls(self._lower(90, (16, 32)))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["params"][0][0], "tma")
    self.assertEqual(kernel["params"][1:], [
        ("i32", 16), ("i32", 32), ("i64", 32), ("i64", 1), ("array", 0, 16)])

  def _lower_out(self, cc, zeroed):
    # A pointer input: only the output is a descriptor.
    x = jnp.asarray(self.random((16, 16)))
    return util.lower(lambda a: jt_dist.triton_call(
        a, kernel=rows_to_desc_kernel, out_shape=[_out_desc(a.shape)],
        grid=(2,), N=16, BM=8, compute_capability=cc,
        zeroed_outputs=[0] if zeroed else []), x)

  @parameterized.parameters(False, True)
  def test_before_hopper_an_output_descriptor_passes_its_buffer(self, zeroed):
    (call,) = util.triton_custom_calls(self._lower_out(80, zeroed))
    (kernel,) = call["calls"]
    flags = [("bool", False)] * (1 + _triton_rounds_to_tf32())
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("array", 16 * 16 * 4 if zeroed else 0, 16),
        ("i64", 16), ("i64", 16), ("i64", 16), ("i64", 1), *flags,
        ("i32", 16), ("i32", 16), ("i64", 16), ("i64", 1)])

  def test_on_hopper_a_zeroed_output_descriptor_is_refused(self):
    with self.assertRaisesRegex(
        NotImplementedError, r"'out_desc' takes a TensorDescriptor of a"
        r" zeroed output.*input_output_aliases"):
      self._lower_out(90, zeroed=True)


if __name__ == "__main__":
  absltest.main()
