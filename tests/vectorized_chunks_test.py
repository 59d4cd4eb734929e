"""A vectorised launch runs its grid in chunks, in program order.

Each test shrinks the working-memory bound so that a modest grid takes many
chunks, and compares the outputs bit for bit with the same launch in one
chunk and one program at a time: atomics across chunks keep the programs'
order, and a chunk that cannot run as one is undone before its programs
run one at a time.
"""

import contextlib
import os
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_builder  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_launch  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


@triton.jit
def atomics_kernel(x_ptr, w_ptr, n, counter_ptr, slots_ptr, hist_ptr,
                   first_ptr, acc_ptr, BLOCK: tl.constexpr):
  """Atomics whose results depend on the programs' order."""
  pid = tl.program_id(0)
  offsets = pid * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0)
  # A ticket per program: one address shared by all programs.
  tl.store(slots_ptr + pid, tl.atomic_add(counter_ptr, 1))
  tl.atomic_max(counter_ptr + 1, tl.max(x, 0))
  # Lanes of one program meet at the same bins.
  bins = x & 15
  tl.atomic_add(hist_ptr + bins, 1, mask=mask)
  tl.atomic_cas(first_ptr + bins, tl.full((BLOCK,), -1, tl.int32),
                tl.where(mask, pid, -1))
  # Float sums into one shared row, rounded in the programs' order.
  rows = tl.arange(0, BLOCK)
  w = tl.load(w_ptr + offsets, mask=mask, other=0.0)
  tl.atomic_add(acc_ptr + rows, w * (pid + 1).to(tl.float32))


@triton.jit
def branch_after_store_kernel(in_ptr, io_ptr, flags_ptr, BLOCK: tl.constexpr):
  """Writes, then loops on the program (``in_ptr`` aliases ``io_ptr``).

  The first chunk (one program) runs vectorised; the second diverges (a
  ``while`` loop never runs in lockstep), so its writes must be undone
  before its programs run one at a time.
  """
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets) * 2.0 + 1.0)
  tl.atomic_add(flags_ptr, 1)
  hit = (tl.program_id(0) % 3 == 1).to(tl.int32)
  while hit > 0:
    tl.atomic_add(flags_ptr + 1, 1)
    hit -= 1


