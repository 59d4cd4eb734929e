"""``jax.vmap`` of ``triton_call``: one launch over a batched grid.

Each batched result is compared with NumPy and with
``vmap_method="sequential"`` (one launch per batch element).
"""

import logging
import os
import re
import sys
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._vmap import batching as _batch_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import binding as _binding  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import add as add_example  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples import matmul as matmul_example  # pylint: disable=g-import-not-at-top,wrong-import-position
from examples import softmax as softmax_example  # pylint: disable=g-import-not-at-top,wrong-import-position

# GPUs compute a float32 tl.dot in TF32 by default.
_DOT_TOL = 1e-4 if testing.platform() == "cpu" else 2e-2


@triton.jit
def scale_kernel(x_ptr, alpha_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """out = x * alpha, alpha read from memory: it may differ per batch element."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  alpha = tl.load(alpha_ptr)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * alpha,
           mask=mask)


@triton.jit
def accumulate_kernel(x_ptr, acc_ptr, n, new_acc_ptr, total_ptr,
                      BLOCK: tl.constexpr):
  """new_acc = acc + x (in place), total += sum(x) (atomically)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
  tl.store(new_acc_ptr + offsets, tl.load(acc_ptr + offsets, mask=mask) + x,
           mask=mask)
  tl.atomic_add(total_ptr, tl.sum(x, axis=0))


@triton.jit
def _pid(axis: tl.constexpr):
  return tl.program_id(axis)


@triton.jit
def cube_kernel(x_ptr, out_ptr, D0: tl.constexpr, D1: tl.constexpr,
                D2: tl.constexpr):
  """Copies a (D0, D1, D2) array, one program per element: all axes read."""
  i = (tl.program_id(0) * D1 + tl.program_id(1)) * D2 + _pid(2)
  tl.store(out_ptr + i, tl.load(x_ptr + i) * 2)


def _double_fn(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2,
           mask=mask)


double_row_kernel = triton.jit(_double_fn)


def _cdiv_grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def scale(x, alpha, **options):
  return jt_dist.triton_call(
      x, alpha, x.size, kernel=scale_kernel, out_shape=x, grid=_cdiv_grid,
      BLOCK=16, **options)


def double(x, kernel=double_row_kernel, **options):
  return jt_dist.triton_call(x, x.size, kernel=kernel, out_shape=x,
                             grid=_cdiv_grid, **options)


def add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_example.add_kernel, out_shape=x,
      grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),), BLOCK=16,
      **options)


def softmax(x, **options):
  n_rows, n_cols = x.shape
  return jt_dist.triton_call(
      x, n_cols, n_cols, n_cols, kernel=softmax_example.softmax_kernel,
      out_shape=x, grid=(n_rows,), BLOCK=triton.next_power_of_2(n_cols),
      **options)


# The example's matmul under two small configs of its own: each config is a
# CUDA compile in CudaLoweringTest, and the example's six take 2.4 s.
_SMALL_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=1),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=2,
                  num_stages=2),
]
_small_tuned_matmul_kernel = triton.autotune(
    configs=_SMALL_CONFIGS, key=["M", "N", "K"])(
        matmul_example.matmul_kernel.fn)


def matmul(a, b, kernel=matmul_example.matmul_kernel, **options):
  (m, k), n = a.shape, b.shape[1]
  return jt_dist.triton_call(
      a, b, m, n, k, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),
                         triton.cdiv(n, meta["BLOCK_N"])), **options)


def cube(x, **options):
  d0, d1, d2 = x.shape
  return jt_dist.triton_call(x, kernel=cube_kernel, out_shape=x,
                             grid=(d0, d1, d2), D0=d0, D1=d1, D2=d2,
                             **options)


def _sequential(fn):
  return lambda *args: fn(*args, vmap_method="sequential")


def _launches(lowered_text):
  return testing.kernel_launches(lowered_text)


