"""``None`` arguments: compile-time constants, as in jax-triton 0.4.1.

A kernel argument whose value is ``None``, positional or by keyword, binds
its parameter as a compile-time ``None`` (``if bias_ptr is not None:`` is
decided when compiling); it is no operand, so it takes no ``in_specs`` entry
and no alias key. Eagerly, under ``jax.jit`` and ``jax.vmap``, through
``kernel_call``, and cross-lowered for CUDA where jaxlib's CUDA plugin is
installed (the launch then has one pointer fewer).
"""

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import triton

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util
from feature_kernels import maybe_bias_kernel

_N = 40
_BLOCK = 16
_GRID = (3,)


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _call(x, bias, **kwargs):
  return jt_dist.triton_call(x, bias, _N, kernel=maybe_bias_kernel,
                             out_shape=_like(x), grid=_GRID, BLOCK=_BLOCK,
                             **kwargs)


class NoneArgumentsTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_positional_none_skips_the_branch(self, jit):
    x, bias = self.random((_N,)), self.random((_N,))
    f = jax.jit(_call) if jit else _call
    self.assertAllClose(f(x, None, scale=None), x)
    # The same kernel with an array there still reads it.
    self.assertAllClose(f(x, bias, scale=None), x + bias)

  def test_keyword_none_before_and_after_the_output(self):
    x = self.random((_N,))
    scale = float(self.np_rng.uniform(1.5, 3.0))
    out = jt_dist.triton_call(
        x, kernel=maybe_bias_kernel, out_shape=_like(x), grid=_GRID,
        BLOCK=_BLOCK, n=_N, bias_ptr=None, scale=scale)
    self.assertAllClose(out, x * scale, rtol=1e-6)
    out = jt_dist.triton_call(
        x, kernel=maybe_bias_kernel, out_shape=_like(x), grid=_GRID,
        BLOCK=_BLOCK, n=_N, bias_ptr=None, scale=None)
    self.assertAllClose(out, x)

  def test_new_value_after_none_does_not_reuse_the_call(self):
    x, bias = self.random((_N,)), self.random((_N,))
    # The same call made with None then an array must not share a
    # compiled kernel (or a memo entry): each reads its own argument.
    for _ in range(2):
      self.assertAllClose(_call(x, None, scale=None), x)
      self.assertAllClose(_call(x, bias, scale=None), x + bias)

  @parameterized.parameters("grid", "sequential")
  def test_vmap(self, method):
    xs = self.random((3, _N))
    f = jax.vmap(lambda x: _call(x, None, scale=2.0, vmap_method=method))
    self.assertAllClose(f(xs), xs * 2.0)

  def test_kernel_call_fixes_none_by_keyword(self):
    x = self.random((_N,))
    call = jt_dist.kernel_call(maybe_bias_kernel, out_shape=_like(x),
                               grid=_GRID, n=_N, bias_ptr=None, scale=None,
                               BLOCK=_BLOCK)
    self.assertAllClose(call(x), x)
    self.assertAllClose(jax.jit(call)(x), x)

  def test_grid_callable_sees_none(self):
    x = self.random((_N,))
    seen = []

    def grid(meta):
      seen.append(meta["bias_ptr"])
      return (-(-meta["n"] // meta["BLOCK"]),)

    out = jt_dist.triton_call(x, None, _N, kernel=maybe_bias_kernel,
                              out_shape=_like(x), grid=grid, BLOCK=_BLOCK,
                              scale=None)
    self.assertAllClose(out, x)
    self.assertIn(None, seen)
    self.assertTrue(all(v is None for v in seen))

  def test_alias_keys_do_not_count_none(self):
    # jax-triton 0.4's convention counts the non-constexpr operands: x is
    # 0, n is 1, out_ptr (given by keyword) is 2; a None is no operand.
    x, y = self.random((_N,)), self.random((_N,))
    out = jt_dist.triton_call(
        x, None, _N, out_ptr=y, kernel=maybe_bias_kernel, out_shape=_like(x),
        grid=_GRID, BLOCK=_BLOCK, scale=3.0, input_output_aliases={2: 0})
    self.assertAllClose(out, x * 3.0, rtol=1e-6)
    with self.assertRaises(jt_dist.KernelBindingError) as cm:
      jt_dist.triton_call(
          x, None, _N, out_ptr=y, kernel=maybe_bias_kernel,
          out_shape=_like(x), grid=_GRID, BLOCK=_BLOCK, scale=3.0,
          input_output_aliases={1: 0})
    self.assertIn("key 1 is operand 'n', a scalar", str(cm.exception))

  def test_none_used_as_a_value_fails_at_its_line(self):
    if testing.platform() != "cpu":
      self.skipTest("the CPU interpreter's error; CudaLoweringTest has the"
                    " compiler's")
    x = self.random((_N,))
    with self.assertRaises(triton.runtime.errors.InterpreterError) as cm:
      jt_dist.triton_call(x, None, None, kernel=maybe_bias_kernel,
                          out_shape=_like(x), grid=_GRID, BLOCK=_BLOCK,
                          scale=None)
    for part in ("maybe_bias_kernel", "`mask = offsets < n`", "NoneType"):
      self.assertIn(part, str(cm.exception))

  def test_none_in_a_tuple_is_refused_naming_it(self):
    x = self.random((_N,))
    with self.assertRaises(TypeError) as cm:
      jt_dist.triton_call(x, (None,), _N, kernel=maybe_bias_kernel,
                          out_shape=_like(x), grid=_GRID, BLOCK=_BLOCK,
                          scale=None)
    self.assertIn("args[1][0] = None", str(cm.exception))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.IsolatedCacheMixin, testing.TestCase):

  @parameterized.parameters(False, True)
  def test_none_is_no_parameter_of_the_launch(self, by_keyword):
    x = jnp.zeros((_N,), jnp.float32)

    def f(a):
      if by_keyword:
        return jt_dist.triton_call(
            a, n=_N, bias_ptr=None, kernel=maybe_bias_kernel,
            out_shape=_like(a), grid=_GRID, BLOCK=_BLOCK, scale=None,
            compute_capability=90)
      return _call(a, None, scale=None, compute_capability=90)

    (call,) = util.triton_custom_calls(util.lower(f, x))
    kinds = [p[0] for p in call["calls"][0]["params"]]
    # x, n and the output: bias_ptr and scale are compiled in.
    self.assertEqual(kinds.count("array"), 2)
    self.assertLen(kinds, 3)
    (with_bias,) = util.triton_custom_calls(util.lower(
        lambda a: _call(a, a, scale=None, compute_capability=90), x))
    self.assertEqual(
        [p[0] for p in with_bias["calls"][0]["params"]].count("array"), 3)

  def test_none_used_as_a_value_fails_to_compile_at_its_line(self):
    x = jnp.zeros((_N,), jnp.float32)
    with self.assertRaises(triton.compiler.errors.CompilationError) as cm:
      util.lower(lambda a: jt_dist.triton_call(
          a, None, None, kernel=maybe_bias_kernel, out_shape=_like(a),
          grid=_GRID, BLOCK=_BLOCK, scale=None, compute_capability=90), x)
    for part in ("mask = offsets < n", "NoneType"):
      self.assertIn(part, str(cm.exception))


if __name__ == "__main__":
  absltest.main()
