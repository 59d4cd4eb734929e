"""Loop bounds and indices in interpreted kernels must be integers.

``range(n)`` converts its bounds with ``__index__``. Triton's interpreter
converts any value, so a pointer bound (a 0-d jax array, or a traced scalar
under ``jax.jit``, reaches a kernel as a pointer) loops over the pointer's
address for hours, where compiling the kernel fails at once. jt_dist's CPU
path refuses such a bound as compiling does, with the kernel, the program id,
the type and the fix.
"""

import os
import re
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util


@triton.jit
def count_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr,
                 LOADED: tl.constexpr = False, HALVED: tl.constexpr = False,
                 STEP: tl.constexpr = 1):
  """out = x + the number of iterations of ``range(0, stop, STEP)``.

  ``stop`` is ``n``; with LOADED, the value ``n`` points to (the fix for a
  0-d array); with HALVED, ``n * 0.5``, a float, which Triton does not
  compile. A large STEP makes a loop over a pointer's address end soon.
  """
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  acc = tl.load(x_ptr + offsets)
  stop = n
  if LOADED:
    stop = tl.load(n)
  if HALVED:
    stop = n * 0.5
  for _ in range(0, stop, STEP):
    acc = acc + 1
  tl.store(out_ptr + offsets, acc)


def _call(x, n, **options):
  return jt_dist.triton_call(
      x, n, kernel=count_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.size // 16,),
      BLOCK=16, **options)


class LoopBoundTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the interpreter's conversions are the CPU path; the"
                    f" default backend here is {jax.default_backend()}")
    self.x = jnp.asarray(self.random((32,)).astype(np.int32))

  @parameterized.parameters(False, True)
  def test_integer_bounds_run(self, one_at_a_time):
    n = int(self.np_rng.integers(1, 9))
    with self._path(one_at_a_time):
      eager = _call(self.x, n)
      jitted = jax.jit(lambda a: _call(a, n))(self.x)
      loaded = jax.jit(lambda a, m: _call(a, m, LOADED=True))(
          self.x, jnp.int32(n))
    for out in (eager, jitted, loaded):
      np.testing.assert_array_equal(out, np.asarray(self.x) + n)

  @parameterized.parameters(False, True)
  def test_traced_scalar_bound_is_refused(self, one_at_a_time):
    # Without the refusal the loop would run over the pointer's address; its
    # step makes that a few iterations, and this test a failure, not a hang.
    f = jax.jit(lambda a, m: _call(a, m, STEP=1 << 40))
    with self._path(one_at_a_time):
      with self.assertRaisesKernelError(jt_dist.KernelTypeError,
                                        jitted=True) as e:
        jax.block_until_ready(f(self.x, 3))
    message = e.message
    self.assertIn("kernel 'count_kernel', program id (0, 0, 0)", message)
    self.assertIn("got a value of type pointer<int32>", message)
    self.assertIn("For loop bounds and step must all be ints", message)
    self.assertRegex(message, r"0-d \(a traced scalar under jax\.jit\): pass"
                     r" a Python int \(static under jax\.jit\), or read the"
                     r" value with tl\.load")

  @parameterized.parameters(False, True)
  def test_float_bound_is_refused(self, one_at_a_time):
    with self._path(one_at_a_time):
      with self.assertRaises(jt_dist.KernelTypeError) as e:
        jax.block_until_ready(_call(self.x, 4, HALVED=True))
    message = str(e.exception)
    self.assertIn("kernel 'count_kernel', program id (0, 0, 0)", message)
    self.assertIn("got a value of type fp32", message)
    self.assertIn("e.g. `n.to(tl.int32)`", message)

  def _path(self, one_at_a_time):
    if one_at_a_time:
      return mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "0"})
    return mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "1"})


class CompiledLoopBoundTest(testing.TestCase):
  """What the CPU path matches: Triton refuses the bound when compiling."""

  @unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_compiling_refuses_the_same_bound(self):
    x = jnp.asarray(self.random((32,)).astype(np.int32))
    f = lambda a, m: _call(a, m, STEP=1 << 40, compute_capability=90)
    with self.assertRaisesRegex(
        Exception, re.escape("For loop bounds and step must all be ints")):
      util.lower(f, x, jnp.int32(3))


if __name__ == "__main__":
  absltest.main()
