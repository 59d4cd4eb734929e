"""``jt_dist.runtime_scalar``: scalar parameters whose values come at run time.

A traced value (a seed computed from a step counter inside ``jax.jit``) or
a new Python value at every eager step reaches a scalar parameter without
compiling anything; ``jax.vmap`` gives each batch element its own value.
Checked on the CPU, and by cross-lowering for CUDA and ROCm, where the value
travels as a one-element buffer that a wrapper kernel loads.
"""

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import dropout_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 32
_BLOCK = 8


@triton.jit
def load_scale_kernel(x_ptr, s_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           * tl.load(s_ptr), mask=mask)


@triton.jit
def constexpr_first_kernel(BLOCK: tl.constexpr, x_ptr, out_ptr, n):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def copy_kernel(x_ptr, out_ptr):
  offsets = tl.arange(0, 8)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


def _like(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _scale(x, s, **options):
  return jt_dist.triton_call(
      x, s, x.size, kernel=scale_kernel, out_shape=_like(x),
      grid=(triton.cdiv(x.size, _BLOCK),), **{"BLOCK": _BLOCK, **options})


def _dropout(x, seed, p=0.5):
  return jt_dist.triton_call(
      kernel=dropout_kernel, out_shape=_like(x),
      grid=(triton.cdiv(x.size, _BLOCK),), x_ptr=x, n=x.size, p=p, seed=seed,
      BLOCK=_BLOCK)


class RuntimeScalarTest(testing.TestCase):

  def _x(self):
    return jnp.asarray(self.random((_N,)))

  @parameterized.parameters(False, True)
  def test_python_float(self, jit):
    x, s = self._x(), float(self.np_rng.uniform(-3, 3))
    f = lambda a, v: _scale(a, jt_dist.runtime_scalar(v))
    self.assertAllClose((jax.jit(f) if jit else f)(x, s), np.asarray(x) * s,
                        rtol=1e-6)

  def test_new_values_compile_nothing(self):
    x = self._x()
    call = jt_dist.kernel_call(scale_kernel, out_shape=_like(x), grid=(4,),
                               n=_N, BLOCK=_BLOCK)
    before = jt_dist.cache_info()
    for s in self.np_rng.uniform(-3, 3, size=4):
      self.assertAllClose(call(x, jt_dist.runtime_scalar(float(s))),
                          np.asarray(x) * np.float32(s), rtol=1e-6)
    self.assertEqual(jt_dist.cache_info().lowerings - before.lowerings, 1)

  def test_seed_from_a_step_counter_under_jit(self):
    x = jnp.asarray(self.random((_N,), low=1.0, high=2.0))
    step = jax.jit(lambda a, count: _dropout(
        a, jt_dist.runtime_scalar(count * 7919 + 17)))
    for count in (3, 4):
      # The same bits as the seed compiled in.
      self.assertAllClose(step(x, count), _dropout(x, count * 7919 + 17))
    self.assertFalse(np.array_equal(step(x, 3) == 0, step(x, 4) == 0))
    self.assertEqual(step._cache_size(), 1)  # pylint: disable=protected-access

  @parameterized.parameters("grid", "sequential")
  def test_vmap_gives_each_element_its_value(self, method):
    x = self._x()
    scales = jnp.asarray(self.random((3,)))
    out = jax.vmap(lambda s: _scale(x, jt_dist.runtime_scalar(s),
                                    vmap_method=method))(scales)
    self.assertAllClose(out, np.asarray(scales)[:, None] * np.asarray(x),
                        rtol=1e-6)

  def test_integer_and_keyword(self):
    x = self._x()
    k = int(self.np_rng.integers(2, 9))
    out = jt_dist.triton_call(
        x, kernel=scale_kernel, out_shape=_like(x), grid=(4,),
        alpha=jt_dist.runtime_scalar(k), n=_N, BLOCK=_BLOCK)
    self.assertAllClose(out, np.asarray(x) * k, rtol=1e-6)

  def test_zero_d_array_and_dtype(self):
    x = self._x()
    s = jnp.asarray(self.random(()))
    self.assertEqual(jt_dist.runtime_scalar(s).dtype, np.float32)
    self.assertEqual(jt_dist.runtime_scalar(3, jnp.float32).dtype,
                     np.float32)
    self.assertAllClose(_scale(x, jt_dist.runtime_scalar(s)),
                        np.asarray(x) * np.asarray(s), rtol=1e-6)

  def test_plain_zero_d_array_still_binds_a_pointer(self):
    x, s = self._x(), jnp.asarray(self.random(()))
    out = jt_dist.triton_call(
        x, s, _N, kernel=load_scale_kernel, out_shape=_like(x), grid=(4,),
        BLOCK=_BLOCK)
    self.assertAllClose(out, np.asarray(x) * np.asarray(s), rtol=1e-6)

  def test_inside_shard_map(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2),
                         axis_types=(AxisType.Auto,))
    x, s = self._x(), float(self.np_rng.uniform(1, 3))

    def body(a, v):
      return jt_dist.triton_call(
          a, jt_dist.runtime_scalar(v), a.size, kernel=scale_kernel,
          out_shape=_like(a), grid=(2,), BLOCK=_BLOCK)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()),
                              out_specs=P("i")))
    self.assertAllClose(f(x, s), np.asarray(x) * s, rtol=1e-6)

  def test_array_with_elements_is_refused(self):
    with self.assertRaises(ValueError) as cm:
      jt_dist.runtime_scalar(jnp.zeros((2,)))
    for part in ("shape (2,)", "0-d array", "x.reshape(())"):
      self.assertIn(part, str(cm.exception))

  def test_int_that_does_not_fit_is_refused(self):
    with self.assertRaises(ValueError) as cm:
      jt_dist.runtime_scalar(2**40, jnp.int32)
    for part in (str(2**40), "int32", "dtype="):
      self.assertIn(part, str(cm.exception))

  def test_non_scalar_is_refused(self):
    with self.assertRaises(TypeError) as cm:
      jt_dist.runtime_scalar("seed")
    for part in ("'seed'", "str", "0-d array"):
      self.assertIn(part, str(cm.exception))

  def test_constexpr_parameter_is_refused(self):
    x = self._x()
    with self.assertRaises(jt_dist.KernelBindingError) as cm:
      jt_dist.triton_call(
          jt_dist.runtime_scalar(_BLOCK), x, kernel=constexpr_first_kernel,
          out_shape=_like(x), grid=(4,), n=_N)
    for part in ("args[0]", "'BLOCK'", "tl.constexpr"):
      self.assertIn(part, str(cm.exception))

  def test_one_past_the_parameters_is_refused_and_the_fix_works(self):
    x = jnp.asarray(self.random((8,)))
    with self.assertRaises(jt_dist.KernelBindingError) as cm:
      jt_dist.triton_call(x, x, jt_dist.runtime_scalar(2.0),
                          kernel=copy_kernel, out_shape=_like(x), grid=1)
    for part in ("3 positional arguments and 1 outputs bind 4 parameters",
                 "2 too many", "If args[1] stands for the output, drop it"):
      self.assertIn(part, str(cm.exception))
    out = jt_dist.triton_call(x, kernel=copy_kernel, out_shape=_like(x),
                              grid=1)
    np.testing.assert_array_equal(out, x)

  def test_constexpr_parameter_by_name_is_refused(self):
    x = self._x()
    with self.assertRaises(jt_dist.KernelBindingError) as cm:
      _scale(x, 2.0, BLOCK=jt_dist.runtime_scalar(_BLOCK))
    for part in ("BLOCK=jt_dist.runtime_scalar(8", "tl.constexpr"):
      self.assertIn(part, str(cm.exception))


