"""``jt_dist.kernel_errors`` gives back a kernel's own exception out of
compiled code: under the caller's ``jax.jit``, over a mesh, as a context
manager and as a decorator, on either of the CPU's routes into the
interpreter; other errors pass through it unchanged."""

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
from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top,wrong-import-position
import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import ffi_target  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 8


@triton.jit
def shifted_copy_kernel(x_ptr, out_ptr, SHIFT: tl.constexpr,
                        BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets + SHIFT))


@triton.jit
def checked_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  tl.device_assert(x >= 0, "negative input")
  tl.store(out_ptr + offsets, x)


def _copy(x, shift):
  return jt_dist.triton_call(x, kernel=shifted_copy_kernel, out_shape=x,
                             grid=(x.size // _BLOCK,), SHIFT=shift,
                             BLOCK=_BLOCK)


class KernelErrorsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    self.x = jnp.asarray(np.random.default_rng(0).standard_normal(
        4 * _BLOCK).astype(np.float32))

  @parameterized.parameters(True, False)
  def test_a_fault_under_jit_is_raised_as_its_own_type(self, own_target):
    # Registered, jt_dist's custom call; else JAX's buffer callback.
    self.enter_context(mock.patch.object(
        ffi_target, "ensure_registered", return_value=own_target))
    step = jax.jit(lambda x: 2 * _copy(x, 1))
    with self.assertRaisesRegex(
        jt_dist.OutOfBoundsAccessError,
        r"^kernel 'shifted_copy_kernel', program id \(3, 0, 0\): load"):
      with jt_dist.kernel_errors():
        jax.block_until_ready(step(self.x))

  def test_without_the_boundary_the_first_line_is_the_kernels(self):
    step = jax.jit(lambda x: 2 * _copy(x, 2))
    with self.assertRaises(jax.errors.JaxRuntimeError) as raised:
      jax.block_until_ready(step(self.x))
    first = str(raised.exception).splitlines()[0]
    self.assertRegex(first, r"^[A-Z_]+: jt_dist\.OutOfBoundsAccessError:"
                     r" kernel 'shifted_copy_kernel', program id")

  def test_as_a_decorator_over_a_mesh(self):
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.tile(self.x, 2),
                       jax.sharding.NamedSharding(mesh, P("x")))

    @jt_dist.kernel_errors()
    def run():
      step = jax.jit(jax.shard_map(lambda a: _copy(a, 1), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x")))
      return jax.block_until_ready(step(x))

    with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError,
                                "shifted_copy_kernel"):
      run()

  def test_a_device_assert_under_jit(self):
    step = jax.jit(lambda x: jt_dist.triton_call(
        x, kernel=checked_kernel, out_shape=x, grid=(x.size // _BLOCK,),
        BLOCK=_BLOCK, debug=True))
    with self.assertRaisesRegex(jt_dist.KernelAssertionError,
                                "negative input"):
      with jt_dist.kernel_errors():
        jax.block_until_ready(step(self.x))

  def test_a_correct_program_and_other_errors_pass_through(self):
    with jt_dist.kernel_errors():
      out = jax.jit(lambda x: _copy(x, 0))(self.x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(self.x))
    with self.assertRaisesRegex(ValueError, "not a kernel's"):
      with jt_dist.kernel_errors():
        raise ValueError("not a kernel's")


if __name__ == "__main__":
  absltest.main()
