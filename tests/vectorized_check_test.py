"""``JT_DIST_VECTORIZE=check`` runs each CPU launch both ways and compares.

A fault is planted in the vectorised builder (a store that writes one
value wrong, or one element too many) to stand for a bug of the vectorised
interpreter; check mode must name the kernel, the buffer and the first
element that differs, and leave the outputs of the run one program at a
time.
"""

import os
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_builder  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_launch  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x * 3.0 + y, mask=mask)


@triton.jit
def diverging_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  # A while loop whose condition differs between programs never runs in
  # lockstep.
  left = tl.program_id(0) + 1
  while left > 0:
    x = x * 2.0
    left -= 1
  tl.store(out_ptr + offsets, x)


def _planted_store(program: int, lane: int, *, value=None, extra=False):
  """``create_masked_store`` with a fault at ``program``'s ``lane``.

  Args:
    program: the flat program whose store goes wrong.
    lane: the lane of its block.
    value: what the lane stores instead (default: its value plus one).
    extra: turn the lane on, as if its mask were true.
  """
  original = vector_builder.VectorBuilder.create_masked_store

  def create_masked_store(self, ptrs, values, mask, *args, **kwargs):
    hit = self._pids[0] == program  # pylint: disable=protected-access
    shape = np.broadcast_shapes(np.shape(ptrs.data), np.shape(values.data))
    data = np.array(np.broadcast_to(values.data, (len(hit),) + shape[1:]))
    on = np.array(np.broadcast_to(mask.data, data.shape))
    data[hit, lane] = data[hit, lane] + 1 if value is None else value
    if extra:
      on[hit, lane] = True
    return original(self, ptrs, interpreter.TensorHandle(data, values.dtype),
                    interpreter.TensorHandle(on, tl.int1), *args, **kwargs)

  return mock.patch.object(vector_builder.VectorBuilder,
                           "create_masked_store", create_masked_store)


class CheckModeTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    self.enterContext(mock.patch.dict(os.environ, {
        _settings.VECTORIZE: "check", _settings.BOUNDS_CHECK: "1"}))

  def call(self, x, y, n):
    return jt_dist.triton_call(
        x, y, n, kernel=scaled_add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
        grid=(x.size // _BLOCK,), BLOCK=_BLOCK)

  def test_runs_that_agree_pass(self):
    x, y = self.random((12 * _BLOCK,)), self.random((12 * _BLOCK,))
    out = np.asarray(self.call(x, y, x.size))
    np.testing.assert_array_equal(out, x * np.float32(3) + y)
    self.assertEqual(vector_launch.decisions_of(scaled_add_kernel.fn),
                     {vector_launch.VECTORISED})

  def test_a_wrong_value_names_kernel_output_and_first_index(self):
    grid = 12
    x, y = self.random((grid * _BLOCK,)), self.random((grid * _BLOCK,))
    program = int(self.np_rng.integers(grid))
    lane = int(self.np_rng.integers(_BLOCK))
    with _planted_store(program, lane):
      with self.assertRaises(_errors.VectorisedMismatchError) as e:
        jax.block_until_ready(self.call(x, y, x.size))
    message = str(e.exception)
    index = program * _BLOCK + lane
    self.assertIn("kernel 'scaled_add_kernel' (JT_DIST_VECTORIZE=check)",
                  message)
    self.assertIn("what 'out_ptr' (output 0) holds differs", message)
    self.assertIn(f"first at element index ({index},)", message)
    want = x[index] * np.float32(3) + y[index]
    self.assertIn(f"{want + np.float32(1)} vectorised, {want} one program"
                  " at a time (1 element(s) differ)", message)
    self.assertIn("set JT_DIST_VECTORIZE=0 to run it one program at a time",
                  message)

  def test_an_extra_written_element_is_named(self):
    # The planted store writes one masked-off element with the bytes an
    # unwritten output holds (0xFF): the values agree, what is marked as
    # written does not.
    grid, n = 6, 6 * _BLOCK - 5
    x, y = self.random((grid * _BLOCK,)), self.random((grid * _BLOCK,))
    poison = np.frombuffer(b"\xff" * 4, np.float32)[0]
    with _planted_store(grid - 1, _BLOCK - 2, value=poison, extra=True):
      with self.assertRaises(_errors.VectorisedMismatchError) as e:
        jax.block_until_ready(self.call(x, y, n))
    message = str(e.exception)
    self.assertIn("what 'out_ptr' (output 0) marks as written differs",
                  message)
    self.assertIn(f"first at element index ({grid * _BLOCK - 2},): written"
                  " vectorised, not written one program at a time", message)

  def test_a_kernel_that_runs_one_program_at_a_time_is_not_compared(self):
    x = self.random((5 * _BLOCK,))
    out = np.asarray(jt_dist.triton_call(
        x, kernel=diverging_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32), grid=(5,),
        BLOCK=_BLOCK))
    want = x.reshape(5, _BLOCK) * (2.0 ** np.arange(1, 6))[:, None]
    np.testing.assert_array_equal(out, want.reshape(-1).astype(np.float32))
    self.assertEqual(vector_launch.decisions_of(diverging_kernel.fn),
                     {vector_launch.ONE_AT_A_TIME})


if __name__ == "__main__":
  absltest.main()