class ScalarPointerErrorTest(testing.TestCase):
  """A 0-d array used as a number names the parameter and the fix."""

  @parameterized.parameters(False, True)
  def test_value_times_pointer(self, jitted):
    x, s = jnp.asarray(self.random((_N,))), jnp.asarray(2.0)
    f = jax.jit(_scale) if jitted else _scale
    with self.assertRaisesKernelError(jt_dist.KernelTypeError,
                                      jitted=jitted) as cm:
      jax.block_until_ready(f(x, s))
    for part in ("'scale_kernel'", "parameter 'alpha'", "0-d array",
                 "jt_dist.runtime_scalar(x)"):
      self.assertIn(part, cm.message)

  def test_seed_of_tl_rand(self):
    x = jnp.asarray(self.random((_N,)))
    with self.assertRaisesKernelError(jt_dist.KernelTypeError,
                                      jitted=True) as cm:
      jax.block_until_ready(jax.jit(_dropout)(x, 3))
    for part in ("'dropout_kernel'", "parameter 'seed'",
                 "jt_dist.runtime_scalar(x)"):
      self.assertIn(part, cm.message)

  @unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_cuda_compilation_error(self):
    x = jnp.asarray(self.random((_N,)))
    with self.assertRaises(jt_dist.KernelTypeError) as cm:
      util.lower(lambda a, s: _scale(a, s, compute_capability=90), x, 2.0)
    for part in ("'scale_kernel'", "parameter 'alpha'", "pointer<fp32>",
                 "jt_dist.runtime_scalar(x)"):
      self.assertIn(part, str(cm.exception))