@triton.jit
def salted_add_kernel(x_ptr, y_ptr, n, out_ptr, SALT: tl.constexpr,
                      BLOCK: tl.constexpr):
  """Adds; ``SALT`` only makes each test's launch a kernel never run before."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


def _spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


def _outputs(outputs):
  return jax.tree.map(np.asarray, outputs)


class ChunkedLaunchTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    if vector_launch.mode() != vector_launch.VECTORISED:
      self.skipTest(f"{_settings.VECTORIZE} runs launches"
                    f" {vector_launch.mode()}; these tests count the chunks of"
                    " the vectorised path")

  @contextlib.contextmanager
  def chunks_under(self, bound):
    """Yields the list of chunks that launches run under ``bound``."""
    original = vector_builder.VectorBuilder.set_programs
    chunks = []

    def set_programs(builder, programs):
      if programs:  # Not the empty range a builder starts with.
        chunks.append(programs)
      return original(builder, programs)

    with mock.patch.object(vector_launch, "WORKING_MEMORY_BOUND", bound), \
        mock.patch.object(vector_builder.VectorBuilder, "set_programs",
                          set_programs):
      yield chunks

  def assertSame(self, actual, expected):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
      np.testing.assert_array_equal(a, e, err_msg=f"seed {self.seed}")

  def assertInOrder(self, chunks, programs):
    self.assertEqual([c.start for c in chunks],
                     [0] + [c.stop for c in chunks[:-1]])
    self.assertEqual(chunks[-1].stop, programs)

  def test_atomics_across_chunks_keep_the_programs_order(self):
    grid = 173
    n = grid * _BLOCK - 5
    x = self.np_rng.integers(-500, 500, size=(n,)).astype(np.int32)
    w = self.random((n,))

    first = jnp.full((16,), -1, jnp.int32)

    def call():
      return jt_dist.triton_call(
          x, w, n, first, kernel=_with_first_input,
          out_shape=(_spec((2,), jnp.int32), _spec((grid,), jnp.int32),
                     _spec((16,), jnp.int32), _spec((16,), jnp.int32),
                     _spec((_BLOCK,))),
          grid=(grid,), zeroed_outputs=[0, 2, 4],
          input_output_aliases={2: 3}, BLOCK=_BLOCK)

    with self.chunks_under(64 << 10) as chunks:
      chunked = _outputs(call())
    with self.chunks_under(1 << 40) as whole_chunks:
      whole = _outputs(call())
    with mock.patch.dict(os.environ, {_settings.VECTORIZE: "0"}):
      stock = _outputs(call())
    self.assertGreater(len(chunks), 4)
    self.assertInOrder(chunks, grid)
    self.assertLen(whole_chunks, 1)
    self.assertSame(chunked, stock)
    self.assertSame(whole, stock)
    np.testing.assert_array_equal(chunked[1], np.arange(grid))
    np.testing.assert_array_equal(chunked[2],
                                  np.bincount(x & 15, minlength=16))

  def test_a_chunk_that_diverges_is_undone_and_run_one_at_a_time(self):
    grid = 12
    io = self.random((grid * _BLOCK,))

    def call():
      return jt_dist.triton_call(
          io, kernel=branch_after_store_kernel,
          out_shape=(_spec(io.shape), _spec((2,), jnp.int32)), grid=(grid,),
          input_output_aliases={0: 0}, zeroed_outputs=[1], BLOCK=_BLOCK)

    with self.chunks_under(1 << 40) as chunks:
      outputs = _outputs(call())
    with mock.patch.dict(os.environ, {_settings.VECTORIZE: "0"}):
      stock = _outputs(call())
    self.assertSame(outputs, stock)
    # Each element doubled once, each program counted once.
    np.testing.assert_array_equal(outputs[0], io * np.float32(2) + 1)
    np.testing.assert_array_equal(outputs[1], [grid, grid // 3])
    self.assertEqual(chunks[:2], [range(0, 1), range(1, grid)])
    self.assertEqual(vector_launch.decisions_of(branch_after_store_kernel.fn),
                     {vector_launch.ONE_AT_A_TIME})

  def test_a_fault_in_a_later_chunk_names_the_same_program(self):
    # A kernel first launched runs its first program alone, so the fault
    # (program 4 reads past 64 elements) is met in the second chunk.
    salt = int(self.np_rng.integers(1 << 30))
    x, y = self.random((64,)), self.random((64,))

    def call():
      return jt_dist.triton_call(
          x, y, 64 + 9, kernel=salted_add_kernel, out_shape=_spec((64,)),
          grid=(5,), SALT=salt, BLOCK=_BLOCK)

    messages = []
    # The checker on whatever the environment says: its report is the
    # subject.
    with mock.patch.dict(os.environ, {_settings.BOUNDS_CHECK: "1"}):
      for one_at_a_time in (False, True):
        one = {_settings.VECTORIZE: "0"} if one_at_a_time else {}
        with mock.patch.dict(os.environ, one), \
            self.chunks_under(1 << 40) as chunks:
          with self.assertRaises(jt_dist.OutOfBoundsAccessError) as e:
            jax.block_until_ready(call())
        messages.append(str(e.exception))
        if not one_at_a_time:
          vectorised_chunks = list(chunks)
    self.assertIn("kernel 'salted_add_kernel', program id (4, 0, 0)",
                  messages[0])
    self.assertEqual(messages[0], messages[1])
    self.assertEqual(vectorised_chunks, [range(0, 1), range(1, 5)])


@triton.jit
def _with_first_input(x_ptr, w_ptr, n, first_in_ptr, counter_ptr, slots_ptr,
                      hist_ptr, first_ptr, acc_ptr, BLOCK: tl.constexpr):
  # first_in_ptr is aliased to first_ptr (it starts at -1).
  atomics_kernel(x_ptr, w_ptr, n, counter_ptr, slots_ptr, hist_ptr,
                 first_ptr, acc_ptr, BLOCK)


if __name__ == "__main__":
  absltest.main()
