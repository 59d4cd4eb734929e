"""Eager CPU calls launch directly: no XLA executable, the same results.

Each test checks the direct route against what ``jax.jit`` (XLA's host
callback) gives for the same call: values, the outputs' device and
commitment, errors, and the calls it must hand to the jitted route.
"""

from __future__ import annotations

import traceback
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
from jt_dist._call import dispatch as _dispatch
from jt_dist._cpu import direct as _direct

testing.configure_cpu_devices()

_BLOCK = 16
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@triton.jit
def axpy_kernel(x_ptr, y_ptr, alpha, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, alpha * x + tl.load(y_ptr + offsets, mask=mask),
           mask=mask)


@triton.jit
def scribble_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """Writes through its input pointer: a bug, which must stay contained."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(x_ptr + offsets, x * 0 - 7, mask=mask)
  tl.store(out_ptr + offsets, x + 1, mask=mask)


@triton.jit
def accumulate_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  acc = tl.load(out_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, acc + tl.load(x_ptr + offsets, mask=mask),
           mask=mask)


def _axpy(x, y, alpha=2.0):
  return jt_dist.triton_call(
      x, y, alpha, x.size, kernel=axpy_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(_cdiv(x.size, _BLOCK),), BLOCK=_BLOCK)


def _cdiv(a, b):
  return -(-a // b)


class _Compiles:
  """Counts XLA compilations while in use (jax.monitoring's event)."""

  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event, duration, **kwargs):
    del duration, kwargs
    if event == _COMPILE_EVENT:
      self.count += 1


_compiles = _Compiles()


class DirectLaunchTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("eager calls launch directly only on the CPU")
    _dispatch.invalidate()
    self.addCleanup(_dispatch.invalidate)

  def inputs(self, n=100):
    x, y = self.random((n,)), self.random((n,))
    return x, y, 2.0 * x + y

  def test_first_and_later_calls_compile_nothing(self):
    x, y, expected = self.inputs()
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    jax.block_until_ready((xs, ys))
    before = _compiles.count
    first = _axpy(xs, ys)
    second = _axpy(xs, ys, 3.0)
    self.assertEqual(_compiles.count, before)
    self.assertAllClose(first, expected)
    self.assertAllClose(second, 3.0 * x + y)

  def test_direct_launches_off_compile_an_executable(self):
    x, y, expected = self.inputs(101)
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    jax.block_until_ready((xs, ys))
    previous = _direct.use_direct(False)
    self.addCleanup(_direct.use_direct, previous)
    before = _compiles.count
    self.assertAllClose(_axpy(xs, ys), expected)
    self.assertGreater(_compiles.count, before)

  @parameterized.named_parameters(("default", None), ("device_3", 3))
  def test_outputs_placed_as_jit_places_them(self, device):
    x, y, expected = self.inputs()
    if device is None:
      xs, ys = jnp.asarray(x), jnp.asarray(y)
    else:
      target = jax.devices()[device]
      xs, ys = jax.device_put(x, target), jax.device_put(y, target)
    direct = _axpy(xs, ys)
    jitted = jax.jit(_axpy)(xs, ys)
    self.assertAllClose(direct, expected)
    self.assertEqual(direct.sharding, jitted.sharding)
    self.assertEqual(direct.committed, jitted.committed)
    self.assertEqual(direct.committed, device is not None)

  def test_numpy_operands_of_the_bound_dtype(self):
    x, y, expected = self.inputs()
    out = _axpy(x, y)
    self.assertIsInstance(out, jax.Array)
    self.assertFalse(out.committed)
    self.assertAllClose(out, expected)

  def test_float64_numpy_operands_are_bound_as_jit_converts_them(self):
    # Without jax_enable_x64 jit passes float32 of them to the kernel, so
    # the call is bound for float32 pointers.
    x = self.np_rng.uniform(-2, 2, (50,))
    y = self.np_rng.uniform(-2, 2, (50,))

    def call(x, y):
      return jt_dist.triton_call(
          x, y, 2.0, x.size, kernel=axpy_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, np.float32),
          grid=(4,), BLOCK=_BLOCK)

    expected = 2.0 * x.astype(np.float32) + y.astype(np.float32)
    for _ in range(2):  # The first call, then its entry.
      out = call(x, y)
      self.assertEqual(out.dtype, np.float32)
      self.assertAllClose(out, expected)
    self.assertAllClose(jax.jit(call)(x, y), expected)

  def test_mixed_devices_take_the_jitted_route(self):
    x, y, expected = self.inputs()
    xs = jax.device_put(x, jax.devices()[2])
    ys = jnp.asarray(y)  # Uncommitted, on the default device.
    out = _axpy(xs, ys)
    self.assertAllClose(out, expected)
    self.assertEqual(out.sharding, jax.jit(_axpy)(xs, ys).sharding)

  def test_uncommitted_outputs_go_to_the_default_device(self):
    x, y, expected = self.inputs()
    with jax.default_device(jax.devices()[5]):
      xs, ys = jnp.asarray(x), jnp.asarray(y)
      direct = _axpy(xs, ys)
      jitted = jax.jit(_axpy)(xs, ys)
    self.assertAllClose(direct, expected)
    self.assertEqual(direct.sharding, jitted.sharding)
    self.assertFalse(direct.committed)
    self.assertEqual(direct.devices(), {jax.devices()[5]})

  def test_a_call_without_arrays_launches_on_the_default_device(self):
    before = _compiles.count
    with jax.default_device(jax.devices()[4]):
      out = jt_dist.triton_call(
          2.5, kernel=fill_kernel,
          out_shape=jax.ShapeDtypeStruct((_BLOCK,), np.float32), grid=(1,),
          BLOCK=_BLOCK)
    self.assertEqual(_compiles.count, before)
    self.assertAllClose(out, np.full(_BLOCK, 2.5, np.float32))
    self.assertFalse(out.committed)
    self.assertEqual(out.devices(), {jax.devices()[4]})

  def test_a_kernel_writing_its_input_leaves_the_callers_array(self):
    x = self.random((40,))
    xs = jnp.asarray(x)
    out = jt_dist.triton_call(
        xs, x.size, kernel=scribble_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,),
        BLOCK=_BLOCK)
    self.assertAllClose(out, x + 1)
    self.assertAllClose(xs, x)

  def test_zeroed_and_aliased_outputs_start_as_under_jit(self):
    x, start = self.random((40,)), self.random((40,))
    xs, starts = jnp.asarray(x), jnp.asarray(start)

    def zeroed(xs):
      return jt_dist.triton_call(
          xs, x.size, kernel=accumulate_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,),
          BLOCK=_BLOCK, zeroed_outputs=(0,))

    def aliased(xs, starts):
      return jt_dist.triton_call(
          xs, starts, x.size, kernel=accumulate_aliased_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,),
          BLOCK=_BLOCK, input_output_aliases={1: 0})

    self.assertAllClose(zeroed(xs), x)
    self.assertAllClose(jax.jit(zeroed)(xs), x)
    self.assertAllClose(aliased(xs, starts), start + x)
    self.assertAllClose(jax.jit(aliased)(xs, starts), start + x)
    self.assertAllClose(starts, start)

  def test_a_transfer_guard_does_not_stop_a_cpu_launch(self):
    x, y, expected = self.inputs()
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    with jax.transfer_guard("disallow"):
      out = _axpy(xs, ys)
    self.assertAllClose(out, expected)

  def test_kernel_error_is_raised_by_the_call_without_interpreter_frames(self):
    x = jnp.asarray(self.random((20,)))
    with self.assertRaises(jt_dist.OutOfBoundsAccessError) as caught:
      jt_dist.triton_call(
          x, kernel=unmasked_copy_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
          BLOCK=_BLOCK)
    self.assertIn("unmasked_copy_kernel", str(caught.exception))
    frames = [f.filename for f in
              traceback.extract_tb(caught.exception.__traceback__)]
    self.assertFalse([f for f in frames if "interpreter" in f], frames)

  def test_an_entry_called_often_compiles_its_executable_once(self):
    x, y, expected = self.inputs(77)
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    jax.block_until_ready((xs, ys))
    with mock.patch.object(_direct, "PROMOTE_AFTER", 3):
      counts = []
      for _ in range(6):
        before = _compiles.count
        self.assertAllClose(_axpy(xs, ys), expected)
        counts.append(_compiles.count - before)
    # Three direct launches, then the executable: compiled once.
    self.assertEqual(counts, [0, 0, 0, 1, 0, 0])

  def test_deleted_operand_is_refused_as_jit_refuses_it(self):
    x, y, _ = self.inputs()
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    _axpy(xs, ys)
    xs.delete()
    with self.assertRaisesRegex(RuntimeError, "deleted"):
      _axpy(xs, ys)


@triton.jit
def accumulate_aliased_kernel(x_ptr, start_ptr, n, out_ptr,
                              BLOCK: tl.constexpr):
  """out = start + x, where out starts as start (aliased); start unread."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  acc = tl.load(out_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, acc + tl.load(x_ptr + offsets, mask=mask),
           mask=mask)


@triton.jit
def fill_kernel(value, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.full((BLOCK,), value, tl.float32))


@triton.jit
def unmasked_copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


if __name__ == "__main__":
  absltest.main()