class PerStepScalarTest(testing.TestCase):
  """A positional Python float: compiled in until a second value comes."""

  def test_new_float_values_reuse_one_executable(self):
    testing.clear_memory_caches()
    x = jnp.asarray(self.random((_N,)))
    values = [float(v) for v in self.np_rng.uniform(-3, 3, size=6)]
    for s in values[:2]:  # The first value compiled in; then at run time.
      self.assertAllClose(_scale(x, s), np.asarray(x) * np.float32(s),
                          rtol=1e-6)
    before = jt_dist.cache_info()
    for s in values[2:] + values[:2]:
      self.assertAllClose(_scale(x, s), np.asarray(x) * np.float32(s),
                          rtol=1e-6)
    after = jt_dist.cache_info()
    self.assertEqual(after.triton_call_entries, before.triton_call_entries)
    self.assertEqual(after.lowerings, before.lowerings)

  def test_a_repeated_value_is_lowered_once(self):
    # Compiled in, a value that repeats costs no buffer per call; the
    # second value lowers the call that takes it at run time.
    testing.clear_memory_caches()
    x = jnp.asarray(self.random((_N,)))
    s = float(self.np_rng.uniform(1, 2))
    before = jt_dist.cache_info()
    for _ in range(3):
      self.assertAllClose(_scale(x, s), np.asarray(x) * np.float32(s),
                          rtol=1e-6)
    self.assertEqual(jt_dist.cache_info().lowerings - before.lowerings, 1)
    for t in (s + 1, s + 2, s):
      self.assertAllClose(_scale(x, t), np.asarray(x) * np.float32(t),
                          rtol=1e-6)
    self.assertEqual(jt_dist.cache_info().lowerings - before.lowerings, 2)


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class RuntimeScalarCudaLoweringTest(util.IsolatedCacheMixin,
                                    testing.TestCase):

  def test_value_travels_as_a_buffer(self):
    x = jnp.asarray(self.random((_N,)))
    lowered = util.lower(lambda a, s: _scale(
        a, jt_dist.runtime_scalar(s), compute_capability=90), x, 2.5)
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "scale_kernel")
    self.assertEqual([p[0] for p in kernel["params"]],
                     ["array", "array", "i32", "array"])
    self.assertIn("tensor<f32>", lowered.as_text())

  def test_export(self):
    x = jnp.asarray(self.random((_N,)))
    f = lambda a, s: _dropout(a, jt_dist.runtime_scalar(s))
    with jt_dist.export_options(compute_capability=90):
      exported = jax.export.export(
          jax.jit(f), platforms=("cuda",),
          disabled_checks=jt_dist.export_safety_checks())(x, np.int32(7))
    (call,) = util.exported_triton_custom_calls(
        jax.export.deserialize(exported.serialize()))
    self.assertEqual([p[0] for p in call["calls"][0]["params"]],
                     ["array", "i32", "f32", "array", "array"])


@unittest.skipUnless(util.HAS_ROCM_TRITON_CALL, util.ROCM_SKIP_REASON)
class RuntimeScalarRocmLoweringTest(util.IsolatedCacheMixin,
                                    testing.TestCase):

  def test_value_travels_as_a_buffer(self):
    x = jnp.asarray(self.random((_N,)))
    (call,) = util.triton_custom_calls(util.lower(
        lambda a, s: _scale(a, jt_dist.runtime_scalar(s),
                            compute_capability="gfx942"), x, 2.5,
        platform="rocm"))
    self.assertEqual([p[0] for p in call["calls"][0]["params"]],
                     ["array", "array", "i32", "array"])


if __name__ == "__main__":
  absltest.main()
