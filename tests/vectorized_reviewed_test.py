"""The vectorised interpreter runs only builder methods reviewed for it.

Every method of Triton's interpreter builder is either redefined for the
program axis, listed as reviewed (it broadcasts over that axis), or refused
(tests/vectorized_interpreter_test.py checks the list): a refused method
raises before it computes anything, and the launch runs one program at a
time, as a kernel that calls it shows.
"""

import contextlib
import io
import os
import re
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

_BLOCK = 16
# How the interpreter says (on the ``jt_dist`` logger, at DEBUG, once per
# kernel and argument signature) that a kernel's launches run.
_DECISION = re.compile(r"jt_dist: kernel (\S+) runs (.+?) on the CPU \(")
ONE_AT_A_TIME = "one program at a time"


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


class UnreviewedOperationTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    # The path taken is the subject: vectorised where it can, whatever the
    # setting the suite runs under.
    self.enter_context(
        mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "1"}))

  def assertRan(self, kernel, how, logs):
    """Asserts every launch of ``kernel`` logged in ``logs`` ran ``how``."""
    decisions = {found[2] for found in map(_DECISION.search, logs.output)
                 if found and found[1] == kernel.fn.__qualname__}
    self.assertEqual(decisions, {how}, logs.output)

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
    self.assertRan(print_after_store_kernel, ONE_AT_A_TIME, logs)
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
    self.assertRan(gather_rows_kernel, ONE_AT_A_TIME, logs)
    self.assertTrue(any("create_descriptor_gather is not reviewed" in line
                        for line in logs.output), logs.output)


if __name__ == "__main__":
  absltest.main()
