"""``debug=True`` turns on kernel asserts on the CPU interpreter.

A failing ``tl.device_assert`` (with ``debug=True``) or ``tl.static_assert``
(always, as when compiling) raises ``KernelAssertionError`` naming the
kernel, the program id and the assert's message (a static assert's line
too), eagerly; under ``jax.jit`` its text reaches the caller in jax's error.
Cross-lowered for CUDA, Triton's compiler checks static asserts, also after
a launch on the interpreter.
"""

from __future__ import annotations

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter as _interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


@triton.jit
def checked_copy_kernel(x_ptr, limit, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  tl.device_assert(x < limit, "x must stay below the limit")
  tl.store(out_ptr + offsets, x)


@triton.jit
def static_checked_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  tl.static_assert(BLOCK % 32 == 0, "BLOCK must be a multiple of 32")
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


@triton.jit
def seeded_scale_kernel(x_ptr, seed, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  r = tl.rand(seed, offsets)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * r)


@triton.jit
def add_one_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + 1)


def _copy(x, limit, debug, jit=False, kernel=checked_copy_kernel, **meta):
  args = (limit,) if kernel is checked_copy_kernel else ()

  def f(a):
    return jt_dist.triton_call(
        a, *args, kernel=kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=(a.size // meta.get("BLOCK", _BLOCK),), debug=debug,
        **{"BLOCK": _BLOCK, **meta})
  return jax.block_until_ready((jax.jit(f) if jit else f)(x))


class KernelAssertTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("tests the CPU interpreter's asserts; on a GPU a failed"
                    " device assert is a launch failure")

  def _input(self, programs, bad_program):
    """Values in [0, 1), one of them 2.0 in ``bad_program``."""
    x = self.np_rng.uniform(0.0, 1.0, size=programs * _BLOCK).astype(
        np.float32)
    lane = int(self.np_rng.integers(_BLOCK))
    x[bad_program * _BLOCK + lane] = 2.0
    return jnp.asarray(x)

  def test_failing_device_assert_raises_with_kernel_program_and_message(self):
    bad = int(self.np_rng.integers(4))
    x = self._input(4, bad)
    with self.assertRaisesRegex(
        jt_dist.KernelAssertionError,
        rf"kernel 'checked_copy_kernel', program id \({bad}, 0, 0\):"
        r" tl\.device_assert failed in 1 of 16 lanes: x must stay below the"
        r" limit"):
      _copy(x, 1.5, debug=True)

  def test_failing_device_assert_under_jit(self):
    bad = int(self.np_rng.integers(4))
    x = self._input(4, bad)
    with self.assertRaisesKernelError(jt_dist.KernelAssertionError,
                                      jitted=True) as caught:
      _copy(x, 1.5, debug=True, jit=True)
    self.assertRegex(
        caught.message,
        rf"'checked_copy_kernel', program id"
        rf" \({bad}, 0, 0\).*x must stay below the limit")

  def test_device_assert_is_off_without_debug(self):
    # As in Triton: device asserts are compiled only in debug mode.
    x = self._input(2, 1)
    np.testing.assert_array_equal(_copy(x, 1.5, debug=False), x)

  def test_holding_device_assert_lets_the_kernel_run(self):
    x = self._input(3, 0)
    np.testing.assert_array_equal(_copy(x, 3.0, debug=True), x)

  @parameterized.parameters(True, False)
  def test_failing_static_assert_raises(self, debug):
    x = jnp.asarray(self.random((_BLOCK * 2,)))
    with self.assertRaisesRegex(
        jt_dist.KernelAssertionError,
        r"kernel 'static_checked_kernel', program id \(0, 0, 0\):"
        r" tl\.static_assert failed at .*kernel_assert_test\.py:\d+"
        r" \(`tl\.static_assert\(BLOCK % 32 == 0, .*\)`\): BLOCK must be a"
        r" multiple of 32$"):
      _copy(x, None, debug=debug, kernel=static_checked_kernel)

  @parameterized.parameters(False, True)
  def test_static_assert_in_a_library_function_names_both_lines(self, jit):
    # tl.rand asserts that its seed is an integer, with no message: a float
    # seed fails the assert inside Triton's library.
    x = jnp.asarray(self.random((_BLOCK,)))
    seed = float(self.np_rng.uniform(1, 1000))

    def f(a, s):
      return jt_dist.triton_call(
          a, s, kernel=seeded_scale_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(1,),
          BLOCK=_BLOCK)
    with self.assertRaisesKernelError(jt_dist.KernelAssertionError,
                                      jitted=jit) as caught:
      if jit:
        jax.block_until_ready(jax.jit(lambda a: f(a, seed))(x))
      else:
        f(x, seed)
    for part in ("kernel 'seeded_scale_kernel'",
                 "tl.static_assert failed at ",
                 "random.py:",
                 "reached from the kernel's line ",
                 "kernel_assert_test.py:",
                 "(`r = tl.rand(seed, offsets)`)",
                 ": (no message)"):
      self.assertIn(part, caught.message)

  def test_holding_static_assert_lets_the_kernel_run(self):
    x = jnp.asarray(self.random((64,)))
    np.testing.assert_array_equal(
        _copy(x, None, debug=True, kernel=static_checked_kernel, BLOCK=32), x)

  def test_debug_turns_on_overflow_checks_as_triton_does(self):
    # Triton's debug mode also checks integer arithmetic for overflow.
    x = jnp.asarray(np.full((_BLOCK,), 2**31 - 1, np.int32))
    with self.assertRaisesRegex(
        jt_dist.KernelAssertionError,
        r"'add_one_kernel'.*int32 overflow detected for operation add"):
      _copy(x, None, debug=True, kernel=add_one_kernel)
    wrapped = _copy(x, None, debug=False, kernel=add_one_kernel)
    np.testing.assert_array_equal(wrapped, np.full((_BLOCK,), -(2**31)))

  @parameterized.parameters(True, False)
  def test_overflow_checks_run_only_where_their_assert_would(self, debug):
    # Without debug the check's device assert is a no-op, as in compiled
    # kernels: int32 arithmetic wraps. Triton's own defaults stay as they
    # were, whichever way a launch went.
    x = jnp.asarray(np.full((_BLOCK,), 2**31 - 1, np.int32))
    for _ in range(2):
      if debug:
        with self.assertRaisesRegex(jt_dist.KernelAssertionError,
                                    "int32 overflow detected"):
          _copy(x, None, debug=True, kernel=add_one_kernel)
      else:
        np.testing.assert_array_equal(
            _copy(x, None, debug=False, kernel=add_one_kernel),
            np.full((_BLOCK,), -(2**31)))
      self.assertTrue(_interpreter.InterpreterOptions().sanitize_overflow)

  def test_error_types(self):
    self.assertTrue(issubclass(jt_dist.KernelAssertionError, AssertionError))
    self.assertTrue(issubclass(jt_dist.KernelAssertionError,
                               jt_dist.KernelLaunchError))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaStaticAssertTest(util.IsolatedCacheMixin, testing.TestCase):
  """Cross-lowered for CUDA: Triton's compiler checks the static asserts."""

  def _lower(self, kernel, x, *args, **meta):
    return util.lower(lambda a: jt_dist.triton_call(
        a, *args, kernel=kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(1,),
        compute_capability=90, **{"BLOCK": _BLOCK, **meta}), x)

  def test_static_assert_fails_the_compile_after_a_cpu_launch(self):
    x = jnp.zeros((_BLOCK,), jnp.float32)
    if testing.platform() == "cpu":
      # A launch on the interpreter first: compiling afterwards must still
      # check the kernel's static asserts.
      with self.assertRaises(jt_dist.KernelAssertionError):
        _copy(x, None, debug=False, kernel=static_checked_kernel)
    with self.assertRaisesRegex(triton.compiler.errors.CompilationError,
                                "BLOCK must be a multiple of 32"):
      self._lower(static_checked_kernel, x)

  def test_static_assert_in_a_library_function_is_noted(self):
    x = jnp.zeros((_BLOCK,), jnp.float32)
    with self.assertRaises(triton.compiler.errors.CompilationError) as cm:
      util.lower(lambda a: jt_dist.triton_call(
          a, 7.5, kernel=seeded_scale_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(1,),
          compute_capability=90, BLOCK=_BLOCK), x)
    self.assertIn("r = tl.rand(seed, offsets)", str(cm.exception))
    (note,) = [n for n in getattr(cm.exception, "__notes__", ())
               if n.startswith("jt_dist:")]
    for part in ("tl.static_assert failed in philox",
                 "(`tl.static_assert(seed.dtype.is_int())`)",
                 "(no message)"):
      self.assertIn(part, note)


if __name__ == "__main__":
  absltest.main()
