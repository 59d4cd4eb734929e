"""``and``, ``or`` and ``not`` in kernels mean what compiled Triton makes them.

Triton's code generator lowers ``a and b`` on run-time values to
``a.logical_and(b)`` (elementwise on blocks), ``not a`` to ``a.__not__()``,
and lets a deciding ``tl.constexpr`` operand end the expression at compile
time. Python's truthiness would make ``mask_a and mask_b`` one of the two
masks. Each kernel runs vectorised and one program at a time and is checked
against NumPy.
"""

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16
_PROGRAMS = 4


@triton.jit
def masks_kernel(x_ptr, and_ptr, or_ptr, not_ptr, chain_ptr,
                 BLOCK: tl.constexpr):
  offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offs)
  low, high, even = x < 0.5, x > -0.5, offs % 2 == 0
  tl.store(and_ptr + offs, (low and high).to(tl.int32))
  tl.store(or_ptr + offs, (low or even).to(tl.int32))
  tl.store(not_ptr + offs, (not low).to(tl.int32))
  tl.store(chain_ptr + offs, (low and high or not even).to(tl.int32))


@triton.jit
def masked_load_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # A causal-attention style mask: two conditions joined by `and`.
  offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offs < n and offs % 3 != 0
  tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=-1.0))


@triton.jit
def per_program_kernel(out_ptr, BLOCK: tl.constexpr):
  # Scalars that differ between programs: elementwise over the programs.
  pid = tl.program_id(0)
  both = pid % 2 == 0 and pid < 3
  either = pid == 1 or pid == 3
  tl.store(out_ptr + pid * 3, both.to(tl.int32))
  tl.store(out_ptr + pid * 3 + 1, either.to(tl.int32))
  tl.store(out_ptr + pid * 3 + 2, (not both).to(tl.int32))


@triton.jit
def constexpr_kernel(x_ptr, and_ptr, or_ptr, USE_MASK: tl.constexpr,
                     BLOCK: tl.constexpr):
  offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offs)
  # A deciding constexpr (False for `and`, True for `or`) is the result,
  # and the comparison after it is never built.
  tl.store(and_ptr + offs, tl.where(USE_MASK and x > 0.0, x, -1.0))
  tl.store(or_ptr + offs, tl.where(USE_MASK or x > 0.0, x, -1.0))


class BooleanOpsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ))
    self.x = np.random.default_rng(0).uniform(
        -1, 1, _BLOCK * _PROGRAMS).astype(np.float32)

  def _call(self, vectorize, kernel, args, outs, **kwargs):
    os.environ["JT_DIST_VECTORIZE"] = vectorize
    return [np.asarray(o) for o in jt_dist.triton_call(
        *args, kernel=kernel, out_shape=outs, grid=(_PROGRAMS,), **kwargs)]

  @parameterized.parameters("on", "off")
  def test_on_blocks_elementwise(self, vectorize):
    ints = jax.ShapeDtypeStruct(self.x.shape, jnp.int32)
    got = self._call(vectorize, masks_kernel, [jnp.asarray(self.x)],
                     [ints] * 4, BLOCK=_BLOCK)
    x, offs = self.x, np.arange(self.x.size)
    low, high, even = x < 0.5, x > -0.5, offs % 2 == 0
    for out, expected in zip(got, [low & high, low | even, ~low,
                                   (low & high) | ~even]):
      np.testing.assert_array_equal(out, expected.astype(np.int32))

  @parameterized.parameters("on", "off")
  def test_a_mask_joined_by_and(self, vectorize):
    n = 50
    (got,) = self._call(vectorize, masked_load_kernel,
                        [jnp.asarray(self.x), n],
                        [jax.ShapeDtypeStruct(self.x.shape, jnp.float32)],
                        BLOCK=_BLOCK)
    offs = np.arange(self.x.size)
    np.testing.assert_array_equal(
        got, np.where((offs < n) & (offs % 3 != 0), self.x, -1.0))

  @parameterized.parameters("on", "off")
  def test_on_scalars_that_differ_between_programs(self, vectorize):
    (got,) = self._call(vectorize, per_program_kernel, [],
                        [jax.ShapeDtypeStruct((3 * _PROGRAMS,), jnp.int32)],
                        BLOCK=_BLOCK)
    pid = np.arange(_PROGRAMS)
    both = (pid % 2 == 0) & (pid < 3)
    expected = np.stack([both, (pid == 1) | (pid == 3), ~both], 1)
    np.testing.assert_array_equal(got, expected.reshape(-1).astype(np.int32))

  @parameterized.product(vectorize=("on", "off"), use_mask=(True, False))
  def test_a_deciding_constexpr_ends_the_expression(self, vectorize,
                                                    use_mask):
    floats = jax.ShapeDtypeStruct(self.x.shape, jnp.float32)
    got_and, got_or = self._call(vectorize, constexpr_kernel,
                                 [jnp.asarray(self.x)], [floats] * 2,
                                 USE_MASK=use_mask, BLOCK=_BLOCK)
    x = self.x
    positive = np.where(x > 0.0, x, -1.0)
    np.testing.assert_array_equal(
        got_and, positive if use_mask else np.full_like(x, -1.0))
    np.testing.assert_array_equal(got_or, x if use_mask else positive)

if __name__ == "__main__":
  absltest.main()
