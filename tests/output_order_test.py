"""Kernels that declare output pointers before or between their inputs.

Triton's tutorials (fused softmax, layer norm) and most kernels written for
PyTorch take their outputs first. Bound by keyword, their inputs run
unchanged: the leftover non-constexpr parameters are the outputs, in
declaration order. Each context a call can meet is checked on the CPU
(eagerly, ``jax.jit``, ``jax.vmap``, ``jax.shard_map``,
``sharded_triton_call``, a ``ShardingRule``, aliases, ``zeroed_outputs``,
``jax.Ref``s, autotuning), and by cross-lowering for CUDA and ROCm, where
jaxlib hands a kernel its input buffers before its outputs'.
"""

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
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_out_first_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import layer_norm_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import softmax_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import sum_out_first_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 32
_BLOCK = 8


@triton.autotune(configs=[triton.Config({"BLOCK": 8}),
                          triton.Config({"BLOCK": 16})], key=["n"])
@triton.jit
def tuned_add_out_first_kernel(out_ptr, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def scale_out_first_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * x_ptr,
           mask=mask)


@triton.jit
def scaled_out_first_kernel(out_ptr, x_ptr, n, scale,
                            BLOCK: tl.constexpr):
  # ``scale.to`` needs a run-time value: a Python float has no ``.to``.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           * scale.to(tl.float32), mask=mask)


@triton.jit
def scaled_copy_kernel(x_ptr, n, out_ptr, scale, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets, mask=offsets < n)
  tl.store(out_ptr + offsets, x * scale.to(tl.float32), mask=offsets < n)


@triton.jit
def stages_scale_kernel(out_ptr, x_ptr, n, BLOCK: tl.constexpr,
                        num_stages: tl.constexpr):
  # Tutorial 02's softmax takes the pipelining option as a parameter too.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           * num_stages, mask=mask)


@triton.jit
def in_place_backward_kernel(dy_ptr, dx_ptr, x_ptr, X_DTYPE: tl.constexpr,
                             dw_ptr, n, BLOCK: tl.constexpr):
  # Liger's rms_norm backward writes dX over dY; a constexpr sits between
  # its two outputs.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  dy = tl.load(dy_ptr + offsets, mask=mask)
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(dx_ptr + offsets, (dy * x).to(X_DTYPE), mask=mask)
  tl.store(dw_ptr + offsets, dy + x, mask=mask)


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _softmax(x, **options):
  rows, cols = x.shape
  return jt_dist.triton_call(
      kernel=softmax_kernel, out_shape=_like(x), grid=(rows,), input_ptr=x,
      input_row_stride=cols, output_row_stride=cols, n_rows=rows,
      n_cols=cols, BLOCK_SIZE=triton.next_power_of_2(cols), **options)


def _layer_norm(x, w, b, eps, **options):
  rows, cols = x.shape
  stats = jax.ShapeDtypeStruct((rows,), jnp.float32)
  # X positionally, the other inputs by keyword: Y, Mean and Rstd are left.
  return jt_dist.triton_call(
      x, kernel=layer_norm_kernel, out_shape=(_like(x), stats, stats),
      grid=(rows,), W=w, B=b, stride=cols, N=cols, eps=eps,
      BLOCK_SIZE=triton.next_power_of_2(cols), **options)


def _add(x, y, kernel=add_out_first_kernel, **options):
  options.setdefault("BLOCK", _BLOCK)
  return jt_dist.triton_call(
      kernel=kernel, out_shape=_like(x), grid=(triton.cdiv(x.size, 8),),
      x_ptr=x, y_ptr=y, n=x.size, **options)


