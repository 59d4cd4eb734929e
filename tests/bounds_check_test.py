"""The CPU interpreter's bounds and unwritten-output checks."""

from __future__ import annotations

import os
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
import examples_test

testing.configure_cpu_devices()

_ENV = "JT_DIST_BOUNDS_CHECK"


@triton.jit
def copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  """Copies without a mask: right only when BLOCK divides the size."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


@triton.jit
def accumulate_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """out += x: reads the output before writing it."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  acc = tl.load(out_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, acc + tl.load(x_ptr + offsets, mask=mask),
           mask=mask)


@triton.jit
def accumulate_aliased_kernel(x_ptr, acc_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # acc_ptr is aliased to out_ptr: the kernel works on out_ptr. (Triton's
  # code generator has no `del`.)
  accumulate_kernel(x_ptr, n, out_ptr, BLOCK)


@triton.jit
def even_then_all_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """Writes the even elements, then reads them all: the odd ones are unset."""
  offsets = tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask),
           mask=mask & (offsets % 2 == 0))
  tl.store(out_ptr + offsets, tl.load(out_ptr + offsets, mask=mask) * 2,
           mask=mask)


@triton.jit
def histogram_kernel(idx_ptr, n, hist_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  bins = tl.load(idx_ptr + offsets, mask=mask, other=0)
  tl.atomic_add(hist_ptr + bins, 1, mask=mask)


@triton.jit
def cas_kernel(idx_ptr, out_ptr, BLOCK: tl.constexpr):
  """Sets out[idx[i]] from 0 to 1 with compare-and-swap."""
  bins = tl.load(idx_ptr + tl.arange(0, BLOCK))
  tl.atomic_cas(out_ptr + bins, tl.zeros((BLOCK,), tl.int32),
                tl.full((BLOCK,), 1, tl.int32))


@triton.jit
def wrapping_offsets_kernel(x_ptr, row, stride, out_ptr, BLOCK: tl.constexpr,
                            WIDE: tl.constexpr):
  """Reads row ``row`` of a ``stride``-wide matrix, in int32 or int64."""
  if WIDE:
    start = row.to(tl.int64) * stride
  else:
    start = row * stride
  cols = tl.arange(0, BLOCK)
  tl.store(out_ptr + cols, tl.load(x_ptr + start + cols))


@triton.jit
def descriptor_copy_kernel(x_ptr, m, n, out_ptr, BM: tl.constexpr,
                           BN: tl.constexpr):
  src = tl.make_tensor_descriptor(x_ptr, shape=[m, n], strides=[n, 1],
                                  block_shape=[BM, BN])
  dst = tl.make_tensor_descriptor(out_ptr, shape=[m, n], strides=[n, 1],
                                  block_shape=[BM, BN])
  row = tl.program_id(0) * BM
  dst.store([row, 0], src.load([row, 0]))


@triton.jit
def block_pointer_copy_kernel(x_ptr, m, n, out_ptr, BM: tl.constexpr,
                              BN: tl.constexpr):
  row = tl.program_id(0) * BM
  src = tl.make_block_ptr(x_ptr, shape=(m, n), strides=(n, 1),
                          offsets=(row, 0), block_shape=(BM, BN), order=(1, 0))
  dst = tl.make_block_ptr(out_ptr, shape=(m, n), strides=(n, 1),
                          offsets=(row, 0), block_shape=(BM, BN), order=(1, 0))
  tl.store(dst, tl.load(src))


@triton.jit
def integer_pointer_kernel(address, out_ptr, BLOCK: tl.constexpr):
  """Loads through a pointer made from an integer, not from a parameter."""
  offsets = tl.arange(0, BLOCK)
  source = address.to(tl.pointer_type(tl.float32))
  tl.store(out_ptr + offsets, tl.load(source + offsets))


def _spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def _call(jit, *args, **kwargs):
  if not jit:
    return jt_dist.triton_call(*args, **kwargs)
  # Only the arrays are traced: Python scalars stay kernel scalars.
  is_array = [isinstance(a, jax.Array) for a in args]

  def call(*arrays):
    it = iter(arrays)
    full = [next(it) if array else a for a, array in zip(args, is_array)]
    return jt_dist.triton_call(*full, **kwargs)

  return jax.jit(call)(*[a for a, array in zip(args, is_array) if array])


class BoundsCheckTest(testing.TestCase):
  """Kernels that go wrong raise a named error instead of crashing."""

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("the bounds check runs in the CPU interpreter; compiled"
                    " GPU kernels are not checked")
    # On whatever the environment says: unchecked, these kernels would
    # crash the process.
    env = mock.patch.dict(os.environ, {_ENV: "1"})
    env.start()
    self.addCleanup(env.stop)

  def assertFault(self, error_type, jit, regexes, *args, **kwargs):
    """The call raises ``error_type``, in jax's error under the caller's jit."""
    with self.assertRaisesKernelError(error_type, jitted=jit) as caught:
      jax.block_until_ready(_call(jit, *args, **kwargs))
    for regex in regexes:
      self.assertRegex(caught.message, regex)

  @parameterized.parameters(False, True)
  def test_example_add_reading_past_its_inputs(self, jit):
    add = examples_test._load("add")
    x, y = (jnp.asarray(self.random((1000,))) for _ in range(2))
    # n_elements is 100 too large: the mask lets lanes past the inputs on.
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, jit,
        [r"kernel 'add_kernel', program id \(3, 0, 0\): load through 'x_ptr'"
         r" \(input 0\) reaches 24 element\(s\) outside the buffer",
         r"element offsets \[1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007,"
         r" \.\.\. \(24 in all\)\]",
         r"holds 1000 float32 elements \(4000 bytes, shape \(1000,\)\)",
         r"Mask in force: all 256 lanes on", _ENV],
        x, y, 1100, kernel=add.add_kernel, out_shape=_spec((1000,)),
        grid=(5,), BLOCK=256)

  @parameterized.parameters(False, True)
  def test_example_add_writing_past_its_output(self, jit):
    add = examples_test._load("add")
    x, y = (jnp.asarray(self.random((1000,))) for _ in range(2))
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, jit,
        [r"program id \(3, 0, 0\): store through 'out_ptr' \(output 0\)"
         r" reaches 100 element\(s\)",
         r"element offsets \[900, 901,", r"\(100 in all\)",
         r"holds 900 float32 elements", r"offsets must lie in \[0, 900\)",
         r"Mask in force: 232 of 256 lanes on"],
        x, y, 1000, kernel=add.add_kernel, out_shape=_spec((900,)),
        grid=(4,), BLOCK=256)

  def test_example_softmax_unmasked_tail_program(self):
    softmax = examples_test._load("softmax")
    x = jnp.asarray(self.random((4, 100)))
    # One program too many: the kernel masks columns, never rows.
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"kernel 'softmax_kernel', program id \(4, 0, 0\): load through"
         r" 'x_ptr' \(input 0\) reaches 100 element\(s\)",
         r"element offsets \[400, 401,", r"holds 400 float32 elements",
         r"Mask in force: 100 of 128 lanes on"],
        x, 100, 100, 100, kernel=softmax.softmax_kernel,
        out_shape=_spec((4, 100)), grid=(5,), BLOCK=128)

  def test_unmasked_last_block_of_a_copy(self):
    x = jnp.asarray(self.random((100,)))
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"kernel 'copy_kernel', program id \(3, 0, 0\): load through 'x_ptr'",
         r"reaches 28 element\(s\)", r"\[100, 101,",
         r"Mask in force: all 32 lanes on"],
        x, kernel=copy_kernel, out_shape=_spec((100,)), grid=(4,), BLOCK=32)

  def test_pointer_from_an_integer(self):
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"kernel 'integer_pointer_kernel', program id \(0, 0, 0\): load"
         r" through a pointer that points into no buffer of the call \(16"
         r" lanes; all 16 lanes on", "derived from a pointer parameter"],
        2**33, kernel=integer_pointer_kernel, out_shape=_spec((16,)),
        grid=(1,), BLOCK=16)

  def test_masked_kernels_pass_the_check(self):
    x = self.random((96,))
    out = _call(False, jnp.asarray(x), kernel=copy_kernel,
                out_shape=_spec((96,)), grid=(3,), BLOCK=32)
    self.assertAllClose(out, x)

  @parameterized.parameters((False, r"\[-2147483648, -2147483647,", True),
                            (True, r"\[2147483648, 2147483649,", False))
  def test_offsets_that_outgrow_int32(self, wide, offsets, hinted):
    x = jnp.asarray(self.random((16,)))
    with self.assertRaises(jt_dist.OutOfBoundsAccessError) as caught:
      _call(False, x, 2, 2**30, kernel=wrapping_offsets_kernel,
            out_shape=_spec((16,)), grid=(1,), BLOCK=16, WIDE=wide)
    text = str(caught.exception)
    self.assertRegex(text, r"load through 'x_ptr' \(input 0\)")
    self.assertRegex(text, offsets)
    self.assertEqual("32-bit offset arithmetic" in text, hinted, text)

  def test_tensor_descriptor_declared_larger_than_its_buffer(self):
    x = self.random((32, 16))
    good = _call(False, jnp.asarray(x), 32, 16, kernel=descriptor_copy_kernel,
                 out_shape=_spec((32, 16)), grid=(2,), BM=16, BN=16)
    self.assertAllClose(good, x)
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"kernel 'descriptor_copy_kernel', program id \(2, 0, 0\): load"
         r" through 'x_ptr'", r"reaches 256 element\(s\)", r"\[512, 513,",
         r"shape \(32, 16\)"],
        jnp.asarray(x), 48, 16, kernel=descriptor_copy_kernel,
        out_shape=_spec((32, 16)), grid=(3,), BM=16, BN=16)

  def test_block_pointer_past_its_buffer(self):
    x = self.random((32, 16))
    try:
      good = _call(False, jnp.asarray(x), 32, 16,
                   kernel=block_pointer_copy_kernel,
                   out_shape=_spec((32, 16)), grid=(2,), BM=16, BN=16)
    except Exception as e:  # pylint: disable=broad-except
      if "Block pointers have been removed" not in str(e):
        raise
      self.skipTest(f"this Triton ({triton.__version__}) has no block"
                    " pointers; tensor descriptors replace them")
    self.assertAllClose(good, x)
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"program id \(2, 0, 0\): load through 'x_ptr'",
         r"reaches 256 element\(s\)", r"\[512, 513,"],
        jnp.asarray(x), 48, 16, kernel=block_pointer_copy_kernel,
        out_shape=_spec((32, 16)), grid=(3,), BM=16, BN=16)

  def test_atomic_add_into_bins_past_the_histogram(self):
    idx = self.np_rng.integers(0, 8, size=50).astype(np.int32)
    hist = _call(False, jnp.asarray(idx), 50, kernel=histogram_kernel,
                 out_shape=_spec((8,), jnp.int32), grid=(2,), BLOCK=32,
                 zeroed_outputs=(0,))
    np.testing.assert_array_equal(hist, np.bincount(idx, minlength=8))
    idx[7] = 11
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"kernel 'histogram_kernel', program id \(0, 0, 0\): atomic through"
         r" 'hist_ptr' \(output 0\) reaches 1 element\(s\)", r"\[11\]",
         r"holds 8 int32 elements", r"Mask in force: all 32 lanes on"],
        jnp.asarray(idx), 50, kernel=histogram_kernel,
        out_shape=_spec((8,), jnp.int32), grid=(2,), BLOCK=32,
        zeroed_outputs=(0,))

  def test_atomic_cas_past_its_buffer(self):
    idx = self.np_rng.permutation(16).astype(np.int32)
    out = _call(False, jnp.asarray(idx), kernel=cas_kernel,
                out_shape=_spec((16,), jnp.int32), grid=(1,), BLOCK=16,
                zeroed_outputs=(0,))
    np.testing.assert_array_equal(out, np.ones(16, np.int32))
    idx[3] = -2
    self.assertFault(
        jt_dist.OutOfBoundsAccessError, False,
        [r"atomic_cas through 'out_ptr' \(output 0\) reaches 1 element\(s\)",
         r"\[-2\]"],
        jnp.asarray(idx), kernel=cas_kernel, out_shape=_spec((16,), jnp.int32),
        grid=(1,), BLOCK=16, zeroed_outputs=(0,))

  def test_atomic_add_into_an_output_nobody_zeroed(self):
    idx = jnp.asarray(self.np_rng.integers(0, 8, size=50).astype(np.int32))
    self.assertFault(
        jt_dist.UnwrittenOutputReadError, False,
        [r"kernel 'histogram_kernel', program id \(0, 0, 0\): atomic through"
         r" 'hist_ptr' \(output 0\) reads \d+ element\(s\) that the kernel has"
         r" not written", "zeroed_outputs=", "input_output_aliases="],
        idx, 50, kernel=histogram_kernel, out_shape=_spec((8,), jnp.int32),
        grid=(2,), BLOCK=32)

  @parameterized.parameters(False, True)
  def test_reading_an_output_before_writing_it(self, jit):
    x = jnp.asarray(self.random((100,)))
    self.assertFault(
        jt_dist.UnwrittenOutputReadError, jit,
        [r"kernel 'accumulate_kernel', program id \(0, 0, 0\): load through"
         r" 'out_ptr' \(output 0\) reads 64 element\(s\) that the kernel has"
         r" not written", r"\[0, 1, 2,", r"holds 100 float32 elements",
         r"Mask in force: all 64 lanes on"],
        x, 100, kernel=accumulate_kernel, out_shape=_spec((100,)), grid=(2,),
        BLOCK=64)

  def test_only_the_unwritten_elements_are_named(self):
    x = jnp.asarray(self.random((10,)))
    self.assertFault(
        jt_dist.UnwrittenOutputReadError, False,
        [r"reads 5 element\(s\)", r"element offsets \[1, 3, 5, 7, 9\]",
         r"Mask in force: 10 of 16 lanes on"],
        x, 10, kernel=even_then_all_kernel, out_shape=_spec((10,)),
        grid=(1,), BLOCK=16)

  def test_zeroed_and_aliased_outputs_start_written(self):
    x, acc = self.random((100,)), self.random((100,))
    zeroed = _call(False, jnp.asarray(x), 100, kernel=accumulate_kernel,
                   out_shape=_spec((100,)), grid=(2,), BLOCK=64,
                   zeroed_outputs=(0,))
    self.assertAllClose(zeroed, x)
    aliased = _call(False, jnp.asarray(x), jnp.asarray(acc), 100,
                    kernel=accumulate_aliased_kernel, out_shape=_spec((100,)),
                    grid=(2,), BLOCK=64, input_output_aliases={1: 0})
    self.assertAllClose(aliased, x + acc)

  @parameterized.parameters("0", "false", "OFF", "no")
  def test_the_switch_turns_the_check_off(self, value):
    x = jnp.asarray(self.random((100,)))
    kwargs = dict(kernel=accumulate_kernel, out_shape=_spec((100,)),
                  grid=(2,), BLOCK=64)
    with mock.patch.dict(os.environ, {_ENV: value}):
      out = _call(False, x, 100, **kwargs)
    # Unchecked, the read sees the CPU path's poison pattern (NaN).
    self.assertTrue(np.isnan(np.asarray(out)).all())
    with mock.patch.dict(os.environ, {_ENV: "1"}):
      with self.assertRaises(jt_dist.UnwrittenOutputReadError):
        _call(False, x, 100, **kwargs)


if __name__ == "__main__":
  absltest.main()
