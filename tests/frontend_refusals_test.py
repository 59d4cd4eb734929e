"""What Triton's compiler refuses, the CPU refuses, before any launch.

Each kernel below is refused by Triton's code generator for every GPU; on
the CPU, Triton's interpreter would run it. jt_dist lowers each kernel's
specialization to TTIR first, so the call fails on the CPU with the error
compiling gives, when it is lowered.
"""

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import triton
import triton.language as tl
from triton.compiler import errors as triton_errors

from jt_dist import testing

testing.configure_cpu_devices()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

SCALE = 2.0  # Not a tl.constexpr: compiled kernels cannot read it.
CONSTEXPR_SCALE = tl.constexpr(3.0)
_BLOCK = 16


@triton.jit
def global_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offs = tl.arange(0, BLOCK)
  tl.store(out_ptr + offs, tl.load(x_ptr + offs) * SCALE)


@triton.jit
def constexpr_global_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offs = tl.arange(0, BLOCK)
  tl.store(out_ptr + offs, tl.load(x_ptr + offs) * CONSTEXPR_SCALE)


@triton.jit
def list_comprehension_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offs = tl.arange(0, BLOCK)
  rows = [tl.load(x_ptr + offs) for _ in range(2)]
  tl.store(out_ptr + offs, rows[0])


@triton.jit
def dtype_call_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offs = tl.arange(0, BLOCK)
  tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs), tl.float32(0)))


@triton.jit
def loop_local_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offs = tl.arange(0, BLOCK)
  for i in range(2):
    row = tl.load(x_ptr + offs + i)
  tl.store(out_ptr + offs, row)


class FrontendRefusalsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ))
    os.environ.pop("TRITON_ALLOW_NON_CONSTEXPR_GLOBALS", None)
    self.x = jnp.asarray(np.random.default_rng(0).standard_normal(
        2 * _BLOCK, np.float32))

  def _call(self, kernel):
    return jt_dist.triton_call(
        self.x, kernel=kernel, grid=(1,), BLOCK=_BLOCK,
        out_shape=jax.ShapeDtypeStruct((_BLOCK,), jnp.float32))

  @parameterized.named_parameters(
      ("a_non_constexpr_global", global_kernel,
       "Cannot access global variable SCALE"),
      ("a_list_comprehension", list_comprehension_kernel,
       "only tuple comprehensions are supported"),
      ("a_dtype_called_as_a_function", dtype_call_kernel,
       "'dtype' object is not callable"),
      ("a_name_bound_only_in_a_loop", loop_local_kernel,
       "row is not defined"))
  def test_refused_when_lowered(self, kernel, message):
    with self.assertRaisesRegex(triton_errors.CompilationError, message):
      jax.jit(lambda: self._call(kernel)).lower()

  def test_a_constexpr_global_runs(self):
    np.testing.assert_allclose(np.asarray(self._call(constexpr_global_kernel)),
                               np.asarray(self.x[:_BLOCK]) * 3.0)

  def test_triton_s_switch_allows_non_constexpr_globals(self):
    # As compiling does, under TRITON_ALLOW_NON_CONSTEXPR_GLOBALS=1.
    os.environ["TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"] = "1"
    np.testing.assert_allclose(np.asarray(self._call(global_kernel)),
                               np.asarray(self.x[:_BLOCK]) * 2.0)
    # The verdict is the switch's: without it, refused again.
    del os.environ["TRITON_ALLOW_NON_CONSTEXPR_GLOBALS"]
    with self.assertRaisesRegex(triton_errors.CompilationError, "SCALE"):
      jax.jit(lambda: self._call(global_kernel)).lower()


if __name__ == "__main__":
  absltest.main()
