"""The vectorised interpreter runs only builder methods reviewed for it.

Every method of Triton's interpreter builder is either redefined for the
program axis, listed as reviewed (it broadcasts over that axis), or refused:
a refused method raises before it computes anything, and the launch runs
one program at a time, as a kernel that calls it shows.
"""

import contextlib
import inspect
import io

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
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_builder  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_launch  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_reviewed  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


@triton.jit
def print_after_store_kernel(in_ptr, io_ptr, BLOCK: tl.constexpr):
  """Writes, then prints (``in_ptr`` aliases ``io_ptr``)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets) * 2.0 + 1.0)
  tl.device_print("pid", tl.program_id(0))


@triton.jit
def gather_rows_kernel(x_ptr, rows_ptr, out_ptr, M: tl.constexpr,
                       N: tl.constexpr, R: tl.constexpr):
  desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1],
                                   block_shape=[1, N])
  base = tl.program_id(0) * R
  rows = tl.load(rows_ptr + base + tl.arange(0, R))
  block = desc.gather(rows, 0)
  tl.store(out_ptr + (base + tl.arange(0, R))[:, None] * N
           + tl.arange(0, N)[None, :], block)


def _upstream_methods() -> list[str]:
  return [name for name, value in inspect.getmembers(
      interpreter.InterpreterBuilder)
          if not name.startswith("_") and callable(value)]


class ReviewedListTest(testing.TestCase):

  def test_every_builder_method_is_redefined_reviewed_or_refused(self):
    grid = (3, 1, 1)
    builder = vector_builder.VectorBuilder(grid, range(3))
    upstream = interpreter.InterpreterBuilder
    for name in _upstream_methods():
      ours = inspect.getattr_static(vector_builder.VectorBuilder, name)
      if name in vars(vector_builder.VectorBuilder) and (
          name not in vector_builder.UNREVIEWED):
        self.assertNotIn(name, vector_reviewed.REVIEWED,
                         f"{name} is redefined: the list need not name it")
      elif name in vector_reviewed.REVIEWED:
        self.assertIs(ours, inspect.getattr_static(upstream, name), name)
      else:
        self.assertIn(name, vector_builder.UNREVIEWED)
        with self.assertRaisesRegex(
            vector_builder.Unsupported,
            f"^{name} is not reviewed for a leading program axis"
            r" \(vector_reviewed\.REVIEWED\)$"):
          getattr(builder, name)()

  def test_a_method_a_later_triton_adds_is_refused_before_it_runs(self):
    calls = []

    class NewerBuilder(interpreter.InterpreterBuilder):
      """A builder with an operation along the first axis, as upstream's."""

      def create_first_axis_sum(self, arg):
        calls.append(arg)
        return interpreter.TensorHandle(np.sum(arg.data, axis=0),
                                        arg.dtype.scalar)

    class NewerVectorBuilder(vector_builder.VectorBuilder, NewerBuilder):
      pass

    refused = vector_reviewed.refuse_unreviewed(NewerVectorBuilder,
                                                NewerBuilder)
    self.assertEqual(refused, ["create_first_axis_sum"])
    builder = NewerVectorBuilder((4, 1, 1), range(4))
    block = interpreter.TensorHandle(self.random((4, 8)), tl.float32)
    with self.assertRaisesRegex(vector_builder.Unsupported,
                                "^create_first_axis_sum is not reviewed"):
      builder.create_first_axis_sum(block)
    self.assertEqual(calls, [])
    # The builder's own forms stay (a program id per program).
    np.testing.assert_array_equal(builder.create_get_program_id(0).data,
                                  np.arange(4))


class UnreviewedOperationTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    if vector_launch.mode() != vector_launch.VECTORISED:
      self.skipTest(f"{_settings.VECTORIZE} runs launches"
                    f" {vector_launch.mode()}: the path taken is the subject")

  def test_print_runs_one_program_at_a_time_and_writes_once(self):
    grid = 5
    io_in = self.random((grid * _BLOCK,))
    printed = io.StringIO()
    with self.assertLogs("jt_dist", "DEBUG") as logs, \
        contextlib.redirect_stdout(printed):
      out = np.asarray(jt_dist.triton_call(
          io_in, kernel=print_after_store_kernel,
          out_shape=jax.ShapeDtypeStruct(io_in.shape, jnp.float32),
          grid=(grid,), input_output_aliases={0: 0}, BLOCK=_BLOCK))
    np.testing.assert_array_equal(out, io_in * np.float32(2) + 1)
    # One line per program, in order: nothing printed for all at once.
    lines = printed.getvalue().splitlines()
    self.assertEqual([line.split(")")[0] + ")" for line in lines],
                     [f"({pid}, 0, 0)" for pid in range(grid)])
    self.assertEqual(
        vector_launch.decisions_of(print_after_store_kernel.fn),
        {vector_launch.ONE_AT_A_TIME})
    self.assertTrue(any(
        "print_after_store_kernel runs one program at a time" in line
        and "create_print is not reviewed" in line for line in logs.output),
                    logs.output)

  def test_descriptor_gather_runs_one_program_at_a_time(self):
    if not hasattr(tl, "make_tensor_descriptor"):
      self.skipTest(f"Triton {triton.__version__} has no tensor descriptors")
    m, n, r, grid = 32, 16, 8, 4
    x = self.random((m, n))
    rows = self.np_rng.integers(0, m, size=(grid * r,)).astype(np.int32)
    with self.assertLogs("jt_dist", "DEBUG") as logs:
      out = np.asarray(jt_dist.triton_call(
          x, rows, kernel=gather_rows_kernel,
          out_shape=jax.ShapeDtypeStruct((grid * r, n), jnp.float32),
          grid=(grid,), M=m, N=n, R=r))
    np.testing.assert_array_equal(out, x[rows])
    self.assertEqual(vector_launch.decisions_of(gather_rows_kernel.fn),
                     {vector_launch.ONE_AT_A_TIME})
    self.assertTrue(any("create_descriptor_gather is not reviewed" in line
                        for line in logs.output), logs.output)


if __name__ == "__main__":
  absltest.main()
