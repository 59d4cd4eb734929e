"""Outputs a CPU launch leaves partly unwritten: a warning, or an error.

An output that is neither aliased to an input, nor zeroed, nor a Ref starts
undefined (on a GPU, whatever the memory held). A launch on the CPU
interpreter that leaves part of one unwritten warns, once per kernel, naming
the output and how many elements; with ``debug=True`` it raises
``UnwrittenOutputReadError``. The case: Triton's fused softmax launched with
a block of 512 lanes over rows of 781 columns.
"""

import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import testing
from feature_kernels import softmax_kernel

_ROWS, _COLS = 3, 781


@triton.jit
def once_softmax_kernel(output_ptr, input_ptr, input_row_stride,
                        output_row_stride, n_rows, n_cols,
                        BLOCK_SIZE: tl.constexpr):
  # Triton's fused softmax, a kernel of its own here: the warning is shown
  # once per kernel in a process, and only this test may have seen it.
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_cols
  x = tl.load(input_ptr + row * input_row_stride + offsets, mask=mask,
              other=-float("inf"))
  x = tl.exp(x - tl.max(x, axis=0))
  tl.store(output_ptr + row * output_row_stride + offsets,
           x / tl.sum(x, axis=0), mask=mask)


@triton.jit
def prefix_copy_kernel(x_ptr, n_written, out_ptr, BLOCK: tl.constexpr):
  # Writes the first n_written elements of out_ptr, nothing else.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_written
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def prefix_double_kernel(x_ref, n_written, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_written
  tl.store(x_ref + offsets, tl.load(x_ref + offsets, mask=mask) * 2,
           mask=mask)


def _softmax(x, kernel=softmax_kernel, block=512, **options):
  rows, cols = x.shape
  return jt_dist.triton_call(
      input_ptr=x, input_row_stride=cols, output_row_stride=cols,
      n_rows=rows, n_cols=cols, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(rows,),
      BLOCK_SIZE=block, **options)


def _prefix_copy(x, n_written, **options):
  return jt_dist.triton_call(
      x, n_written, kernel=prefix_copy_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, 16),), BLOCK=16, **options)


class UnwrittenOutputsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("the CPU interpreter's check; a GPU does not track"
                    " written bytes")

  def test_softmax_with_a_short_block_warns_once(self):
    x = self.random((_ROWS, _COLS))
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      out = np.asarray(_softmax(x, kernel=once_softmax_kernel))
      _softmax(x, kernel=once_softmax_kernel)  # The same kernel: no more.
    ours = [w for w in caught if "left" in str(w.message)]
    self.assertLen(ours, 1)
    self.assertIs(ours[0].category, RuntimeWarning)
    message = str(ours[0].message)
    missing = _ROWS * (_COLS - 512)
    for part in ("kernel 'once_softmax_kernel'",
                 f"left {missing} of {_ROWS * _COLS} elements",
                 "'output_ptr' (output 0)",
                 "element offsets [512, 513,",
                 "zeroed_outputs=", "debug=True"):
      self.assertIn(part, message)
    # The 269 columns per row beyond the block hold the 0xFF poison.
    self.assertEqual(np.isnan(out).sum(axis=1).tolist(),
                     [_COLS - 512] * _ROWS)

  @parameterized.parameters(False, True)
  def test_debug_raises_naming_the_output(self, jit):
    x = self.random((_ROWS, _COLS))
    f = lambda a: _softmax(a, debug=True)
    with self.assertRaisesKernelError(jt_dist.UnwrittenOutputReadError,
                                      jitted=jit) as caught:
      jax.block_until_ready((jax.jit(f) if jit else f)(x))
    for part in ("kernel 'softmax_kernel'",
                 f"left {_ROWS * (_COLS - 512)} of {_ROWS * _COLS} elements",
                 "'output_ptr' (output 0)"):
      self.assertIn(part, caught.message)

  def test_a_block_covering_the_row_writes_everything(self):
    x = self.random((_ROWS, _COLS))
    out = _softmax(x, block=triton.next_power_of_2(_COLS), debug=True)
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    self.assertAllClose(out, expected / expected.sum(axis=1, keepdims=True))

  def test_prefix_counts_the_elements_left(self):
    x = self.random((100,))
    n = int(self.np_rng.integers(1, 99))
    with self.assertRaises(jt_dist.UnwrittenOutputReadError) as cm:
      _prefix_copy(x, n, debug=True)
    self.assertIn(f"left {100 - n} of 100 elements of 'out_ptr' (output 0)",
                  str(cm.exception))
    self.assertIn(f"element offsets [{n}, ", str(cm.exception))

  def test_zeroed_output_starts_written(self):
    x = self.random((100,))
    n = int(self.np_rng.integers(1, 99))
    out = _prefix_copy(x, n, zeroed_outputs=(0,), debug=True)
    self.assertAllClose(out, np.concatenate([x[:n], np.zeros(100 - n)]))

  def test_aliased_output_starts_as_its_input(self):
    x, y = self.random((100,)), self.random((100,))
    n = int(self.np_rng.integers(1, 99))
    out = jt_dist.triton_call(
        x, n, y, kernel=prefix_copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(7,), BLOCK=16,
        input_output_aliases={2: 0}, debug=True)
    self.assertAllClose(out, np.concatenate([x[:n], y[n:]]))

  def test_ref_starts_as_its_value(self):
    x = self.random((100,))
    n = int(self.np_rng.integers(1, 99))
    ref = jax.new_ref(jnp.asarray(x))
    jt_dist.triton_call(ref, n, kernel=prefix_double_kernel, out_type=(),
                        grid=(7,), BLOCK=16, debug=True)
    self.assertAllClose(ref[...], np.concatenate([x[:n] * 2, x[n:]]))


if __name__ == "__main__":
  absltest.main()