def _softmax_expected(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def _layer_norm_expected(x, w, b, eps):
  x = np.asarray(x, np.float64)
  mean = x.mean(axis=-1)
  rstd = 1 / np.sqrt(x.var(axis=-1) + eps)
  return (x - mean[..., None]) * rstd[..., None] * w + b, mean, rstd


class OutputOrderTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_softmax_output_first(self, jit):
    x = jnp.asarray(self.random((5, int(self.np_rng.integers(20, 100)))))
    out = (jax.jit(_softmax) if jit else _softmax)(x)
    self.assertAllClose(out, _softmax_expected(x), rtol=1e-5, atol=1e-6)

  @parameterized.parameters(False, True)
  def test_layer_norm_outputs_between_inputs(self, jit):
    rows, cols = 6, int(self.np_rng.integers(20, 100))
    x = jnp.asarray(self.random((rows, cols)))
    w, b = jnp.asarray(self.random((cols,))), jnp.asarray(self.random((cols,)))
    eps = float(self.np_rng.uniform(1e-6, 1e-3))
    f = lambda *a: _layer_norm(*a, eps)
    y, mean, rstd = (jax.jit(f) if jit else f)(x, w, b)
    want_y, want_mean, want_rstd = _layer_norm_expected(x, w, b, eps)
    self.assertAllClose(y, want_y, rtol=1e-4, atol=1e-4)
    self.assertAllClose(mean, want_mean, rtol=1e-4, atol=1e-5)
    self.assertAllClose(rstd, want_rstd, rtol=1e-4, atol=1e-4)

  def test_repeated_eager_calls_reuse_one_call(self):
    x, y = (jnp.asarray(self.random((_N,))) for _ in range(2))
    self.assertAllClose(_add(x, y), x + y)
    before = jt_dist.cache_info()
    for _ in range(3):
      self.assertAllClose(_add(y, x), x + y)
    after = jt_dist.cache_info()
    self.assertEqual(after.triton_call_entries, before.triton_call_entries)
    self.assertEqual(after.lowerings, before.lowerings)

  @parameterized.parameters("grid", "sequential")
  def test_vmap(self, method):
    xs = jnp.asarray(self.random((3, 4, 40)))
    out = jax.vmap(lambda x: _softmax(x, vmap_method=method))(xs)
    self.assertAllClose(out, _softmax_expected(xs), rtol=1e-5, atol=1e-6)

  def test_vmap_of_an_unbatched_input(self):
    xs, y = jnp.asarray(self.random((3, _N))), jnp.asarray(self.random((_N,)))
    out = jax.vmap(_add, in_axes=(0, None))(xs, y)
    self.assertAllClose(out, np.asarray(xs) + np.asarray(y))

  def test_aliased_input_and_zeroed_output(self):
    x, acc = self.random((_N,)), self.random((_N,))
    new_acc, total = jt_dist.triton_call(
        kernel=sum_out_first_kernel, x_ptr=x, acc_ptr=acc, n=_N,
        out_shape=(_like(acc), jax.ShapeDtypeStruct((1,), jnp.float32)),
        grid=(_N // _BLOCK,), BLOCK=_BLOCK, input_output_aliases={1: 0},
        zeroed_outputs=(1,))
    self.assertAllClose(new_acc, x + acc)
    self.assertAllClose(total, [x.sum()], rtol=1e-4, atol=1e-4)

  @parameterized.parameters(False, True)
  def test_ref(self, jit):
    x, acc = self.random((_N,)), self.random((_N,))

    def f(x, acc):
      ref = jax.new_ref(acc)
      total = jt_dist.triton_call(
          kernel=sum_out_first_kernel, x_ptr=x, acc_ptr=ref, n=_N,
          out_shape=jax.ShapeDtypeStruct((1,), jnp.float32),
          grid=(_N // _BLOCK,), BLOCK=_BLOCK, zeroed_outputs=(0,))
      return total, ref[...]

    total, new_acc = (jax.jit(f) if jit else f)(jnp.asarray(x),
                                                jnp.asarray(acc))
    self.assertAllClose(new_acc, x + acc)
    self.assertAllClose(total, [x.sum()], rtol=1e-4, atol=1e-4)

  def test_autotuned(self):
    x, y = (jnp.asarray(self.random((_N,))) for _ in range(2))
    out = jt_dist.triton_call(
        kernel=tuned_add_out_first_kernel, out_shape=_like(x),
        grid=lambda meta: (triton.cdiv(_N, meta["BLOCK"]),), x_ptr=x, y_ptr=y,
        n=_N)
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))

  @parameterized.parameters(False, True)
  def test_scalar_by_keyword_after_an_output_is_a_run_time_value(self, jit):
    x = jnp.asarray(self.random((_N,)))
    scale = float(self.np_rng.uniform(0.5, 2))

    def f(x):
      # With an input after the output, and with only the scalar after it.
      return (jt_dist.triton_call(
          kernel=scaled_out_first_kernel, out_shape=_like(x), grid=(4,),
          x_ptr=x, n=_N, scale=scale, BLOCK=_BLOCK),
              jt_dist.triton_call(
                  x, _N, kernel=scaled_copy_kernel, out_shape=_like(x),
                  grid=(4,), scale=scale, BLOCK=_BLOCK))

    for out in (jax.jit(f) if jit else f)(x):
      self.assertAllClose(out, np.asarray(x) * np.float32(scale))

  def test_a_launch_option_naming_a_parameter_binds_it(self):
    # As in Triton's launcher: num_stages=2 binds the parameter and is the
    # pipelining option.
    x = jnp.asarray(self.random((_N,)))
    out = jt_dist.triton_call(
        kernel=stages_scale_kernel, out_shape=_like(x), grid=(4,), x_ptr=x,
        n=_N, BLOCK=_BLOCK, num_stages=2)
    self.assertAllClose(out, np.asarray(x) * 2)

  def test_in_place_alias_with_a_constexpr_between_the_outputs(self):
    # jax-triton 0.3.1's alias form: the aliased output keeps its parameter.
    dy, x = (jnp.asarray(self.random((_N,))) for _ in range(2))
    dx, dw = jt_dist.triton_call(
        dy, kernel=in_place_backward_kernel, out_shape=(_like(dy), _like(dy)),
        grid=(4,), input_output_aliases={0: 0}, x_ptr=x,
        X_DTYPE=tl.float32, n=_N, BLOCK=_BLOCK)
    self.assertAllClose(dx, np.asarray(dy) * np.asarray(x))
    self.assertAllClose(dw, np.asarray(dy) + np.asarray(x))

  def test_too_many_outputs_names_the_parameters_left(self):
    x = jnp.asarray(self.random((_N,)))
    with self.assertRaises(jt_dist.KernelBindingError) as cm:
      jt_dist.triton_call(
          kernel=add_out_first_kernel, out_shape=(_like(x), _like(x)),
          grid=(4,), x_ptr=x, y_ptr=x, n=_N, BLOCK=_BLOCK)
    for part in ("'add_out_first_kernel'", "output 1", "BLOCK"):
      self.assertIn(part, str(cm.exception))

  def test_user_kernel_is_not_modified(self):
    x = jnp.asarray(self.random((_N,)))
    params = [p.name for p in add_out_first_kernel.params]
    _add(x, x)
    self.assertEqual([p.name for p in add_out_first_kernel.params], params)


class OutputOrderShardedTest(testing.TestCase):

  def _mesh(self, explicit=False):
    types = (AxisType.Explicit,) if explicit else (AxisType.Auto,)
    return jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=types)

  def test_shard_map(self):
    x = jnp.asarray(self.random((4, 40)))
    f = jax.shard_map(_softmax, mesh=self._mesh(), in_specs=P("i"),
                      out_specs=P("i"))
    self.assertAllClose(jax.jit(f)(x), _softmax_expected(x), rtol=1e-5,
                        atol=1e-6)

  def test_sharded_triton_call(self):
    x, y = self.random((_N,)), self.random((_N,))
    out = jt_dist.sharded_triton_call(
        kernel=add_out_first_kernel, x_ptr=x, y_ptr=y,
        n=jt_dist.shard_size(0), out_shape=_like(x),
        grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        mesh=self._mesh(), in_specs=(P("i"), P("i")), out_specs=P("i"),
        BLOCK=_BLOCK)
    self.assertAllClose(out, x + y)

  @parameterized.parameters(False, True)
  def test_sharding_rule(self, jit):
    sharding = NamedSharding(self._mesh(explicit=True), P("i"))
    x, y = (jax.device_put(self.random((_N,)), sharding) for _ in range(2))

    def f(a, b):
      return jt_dist.triton_call(
          kernel=add_out_first_kernel, x_ptr=a, y_ptr=b,
          n=jt_dist.shard_size(0), out_shape=_like(a),
          grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
          BLOCK=_BLOCK, sharding_rule=jt_dist.ShardingRule("i, i -> i"))

    out = (jax.jit(f) if jit else f)(x, y)
    self.assertAllClose(out, np.asarray(x) + np.asarray(y))
    self.assertEqual(out.sharding.spec, P("i"))

  @parameterized.named_parameters(("sharding_rule", "rule"),
                                  ("sharded_triton_call", "sharded"))
  def test_a_launch_option_naming_a_parameter_binds_it_per_shard(self, how):
    mesh = self._mesh(explicit=True)
    x = jax.device_put(self.random((_N,)), NamedSharding(mesh, P("i")))
    options = dict(kernel=stages_scale_kernel, out_shape=_like(x), grid=(4,),
                   x_ptr=x, n=jt_dist.shard_size(0), BLOCK=_BLOCK,
                   num_stages=2)
    if how == "rule":
      out = jt_dist.triton_call(
          sharding_rule=jt_dist.ShardingRule("i -> i"), **options)
    else:
      out = jt_dist.sharded_triton_call(mesh=mesh, in_specs=P("i"),
                                        out_specs=P("i"), **options)
    self.assertAllClose(out, np.asarray(x) * 2)


def _params(call):
  return [p[0] for p in call["calls"][0]["params"]]


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class OutputOrderCudaLoweringTest(util.IsolatedCacheMixin, testing.TestCase):

  def test_inputs_come_before_outputs(self):
    x = jnp.asarray(self.random((4, 48)))
    (call,) = util.triton_custom_calls(util.lower(
        lambda a: _softmax(a, compute_capability=90), x))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "softmax_kernel")
    self.assertIn(".entry softmax_kernel", kernel["ptx"])
    # input_ptr, input_row_stride, output_row_stride, n_rows, n_cols, then
    # output_ptr: jaxlib hands the operand's buffer first.
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("i32", 48), ("i32", 48), ("i32", 4), ("i32", 48),
        ("array", 0, 16)])

  def test_zeroed_output_and_alias(self):
    x, acc = (jnp.asarray(self.random((_N,))) for _ in range(2))

    def f(a, c):
      return jt_dist.triton_call(
          kernel=sum_out_first_kernel, x_ptr=a, acc_ptr=c, n=_N,
          out_shape=(_like(c), jax.ShapeDtypeStruct((1,), jnp.float32)),
          grid=(4,), BLOCK=_BLOCK, input_output_aliases={1: 0},
          zeroed_outputs=(1,), compute_capability=90)

    (call,) = util.triton_custom_calls(util.lower(f, x, acc))
    self.assertIn("output_tuple_indices = [1], operand_index = 1",
                  call["aliases_text"])
    params = call["calls"][0]["params"]
    self.assertEqual(_params(call), ["array", "array", "i32", "array"])
    self.assertEqual(params[3][1], 4)  # total_ptr's 4 bytes are zeroed.

  def test_vmap(self):
    xs = jnp.asarray(self.random((3, 4, 48)))
    (call,) = util.triton_custom_calls(util.lower(
        jax.vmap(lambda a: _softmax(a, compute_capability=90)), xs))
    self.assertEqual(call["calls"][0]["grid"], (4, 3, 1))
    self.assertEqual(_params(call)[0], "array")
    self.assertEqual(_params(call)[-1], "array")

  def test_export(self):
    x = jnp.asarray(self.random((4, 48)))
    with jt_dist.export_options(compute_capability=90):
      exported = jax.export.export(
          jax.jit(_softmax), platforms=("cuda",),
          disabled_checks=jt_dist.export_safety_checks())(x)
    loaded = jax.export.deserialize(exported.serialize())
    (call,) = util.exported_triton_custom_calls(loaded)
    self.assertEqual(_params(call),
                     ["array", "i32", "i32", "i32", "i32", "array"])
    self.assertEqual(jt_dist.exported_versions(loaded)[0].kernels,
                     ("softmax_kernel",))

  def test_compile_error_quotes_the_kernel(self):
    # Triton reports an inlined callee's error at the wrapper's call: the
    # user's own line is what a user must see.
    x = jnp.asarray(self.random((_N,)))
    with self.assertRaises(Exception) as cm:
      util.lower(lambda a: jt_dist.triton_call(
          kernel=scale_out_first_kernel, x_ptr=a, n=_N, out_shape=_like(a),
          grid=(4,), BLOCK=_BLOCK, compute_capability=90), x)
    message = str(cm.exception)
    self.assertIn("def scale_out_first_kernel(out_ptr, x_ptr, n,", message)
    self.assertIn("tl.load(x_ptr + offsets, mask=mask) * x_ptr", message)
    self.assertNotIn("_jt_wrap_", message)

  def test_same_code_as_outputs_last(self):
    # The wrapper is inlined: its PTX is the outputs-last kernel's, but for
    # the names and the debug information.
    x, y = (jnp.asarray(self.random((_N,))) for _ in range(2))
    (first,) = util.triton_custom_calls(util.lower(
        lambda a, b: _add(a, b, compute_capability=90), x, y))
    (last,) = util.triton_custom_calls(util.lower(
        lambda a, b: jt_dist.triton_call(
            a, b, _N, kernel=add_kernel, out_shape=_like(a), grid=(4,),
            BLOCK=_BLOCK, compute_capability=90), x, y))
    code = _code(first["calls"][0]["ptx"], "add_out_first_kernel")
    self.assertGreater(len(code), 20)
    self.assertEqual(code, _code(last["calls"][0]["ptx"], "add_kernel"))


def _code(ptx, name):
  """The instructions of ``ptx``, without debug information or names."""
  lines = []
  for line in ptx.split(".section")[0].splitlines():
    line = line.split("//")[0].strip()
    if line and not line.startswith((".loc", ".file", "$L__")):
      lines.append(line.replace(name, "KERNEL"))
  return lines


@unittest.skipUnless(util.HAS_ROCM_TRITON_CALL, util.ROCM_SKIP_REASON)
class OutputOrderRocmLoweringTest(util.IsolatedCacheMixin, testing.TestCase):

  def test_inputs_come_before_outputs(self):
    x = jnp.asarray(self.random((4, 48)))
    (call,) = util.triton_custom_calls(util.lower(
        lambda a: _softmax(a, compute_capability="gfx942"), x,
        platform="rocm"))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "softmax_kernel")
    self.assertEqual(_params(call),
                     ["array", "i32", "i32", "i32", "i32", "array"])


if __name__ == "__main__":
  absltest.main()