class VmapGridTest(testing.TestCase):
  """Results: against NumPy and against the sequential method."""

  def assertSameAsSequential(self, fn, args, in_axes=0, out_axes=0,
                             expected=None, tol=1e-6):
    grid = jax.jit(jax.vmap(fn, in_axes=in_axes, out_axes=out_axes))(*args)
    seq = jax.vmap(_sequential(fn), in_axes=in_axes, out_axes=out_axes)(*args)
    for g, q in zip(jax.tree.leaves(grid), jax.tree.leaves(seq)):
      self.assertAllClose(g, q, rtol=tol, atol=tol)
    if expected is not None:
      self.assertAllClose(grid, expected, rtol=tol, atol=tol)
    return grid

  @parameterized.parameters(0, 1)
  def test_vector_add(self, axis):
    xs, ys = self.random((3, 37)), self.random((3, 37))
    if axis:
      xs, ys = xs.T.copy(), ys.T.copy()
    self.assertSameAsSequential(add, (xs, ys), in_axes=axis, out_axes=axis,
                                expected=xs + ys)

  def test_vector_add_eager_without_jit(self):
    xs, ys = self.random((2, 40)), self.random((2, 40))
    self.assertAllClose(jax.vmap(add)(xs, ys), xs + ys)

  def test_mixed_batched_and_unbatched(self):
    xs, y = self.random((4, 33)), self.random((33,))
    self.assertSameAsSequential(add, (xs, y), in_axes=(0, None),
                                expected=xs + y)
    self.assertSameAsSequential(add, (y, xs), in_axes=(None, 0),
                                expected=xs + y)

  @parameterized.parameters(0, 2)
  def test_row_softmax(self, axis):
    x = self.random((3, 5, 33)) * 4
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    expected = e / e.sum(axis=-1, keepdims=True)
    x = np.moveaxis(x, 0, axis).copy()
    out = self.assertSameAsSequential(
        softmax, (x,), in_axes=axis, out_axes=0,
        expected=expected, tol=1e-5)
    self.assertEqual(out.shape, (3, 5, 33))

  def test_autotuned_matmul_batch_on_axis_z(self):
    a, b = self.random((2, 20, 24)), self.random((2, 24, 36))
    self.assertSameAsSequential(matmul, (a, b),
                                expected=a @ b, tol=_DOT_TOL)

  def test_matmul_shared_right_operand_batch_at_axis_1(self):
    a, b = self.random((20, 3, 16)), self.random((16, 18))
    out = self.assertSameAsSequential(
        matmul, (a, b), in_axes=(1, None), out_axes=1,
        tol=_DOT_TOL)
    self.assertAllClose(out, np.einsum("mbk,kn->mbn", a, b), rtol=_DOT_TOL,
                        atol=_DOT_TOL)

  def test_heuristics_and_autotune(self):
    kernel = triton.autotune(
        configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})],
        key=["n"])(triton.heuristics(
            {"BLOCK_IS_16": lambda args: args["BLOCK"] == 16})(
                triton.jit(_double_with_flag)))
    xs = self.random((3, 50))
    out = self.assertSameAsSequential(
        lambda x, **o: double(x, kernel=kernel, **o), (xs,), expected=2 * xs)
    self.assertEqual(out.shape, xs.shape)

  def test_nested_vmap_folds_into_one_launch(self):
    xs, ys = self.random((2, 3, 20)), self.random((3, 20))
    inner = jax.vmap(add, in_axes=(0, 0))
    outer = jax.vmap(inner, in_axes=(0, None))
    out = jax.jit(outer)(xs, ys)
    self.assertAllClose(out, xs + ys[None])
    (eqn,) = jax.make_jaxpr(outer)(xs, ys).eqns
    self.assertIn("batch=(2, 3)", str(eqn.params["spec"]))
    self.assertEqual(_launches(jax.jit(outer).lower(xs, ys).as_text()),
                     1)

  @parameterized.parameters((0, None), (None, 0), (1, 0))
  def test_nested_vmap_mixed_levels(self, outer_x, outer_y):
    # Inner level: x batched, y shared; outer level as parameterised.
    x = self.random((4, 2, 24) if outer_x == 1 else
                    (2, 4, 24) if outer_x == 0 else (4, 24))
    y = self.random((2, 24) if outer_y == 0 else (24,))
    fn = jax.vmap(jax.vmap(add, in_axes=(0, None)), in_axes=(outer_x, outer_y))
    seq = jax.vmap(jax.vmap(_sequential(add), in_axes=(0, None)),
                   in_axes=(outer_x, outer_y))
    out = jax.jit(fn)(x, y)
    xb = np.moveaxis(x, 1, 0) if outer_x == 1 else x
    xb = xb if outer_x is not None else np.broadcast_to(xb, (2, 4, 24))
    yb = (y if outer_y == 0 else np.broadcast_to(y, (2, 24)))[:, None]
    self.assertAllClose(out, xb + yb)
    self.assertAllClose(out, seq(x, y), rtol=0, atol=0)

  def test_batched_scalar_is_a_small_array(self):
    xs, alphas = self.random((5, 30)), self.random((5,))
    out = self.assertSameAsSequential(scale, (xs, alphas),
                                      expected=xs * alphas[:, None])
    shared = jax.vmap(scale, in_axes=(0, None))(xs, jnp.asarray(alphas[2]))
    self.assertAllClose(shared, xs * alphas[2], rtol=1e-6, atol=1e-6)
    self.assertEqual(out.shape, xs.shape)

  @parameterized.parameters(True, False)
  def test_aliases_and_zeroed_outputs_per_element(self, acc_batched):
    xs = self.random((3, 40))
    acc = self.random((3, 40) if acc_batched else (40,))

    def accumulate(x, a, **options):
      return jt_dist.triton_call(
          x, a, x.size, kernel=accumulate_kernel,
          out_shape=(x, jax.ShapeDtypeStruct((1,), jnp.float32)),
          grid=_cdiv_grid, BLOCK=16, input_output_aliases={1: 0},
          zeroed_outputs=[1], **options)

    in_axes = (0, 0 if acc_batched else None)
    new_acc, total = self.assertSameAsSequential(
        accumulate, (xs, acc), in_axes=in_axes, tol=1e-5)
    self.assertAllClose(new_acc, xs + acc, rtol=1e-6, atol=1e-6)
    self.assertAllClose(total[:, 0], xs.sum(axis=1), rtol=1e-5, atol=1e-5)
    # The unbatched input keeps its value: it was broadcast, not clobbered.
    self.assertEqual(acc.shape, (3, 40) if acc_batched else (40,))

  def test_custom_vjp_per_example_gradients(self):
    @jax.custom_vjp
    def loss(x):
      return jnp.sum(add(x, x) * x)  # 2 * sum(x^2)

    def fwd(x):
      return loss(x), x

    def bwd(x, g):
      # d/dx 2 sum(x^2) = 4x, scaled by the per-example cotangent g: a
      # batched scalar, which reaches the kernel through memory.
      return (scale(x, 4 * g),)

    loss.defvjp(fwd, bwd)
    xs = self.random((4, 25))
    per_example = jax.jit(jax.vmap(jax.value_and_grad(loss)))
    values, grads = per_example(xs)
    self.assertAllClose(grads, 4 * xs, rtol=1e-5, atol=1e-5)
    self.assertAllClose(values, 2 * (xs**2).sum(axis=1), rtol=1e-5)
    text = per_example.lower(xs).as_text()
    self.assertEqual(_launches(text), 2)  # The forward and the backward.
    self.assertNotIn("stablehlo.while", text)


