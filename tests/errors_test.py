"""Bad input to ``triton_call`` raises a fitting exception that names it.

Each test asserts the exception type and what the message names: the
argument, the value, the kernel and the parameters involved.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position


@triton.jit
def two_out_kernel(x_ptr, n, a_ptr, b_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(a_ptr + offsets, x, mask=mask)
  tl.store(b_ptr + offsets, x, mask=mask)


@triton.jit
def defaulted_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr,
                     SCALE: tl.constexpr = 2):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * SCALE)


@triton.jit
def out_before_n_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets, mask=offsets < n)
  y = tl.load(y_ptr + offsets, mask=offsets < n)
  tl.store(out_ptr + offsets, x + y, mask=offsets < n)


def _add_python(x_ptr, y_ptr, n, out_ptr, BLOCK):
  del x_ptr, y_ptr, n, out_ptr, BLOCK


class ErrorsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.x = jnp.asarray(self.random((16,)))
    self.y = jnp.asarray(self.random((16,)))
    self.out = jax.ShapeDtypeStruct((16,), jnp.float32)

  def call(self, *args, **kwargs):
    kwargs.setdefault("kernel", add_kernel)
    if "out_type" not in kwargs:
      kwargs.setdefault("out_shape", self.out)
    kwargs.setdefault("grid", 1)
    if kwargs["kernel"] is add_kernel:
      kwargs.setdefault("BLOCK", 16)
    return jt_dist.triton_call(*args, **kwargs)

  # --- kernel ----------------------------------------------------------

  @parameterized.named_parameters(
      ("python_function", _add_python, r"_add_python.*function.*@triton\.jit"),
      ("none", None, r"None.*NoneType.*@triton\.jit"),
      ("string", "add_kernel", r"'add_kernel'.*str.*@triton\.jit"))
  def test_kernel_not_a_triton_kernel(self, kernel, pattern):
    with self.assertRaisesRegex(TypeError, r"`kernel`.*" + pattern):
      self.call(self.x, self.y, 16, kernel=kernel)

  # --- binding ---------------------------------------------------------

  @parameterized.parameters(False, True)
  def test_one_array_too_many_names_it_and_its_parameter(self, n_by_name):
    # The output passed as an input: args[2] takes out_ptr's place.
    args, names = ((self.x, self.y, self.x), {"n": 16}) if n_by_name else (
        (self.x, self.y, self.x, 16), {})
    with self.assertRaises(jt_dist.KernelBindingError) as caught:
      self.call(*args, kernel=out_before_n_kernel, BLOCK=16, **names)
    message = str(caught.exception)
    for part in ("args[2] is an array binding 'out_ptr'", "output 0 binds",
                 "drop it"):
      self.assertIn(part, message)
    self.assertEqual("pass n= by keyword" in message, not n_by_name)
    # The advised fix works.
    out = self.call(self.x, self.y, kernel=out_before_n_kernel, BLOCK=16, n=16)
    self.assertAllClose(out, np.asarray(self.x) + np.asarray(self.y))

  def test_too_many_args(self):
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"'add_kernel'\(x_ptr, y_ptr, n, out_ptr, BLOCK\).*5 positional"
        r" arguments and 1 outputs bind 6 parameters.*only 5.*1 too many"):
      self.call(self.x, self.y, 16, 1, 2)

  def test_too_few_args(self):
    # y is missing: the output shifts onto `n`, which the message shows.
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"'add_kernel'.*\['out_ptr'\] are not bound.*x_ptr=args\[0\],"
        r" y_ptr=args\[1\], n=output 0, BLOCK=by name"):
      self.call(self.x, self.y)

  def test_missing_parameter_named(self):
    with self.assertRaisesRegex(jt_dist.KernelBindingError,
                                r"'add_kernel'.*\['BLOCK'\].*not bound"):
      jt_dist.triton_call(self.x, self.y, 16, kernel=add_kernel,
                          out_shape=self.out, grid=1)

  def test_missing_parameter_beside_a_default(self):
    # The default is no binding the caller gave: the message leaves it out.
    with self.assertRaises(jt_dist.KernelBindingError) as raised:
      jt_dist.triton_call(self.x, kernel=defaulted_kernel,
                          out_shape=self.out, grid=1)
    message = str(raised.exception)
    self.assertRegex(message, r"\['BLOCK'\] are not bound by anything"
                              r" \(bound: x_ptr=args\[0\], out_ptr=output 0\)")
    self.assertNotIn("SCALE=", message)

  def test_is_a_type_error(self):
    self.assertTrue(issubclass(jt_dist.KernelBindingError, TypeError))

  def test_metaparam_typo_suggests_name(self):
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"'add_kernel'.*metaparam BLOKC=16 names no parameter.*"
        r"Did you mean 'BLOCK'\?"):
      jt_dist.triton_call(self.x, self.y, 16, kernel=add_kernel,
                          out_shape=self.out, grid=1, BLOKC=16)

  def test_metaparam_binding_positional_parameter_twice(self):
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError,
        r"'add_kernel'.*metaparam n=16 binds 'n'.*already bind"):
      self.call(self.x, self.y, 16, n=16)

  def test_array_binding_constexpr(self):
    @triton.jit
    def k(x_ptr, BLOCK: tl.constexpr, out_ptr):
      tl.store(out_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)))

    with self.assertRaisesRegex(
        jt_dist.KernelBindingError, r"'k'.*args\[1\].*'BLOCK'.*tl\.constexpr"):
      jt_dist.triton_call(self.x, self.x, kernel=k, out_shape=self.out, grid=1)

  def test_output_binding_constexpr(self):
    with self.assertRaisesRegex(
        jt_dist.KernelBindingError, r"'add_kernel'.*output 1.*'BLOCK'"):
      self.call(self.x, self.y, 16, out_shape=(self.out, self.out))

  # --- dtypes and scalars ---------------------------------------------

  def test_complex_input(self):
    z = jnp.ones((16,), jnp.complex64)
    with self.assertRaisesRegex(
        TypeError, r"args\[0\].*\(16,\).*complex64.*Supported.*float32.*"
        r"jnp\.real"):
      self.call(z, self.y, 16)

  def test_complex_output(self):
    with self.assertRaisesRegex(TypeError, r"out_shape.*complex64"):
      self.call(self.x, self.y, 16,
                out_shape=jax.ShapeDtypeStruct((16,), jnp.complex64))

  @parameterized.parameters(2**64, -(2**63) - 1, 10**30)
  def test_scalar_overflowing_64_bits(self, value):
    with self.assertRaisesRegex(
        ValueError, rf"args\[2\] = {value}.*64 bits"):
      self.call(self.x, self.y, value)

  def test_non_scalar_non_array_argument(self):
    with self.assertRaisesRegex(TypeError, r"args\[2\] = 'sixteen'.*str"):
      self.call(self.x, self.y, "sixteen")

  def test_unhashable_metaparam(self):
    with self.assertRaisesRegex(TypeError, r"metaparam BLOCK=\[16\].*hashable"):
      jt_dist.triton_call(self.x, self.y, 16, kernel=add_kernel,
                          out_shape=self.out, grid=1, BLOCK=[16])

  # --- grid ------------------------------------------------------------

  def test_grid_with_four_dims(self):
    with self.assertRaisesRegex(ValueError,
                                r"`grid`.*1 to 3.*\(1, 2, 3, 4\).*with 4"):
      self.call(self.x, self.y, 16, grid=(1, 2, 3, 4))

  @parameterized.named_parameters(
      ("zero_x", (0,), r"grid\[0\] \(x\).*at least 1.*got 0.*cdiv"),
      ("zero_y", (2, 0), r"grid\[1\] \(y\).*at least 1.*got 0"),
      ("negative", -3, r"grid\[0\] \(x\).*at least 1.*got -3"))
  def test_grid_entry_below_one(self, grid, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      self.call(self.x, self.y, 16, grid=grid)

  @parameterized.named_parameters(
      ("y", (1, 65536), r"grid\[1\] \(y\) = 65536.*limit of 65535"),
      ("z", (1, 1, 70000), r"grid\[2\] \(z\) = 70000.*limit of 65535"),
      ("x", (2**31,), r"grid\[0\] \(x\) = 2147483648.*limit of 2147483647"))
  def test_grid_entry_above_limit(self, grid, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      self.call(self.x, self.y, 16, grid=grid)

  @parameterized.named_parameters(
      ("float", (2.0,), r"grid\[0\] \(x\).*int.*2\.0.*float"),
      ("string", ("4",), r"grid\[0\] \(x\).*int.*'4'.*str"),
      ("bool", (True,), r"grid\[0\] \(x\).*int.*True.*bool"),
      ("callable_float", lambda meta: (meta["n"] / 16,),
       r"grid\[0\] \(x\).*1\.0.*float.*callable must return ints"))
  def test_grid_entry_not_int(self, grid, pattern):
    with self.assertRaisesRegex(TypeError, pattern):
      self.call(self.x, self.y, 16, grid=grid)

  def test_grid_not_a_grid(self):
    with self.assertRaisesRegex(TypeError, r"`grid`.*got 2\.5"):
      self.call(self.x, self.y, 16, grid=2.5)

  def test_grid_numpy_ints_accepted(self):
    out = self.call(self.x, self.y, 16, grid=(np.int64(1),))
    self.assertAllClose(out, np.asarray(self.x) + np.asarray(self.y))

  # --- aliases and zeroed outputs --------------------------------------

  @parameterized.named_parameters(
      ("input_too_big", {2: 0}, r"key 2.*2 array arguments.*0 to 1"),
      ("input_negative", {-1: 0}, r"key -1.*2 array arguments"),
      ("output_too_big", {0: 1}, r"input_output_aliases\[0\] = 1.*1 outputs"))
  def test_alias_index_out_of_range(self, aliases, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      self.call(self.x, self.y, 16, input_output_aliases=aliases)

  def test_alias_shape_mismatch(self):
    with self.assertRaisesRegex(
        ValueError, r"input_output_aliases\[0\] = 0.*shape \(8,\).*float32"
        r".*shape \(16,\).*agree in shape and dtype"):
      self.call(self.x[:8], self.y, 16, input_output_aliases={0: 0})

  def test_alias_dtype_mismatch(self):
    with self.assertRaisesRegex(
        ValueError, r"input_output_aliases\[1\] = 0.*dtype int32.*dtype"
        r" float32"):
      self.call(self.x, self.y.astype(jnp.int32), 16,
                input_output_aliases={1: 0})

  def test_two_inputs_aliasing_one_output(self):
    with self.assertRaisesRegex(ValueError, r"two inputs to one output"):
      self.call(self.x, self.y, 16, input_output_aliases={0: 0, 1: 0})

  @parameterized.named_parameters(
      ("sequence", [2], r"zeroed_outputs entry 2.*2 outputs.*0 to 1"),
      ("negative", [-1], r"zeroed_outputs entry -1.*2 outputs"),
      ("callable", lambda meta: [meta["BLOCK"]],
       r"zeroed_outputs entry 16.*2 outputs"),
      ("not_int", ["a"], r"zeroed_outputs entry 'a'"))
  def test_zeroed_outputs_index_out_of_range(self, zeroed, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      jt_dist.triton_call(self.x, 16, kernel=two_out_kernel,
                          out_shape=(self.out, self.out), grid=1,
                          zeroed_outputs=zeroed, BLOCK=16)

  # --- out_shape -------------------------------------------------------

  @parameterized.named_parameters(
      ("int", 16, r"out_shape is 16 of type int.*ShapeDtypeStruct"),
      ("tuple_entry", (jax.ShapeDtypeStruct((16,), jnp.float32), "f32"),
       r"out_shape\[1\] is 'f32' of type str"),
      ("dict_entry", {"a": (16,)}, r"out_shape\['a'\]\[0\] is 16"))
  def test_out_shape_leaf_without_shape_and_dtype(self, out_shape, pattern):
    with self.assertRaisesRegex(TypeError, pattern):
      self.call(self.x, self.y, 16, out_shape=out_shape)

  def test_out_shape_missing(self):
    with self.assertRaisesRegex(TypeError, r"`out_shape`.*required"):
      jt_dist.triton_call(self.x, self.y, 16, kernel=add_kernel, grid=1,
                          BLOCK=16)

  def test_out_shape_empty(self):
    with self.assertRaisesRegex(ValueError, r"`out_shape` \(\).*no outputs"):
      self.call(self.x, self.y, 16, out_shape=())

  def test_out_shape_and_out_type(self):
    with self.assertRaisesRegex(TypeError, r"out_shape=.*out_type=.*only one"):
      self.call(self.x, self.y, 16, out_shape=self.out, out_type=self.out)

  def test_bad_vmap_method(self):
    with self.assertRaisesRegex(
        ValueError, r"vmap_method='parallel'.*None.*'grid'.*'sequential'"):
      self.call(self.x, self.y, 16, vmap_method="parallel")

  # --- errors inside the kernel ---------------------------------------

  def test_error_inside_kernel_surfaces(self):
    @triton.jit
    def bad_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + undefined_name)  # pylint: disable=undefined-variable  # noqa: F821

    with self.assertRaisesRegex(Exception, r"undefined_name"):
      jax.block_until_ready(jt_dist.triton_call(
          self.x, kernel=bad_kernel, out_shape=self.out, grid=1, BLOCK=16))


if __name__ == "__main__":
  absltest.main()