def _double_with_flag(x_ptr, n, out_ptr, BLOCK: tl.constexpr,
                      BLOCK_IS_16: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  if BLOCK_IS_16:
    x = x * 2
  else:
    x = x + x
  tl.store(out_ptr + offsets, x, mask=mask)


class OneLaunchTest(testing.TestCase):
  """The lowered program has one kernel call and no loop."""

  @parameterized.named_parameters(
      ("add", lambda: (add_example.add, add), ((3, 40), (3, 40))),
      ("softmax", lambda: (softmax_example.softmax, softmax), ((3, 4, 33),)),
      ("matmul", lambda: (matmul_example.matmul, matmul),
       ((2, 16, 16), (2, 16, 16))))
  def test_examples_run_in_one_launch(self, make_fns, shapes):
    example, same_call = make_fns()
    args = [self.random(s) for s in shapes]
    text = jax.jit(jax.vmap(example)).lower(*args).as_text()
    self.assertEqual(_launches(text), 1, text)
    self.assertNotIn("stablehlo.while", text)
    seq = jax.jit(jax.vmap(_sequential(same_call))).lower(*args).as_text()
    self.assertIn("stablehlo.while", seq)

  def test_wrappers_are_cached_and_the_kernel_untouched(self):
    kernel = add_example.add_kernel
    source, params = kernel.src, [p.name for p in kernel.params]
    xs, ys = self.random((3, 40)), self.random((3, 40))
    jax.jit(jax.vmap(add)).lower(xs, ys)
    before = _batch_kernel.wrapper_kernel.cache_info()
    jax.jit(jax.vmap(lambda x, y: add(x, y) * 1)).lower(xs, ys)
    after = _batch_kernel.wrapper_kernel.cache_info()
    self.assertEqual(after.misses, before.misses)
    self.assertGreater(after.hits, before.hits)
    self.assertEqual((kernel.src, [p.name for p in kernel.params]),
                     (source, params))


class FallbackTest(testing.TestCase):
  """Where the grid has no room: sequential by default, an error on 'grid'."""

  def test_kernel_reading_every_axis_runs_sequentially(self):
    xs = self.random((2, 2, 3, 2))
    with self.assertLogs("jt_dist", logging.DEBUG) as logs:
      out = jax.vmap(cube)(xs)
    self.assertAllClose(out, 2 * xs)
    (line,) = [r for r in logs.output if "one launch per batch" in r]
    self.assertRegex(line, r"cube_kernel.*grid axes \[0, 1, 2\]")

  def test_kernel_reading_every_axis_refused_on_grid(self):
    xs = self.random((2, 2, 3, 2))
    with self.assertRaisesRegex(
        NotImplementedError,
        r"vmap_method='grid' cannot batch kernel 'cube_kernel'.*grid axes"
        r" \[0, 1, 2\].*grid \(2, 3, 2\).*vmap_method=None.*'sequential'"):
      jax.vmap(lambda x: cube(x, vmap_method="grid"))(xs)

  def test_kernel_given_as_constexpr_counts(self):
    @triton.jit
    def row_of_program(x):
      return x + tl.program_id(1)

    @triton.jit
    def apply_kernel(x_ptr, n, out_ptr, FN: tl.constexpr,
                     BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      tl.store(out_ptr + offsets, FN(tl.load(x_ptr + offsets, mask=mask)),
               mask=mask)

    # FN reads axis 1, so the batch goes to axis 2, where FN reads 0.
    xs = self.random((3, 20))
    out = jax.jit(jax.vmap(lambda x: double(
        x, kernel=apply_kernel, FN=row_of_program, BLOCK=16,
        vmap_method="grid")))(xs)
    self.assertAllClose(out, xs)

  def test_batch_split_over_y_and_z(self):
    # Axis limits of 4 (instead of 65,535) force a batch of 7 onto two axes,
    # 4 x 2 programs, one of which idles.
    xs = self.random((7, 20))
    with mock.patch.object(_binding, "MAX_GRID", (2**31 - 1, 4, 4)):
      fn = jax.jit(jax.vmap(lambda x: double(x, BLOCK=16)))
      out = fn(xs)
      text = fn.lower(xs).as_text()
    self.assertAllClose(out, 2 * xs)
    self.assertNotIn("stablehlo.while", text)

  def test_batch_too_large_for_the_grid(self):
    xs = self.random((17, 20))
    with mock.patch.object(_binding, "MAX_GRID", (2**31 - 1, 4, 4)):
      with self.assertLogs("jt_dist", logging.DEBUG) as logs:
        out = jax.vmap(lambda x: double(x, BLOCK=16))(xs)
      with self.assertRaisesRegex(
          NotImplementedError,
          r"'_double_fn'.*batch of 17 \(17\) exceeds the 4 x 4"
          r" programs the free grid axes \(y/z\)"):
        jax.vmap(lambda x: double(x, BLOCK=16, vmap_method="grid"))(xs)
    self.assertAllClose(out, 2 * xs)
    self.assertTrue(any("exceeds" in r for r in logs.output))

  def test_interpreted_function(self):
    kernel = interpreter.InterpretedFunction(_double_fn)
    xs = self.random((3, 40))
    fn = jax.vmap(lambda x: double(x, kernel=kernel, BLOCK=16))
    self.assertAllClose(jax.jit(fn)(xs), 2 * xs)
    # The wrapper is interpreted too, so that GPUs interpret it as well.
    (eqn,) = jax.make_jaxpr(fn)(xs).eqns
    self.assertIsInstance(eqn.params["spec"].info.fn,
                          interpreter.InterpretedFunction)

  def test_aliased_unbatched_input_when_falling_back(self):
    xs = self.random((17, 20))
    acc = self.random((20,))
    with mock.patch.object(_binding, "MAX_GRID", (2**31 - 1, 4, 4)):
      new_acc, total = jax.vmap(
          lambda x, a: jt_dist.triton_call(
              x, a, x.size, kernel=accumulate_kernel,
              out_shape=(x, jax.ShapeDtypeStruct((1,), jnp.float32)),
              grid=_cdiv_grid, BLOCK=16, input_output_aliases={1: 0},
              zeroed_outputs=[1]),
          in_axes=(0, None))(xs, acc)
    self.assertAllClose(new_acc, xs + acc, rtol=1e-6, atol=1e-6)
    self.assertAllClose(total[:, 0], xs.sum(axis=1), rtol=1e-5, atol=1e-5)

  def test_empty_batch(self):
    xs = np.zeros((0, 20), np.float32)
    out = jax.vmap(lambda x: double(x, BLOCK=16, vmap_method="grid"))(xs)
    self.assertEqual(out.shape, (0, 20))

  def test_kernel_without_program_id_batches_on_axis_x(self):
    @triton.jit
    def whole_kernel(x_ptr, out_ptr, N: tl.constexpr):
      offsets = tl.arange(0, N)
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + 1)

    xs = self.random((5, 16))
    out = jax.vmap(lambda x: jt_dist.triton_call(
        x, kernel=whole_kernel, out_shape=x, grid=1, N=16,
        vmap_method="grid"))(xs)
    self.assertAllClose(out, xs + 1)


def _add_pid_z(x):
  return x + tl.program_id(axis=2)


# How helpers look when defined under TRITON_INTERPRET=1.
add_pid_z_interpreted = interpreter.InterpretedFunction(_add_pid_z)


@triton.jit
def calls_interpreted_helper_kernel(x_ptr):
  tl.store(x_ptr, add_pid_z_interpreted(tl.load(x_ptr)))


class UsedAxesTest(parameterized.TestCase):

  def test_interpreted_helpers_are_followed(self):
    self.assertEqual(
        _batch_kernel.used_grid_axes(calls_interpreted_helper_kernel), {2})

  def test_literal_axes_and_callees(self):
    self.assertEqual(_batch_kernel.used_grid_axes(add_example.add_kernel),
                     {0})
    self.assertEqual(_batch_kernel.used_grid_axes(
        matmul_example.matmul_kernel.fn), {0, 1})

  def test_non_literal_axis_counts_as_every_axis(self):
    self.assertEqual(_batch_kernel.used_grid_axes(cube_kernel), {0, 1, 2})


def _lower_for_cuda(fn, *args):
  # A fresh function each time: jit caches lowerings per function.
  fresh = lambda *a: fn(*a)
  return jax.jit(fresh).trace(*args).lower(lowering_platforms=("cuda",))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.JaxlibAutotuningMixin, util.IsolatedCacheMixin,
                       testing.TestCase):
  """Cross-lowered for sm_90: one Triton custom call, the batch on the grid."""

  def _calls(self, fn, *shapes, in_axes=0):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    vmapped = jax.vmap(lambda *a: fn(*a, compute_capability=90),
                       in_axes=in_axes)
    (call,) = util.triton_custom_calls(_lower_for_cuda(vmapped, *args))
    return call

  def test_add_batch_on_axis_y(self):
    call = self._calls(add, (5, 1000), (1000,), in_axes=(0, None))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (triton.cdiv(1000, 16), 5, 1))
    self.assertEqual(kernel["name"], "add_kernel")
    self.assertIn("%ctaid.y", kernel["ptx"])
    self.assertLen([p for p in kernel["params"] if p[0] == "array"], 3)

  def test_softmax_nested_batch_folds_into_axis_y(self):
    inner = lambda x, **o: jax.vmap(lambda r: softmax(r, **o))(x)
    call = self._calls(inner, (3, 4, 6, 33))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (6, 12, 1))

  def test_autotuned_matmul_batch_on_axis_z_in_every_config(self):
    tuned = lambda a, b, **o: matmul(a, b, _small_tuned_matmul_kernel, **o)
    call = self._calls(tuned, (4, 64, 32), (32, 64), in_axes=(0, None))
    self.assertTrue(call["autotuned"])
    self.assertLen(call["calls"], len(_SMALL_CONFIGS))
    for kernel, config in zip(call["calls"], _SMALL_CONFIGS):
      self.assertEqual(kernel["grid"], (
          triton.cdiv(64, config.kwargs["BLOCK_M"]),
          triton.cdiv(64, config.kwargs["BLOCK_N"]), 4))
      self.assertIn("%ctaid.z", kernel["ptx"])

  def test_batch_split_over_y_and_z_compiles(self):
    # Axis limits of 4 put a batch of 7 on y and z, 4 x 2 programs, and the
    # spare one skips the kernel behind an `if`.
    with mock.patch.object(_binding, "MAX_GRID", (2**31 - 1, 4, 4)):
      call = self._calls(add, (7, 64), (7, 64))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (4, 4, 2))
    self.assertIn("%ctaid.z", kernel["ptx"])

  def test_offsets_in_64_bits(self):
    layout = _batch_kernel.Layout(
        sizes=(3, 70000), strides=(("x", (2**31, 2**20)),), axes=(1, 2),
        counts=(52501, 4))
    source = _batch_kernel.wrapper_source("k", (("x", False),), layout)
    self.assertIn("program_id(1).to(_jt_vmap_tl.int64)", source)
    self.assertIn("program_id(2).to(_jt_vmap_tl.int64) * 52501", source)
    self.assertIn("x += _jt_vmap_i0 * 2147483648 + _jt_vmap_i1 * 1048576",
                  source)
    self.assertIn("if _jt_vmap_b < 210000:", source)


if __name__ == "__main__":
  absltest.main()
