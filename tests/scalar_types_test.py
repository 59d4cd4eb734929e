"""Scalars are typed as Triton's launcher types them, and NumPy scalars work.

Integer and float scalar arguments take the type Triton's own launcher
(``triton.runtime.jit.mangle_type``) gives them, at every edge of the
integer and float32 ranges, on the CPU (the value the kernel reads) and in
a cross-lowered CUDA call (the kernel's signature and the custom call's
parameter). NumPy scalars bind metaparams, autotuning configs, heuristics
and grids as the Python scalars of the same value.
"""

from __future__ import annotations

import re
import unittest
from unittest import mock
import warnings

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
from jt_dist import _compat  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import types as _types  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._gpu import lowering as _gpu_lowering  # pylint: disable=g-import-not-at-top,wrong-import-position
import cache_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position

# Every edge of Triton's integer typing, and values on either side of it.
_INT_EDGES = (0, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63,
              2**64 - 1, -(2**31), -(2**31) - 1, -(2**63))
_FLOAT_EDGES = (0.0, 1.5, -2.5, 3.4e38, 3.5e38, 1e300, -1e300, 1e-300,
                float("inf"), float("nan"))
_NUMPY_INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
               np.uint32, np.uint64)
# jaxlib's TritonKernelCall parameter fields, by protobuf field number.
_PROTO_SCALAR_FIELDS = {4: "u32", 5: "i64", 6: "u64", 8: "fp64"}
# Triton's scalar types as they appear in TTIR signatures.
_MLIR_TYPES = {"i1": "i1", "i32": "i32", "u32": "i32", "i64": "i64",
               "u64": "i64", "fp32": "f32", "fp64": "f64"}


# The outputs are pairs of 32-bit words written as one 64-bit value, so that
# the tests need no jax_enable_x64.
def _with_ttir():
  """Lowerings inside the block carry each kernel's TTIR, for tests to read."""
  return mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(ttir=True))


@triton.jit
def store_int_kernel(n, out_ptr, times4_ptr):
  # Stored as they are: the store converts them to int64 as the kernel's
  # type says (sign-extending an i32), and writes all 8 bytes.
  tl.store(out_ptr.to(tl.pointer_type(tl.int64)), n)
  tl.store(times4_ptr.to(tl.pointer_type(tl.int64)), n * 4)


@triton.jit
def store_float_kernel(alpha, out_ptr):
  tl.store(out_ptr.to(tl.pointer_type(tl.float64)) + tl.arange(0, 1),
           alpha + tl.zeros((1,), tl.float64))


@triton.jit
def store_double_kernel(alpha: tl.float64, out_ptr):
  tl.store(out_ptr.to(tl.pointer_type(tl.float64)) + tl.arange(0, 1),
           alpha + tl.zeros((1,), tl.float64))


@triton.jit
def store_annotated_kernel(n: tl.int64, alpha: tl.float32, out_ptr, f_ptr):
  tl.store(out_ptr.to(tl.pointer_type(tl.int64)), n * 2**31)
  tl.store(f_ptr.to(tl.pointer_type(tl.float64)), alpha.to(tl.float64))


@triton.jit
def scale_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr, NEGATE: tl.constexpr,
                 SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask) * SCALE
  if NEGATE:
    x = -x
  tl.store(out_ptr + offsets, x, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": np.int64(32)}),
                          triton.Config({"BLOCK": np.int32(64)})], key=["n"])
@triton.jit
def tuned_scale_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr,
                       NEGATE: tl.constexpr, SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask) * SCALE
  if NEGATE:
    x = -x
  tl.store(out_ptr + offsets, x, mask=mask)


@triton.heuristics({"BLOCK": lambda args: np.int64(32),
                    "NEGATE": lambda args: np.bool_(args["n"] > 0)})
@triton.jit
def heuristic_scale_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr,
                           NEGATE: tl.constexpr, SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask) * SCALE
  if NEGATE:
    x = -x
  tl.store(out_ptr + offsets, x, mask=mask)


def _int_cases():
  cases = [(f"int_{v}", v) for v in _INT_EDGES]
  for t in _NUMPY_INTS:
    info = np.iinfo(t)
    for v in _INT_EDGES:
      if info.min <= v <= info.max:
        cases.append((f"{t.__name__}_{v}", t(v)))
  return cases


_WORDS = jax.ShapeDtypeStruct((2,), jnp.uint32)


def _int64_of(words, dtype=np.int64) -> int:
  return int(np.asarray(words).view(dtype)[0])


def _float64_of(words) -> float:
  return float(np.asarray(words).view(np.float64)[0])


def _store_int(n):
  return jt_dist.triton_call(n, kernel=store_int_kernel,
                             out_shape=[_WORDS, _WORDS], grid=(1,))


def _store_float(value, kernel=store_float_kernel):
  (words,) = jt_dist.triton_call(value, kernel=kernel, out_shape=[_WORDS],
                                 grid=(1,))
  return _float64_of(words)


class LauncherTypingTest(testing.TestCase):
  """``_types.scalar_type`` agrees with Triton's launcher at every edge."""

  @parameterized.named_parameters(*_int_cases())
  def test_ints_typed_as_triton(self, value):
    # Triton's launcher refuses NumPy ints; it types the Python int alike.
    self.assertEqual(_types.scalar_type(value),
                     _compat.triton_launcher_scalar_type(int(value)))

  @parameterized.parameters(*_FLOAT_EDGES)
  def test_floats_typed_as_jax_triton_04(self, value):
    # fp32 where float32 holds the value (Triton's launcher's type), else
    # fp64 (jax-triton 0.4), never an overflow to inf or an underflow to 0.
    f32 = np.finfo(np.float32)
    magnitude = abs(float(value))  # A Python float: no float32 overflow.
    held = (value == 0 or value != value or magnitude == float("inf")
            or float(f32.tiny) <= magnitude <= float(f32.max))
    expected = "fp32" if held else "fp64"
    if held:
      self.assertEqual(expected, _compat.triton_launcher_scalar_type(value))
    self.assertEqual(_types.scalar_type(value), expected)
    self.assertEqual(_types.scalar_type(np.float64(value)), expected)
    if abs(value) < 3.4e38 or value != value:
      self.assertEqual(_types.scalar_type(np.float32(value)), "fp32")

  @parameterized.parameters(True, False)
  def test_bools_typed_as_triton(self, value):
    expected = _compat.triton_launcher_scalar_type(value)
    self.assertEqual(_types.scalar_type(value), expected)
    self.assertEqual(_types.scalar_type(np.bool_(value)), expected)

  def test_huge_floats_type_without_warnings(self):
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      for value in (1e300, -1e300, np.float64(1e300), 1e-300):
        self.assertEqual(_types.scalar_type(value), "fp64")
      for value in (float("inf"), np.float32(3e38)):
        self.assertEqual(_types.scalar_type(value), "fp32")
        _types.overflows_float32(value)


class CpuScalarValuesTest(testing.TestCase):
  """The value a kernel reads is the value passed, as its launcher type."""

  def setUp(self):
    super().setUp()
    if testing.platform() != "cpu":
      self.skipTest("checks the CPU interpreter's scalars; the GPU's are"
                    " checked through CudaSignatureTest")

  @parameterized.named_parameters(*_int_cases())
  def test_int_reaches_the_kernel(self, value):
    scalar_type = _types.scalar_type(value)
    as_type = np.uint64 if scalar_type == "u64" else np.int64
    stored, times4 = _store_int(value)
    self.assertEqual(_int64_of(stored, as_type), int(value))
    # n * 4 wraps in the kernel's type: 32 bits wide only for an i32.
    bits = 32 if scalar_type == "i32" else 64
    wrapped = int(value) * 4 % 2**bits
    if scalar_type != "u64" and wrapped >= 2**(bits - 1):
      wrapped -= 2**bits
    self.assertEqual(_int64_of(times4, as_type), wrapped)

  def test_random_ints_above_int32(self):
    for value in self.np_rng.integers(2**31, 2**61, size=3):
      stored, times4 = _store_int(int(value))
      self.assertEqual(_int64_of(stored), int(value))
      self.assertEqual(_int64_of(times4), int(value) * 4)

  @parameterized.parameters(1.5, 3.0e38, -3.4e38, 1e-30)
  def test_float_reaches_the_kernel_as_float32(self, value):
    self.assertEqual(_store_float(value), float(np.float32(value)))

  @parameterized.parameters(1e300, -3.5e38, 2.0**128, 1e-300, -2.5e-45)
  def test_float_beyond_float32_passes_a_double(self, value):
    # jax-triton 0.4: fp64 where float32 would overflow or underflow.
    self.assertEqual(_store_float(value), value)

  def test_fast_path_retypes_a_float_beyond_float32(self):
    # The eager fast path keys a float by its type: a cached fp32 call must
    # not carry a value float32 cannot hold.
    small = float(self.np_rng.uniform(1, 2))
    for value in (small, 1e300, small, -1e-300):
      self.assertEqual(_store_float(value),
                       float(np.float32(value)) if value == small else value)

  @parameterized.parameters(1e300, -3.5e38, 2.0**128)
  def test_float_overflowing_declared_float32_is_refused(self, value):
    n = int(self.np_rng.integers(2, 100))
    with self.assertRaisesRegex(
        ValueError,
        r"args\[1\] = .*parameter 'alpha' of kernel 'store_annotated_kernel'"
        r".*declared fp32.*overflows a float32.*`alpha: tl.float64`"):
      jt_dist.triton_call(
          n, value, kernel=store_annotated_kernel,
          out_shape=[_WORDS, _WORDS], grid=(1,))

  def test_numpy_float32_is_deprecated(self):
    value = float(self.np_rng.uniform(1, 2))
    with self.assertWarnsRegex(
        DeprecationWarning,
        r"args\[0\] = np.float32\(.*parameter 'alpha' of kernel"
        r" 'store_float_kernel'.*deprecated.*Pass a Python float"):
      got = _store_float(np.float32(value))
    self.assertEqual(got, float(np.float32(value)))

  @parameterized.parameters(1e300, -2.5e-300, 0.1)
  def test_float64_annotation_passes_a_double(self, value):
    self.assertEqual(_store_float(value, store_double_kernel), value)


  def test_annotations_type_as_triton_does(self):
    # n: tl.int64 holds a small int in 64 bits; alpha: tl.float32 takes an
    # int as a float.
    n = int(self.np_rng.integers(2, 2**20))
    alpha = int(self.np_rng.integers(2, 2**20))
    stored, scaled = jt_dist.triton_call(
        n, alpha, kernel=store_annotated_kernel, out_shape=[_WORDS, _WORDS],
        grid=(1,))
    self.assertEqual(_int64_of(stored), n * 2**31)
    self.assertEqual(_float64_of(scaled), float(alpha))


def _ttir_type(kernel, name):
  match = re.search(rf"%{name}: (\w+)", kernel["ttir"])
  return match.group(1)


def _param_type(param):
  kind = param[0]
  if kind == "other":
    (field,) = param[1]
    return _PROTO_SCALAR_FIELDS[field]
  return {"i32": "i32", "i64": "i64", "f32": "fp32", "bool": "i1"}[kind]


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaSignatureTest(cache_util.EmptyCacheMixin, testing.TestCase):
  """A cross-lowered CUDA call types scalars as Triton's launcher does."""

  def _lower(self, f):
    with _with_ttir():
      (call,) = util.triton_custom_calls(
          jax.jit(f).trace().lower(lowering_platforms=("cuda",)))
    (kernel,) = call["calls"]
    return kernel

  @parameterized.named_parameters(
      *[c for c in _int_cases() if int(c[1]) not in (0, 1)])
  def test_int_signature(self, value):
    def f():
      return jt_dist.triton_call(value, kernel=store_int_kernel,
                                 out_shape=[_WORDS, _WORDS], grid=(1,),
                                 compute_capability=90)
    kernel = self._lower(f)
    expected = _compat.triton_launcher_scalar_type(int(value))
    self.assertEqual(_ttir_type(kernel, "n"), _MLIR_TYPES[expected])
    self.assertEqual(_param_type(kernel["params"][0]), expected)

  @parameterized.parameters(1.5, 3.0e38, -3.4e38)
  def test_float_signature(self, value):
    def f():
      return jt_dist.triton_call(
          value, kernel=store_float_kernel,
          out_shape=[_WORDS], grid=(1,), compute_capability=90)
    kernel = self._lower(f)
    expected = _compat.triton_launcher_scalar_type(value)
    self.assertEqual(_ttir_type(kernel, "alpha"), _MLIR_TYPES[expected])
    self.assertEqual(_param_type(kernel["params"][0]), expected)

  @parameterized.parameters(1e300, -3.5e38, 1e-300)
  def test_float_beyond_float32_signature(self, value):
    def f():
      return jt_dist.triton_call(
          value, kernel=store_float_kernel,
          out_shape=[_WORDS], grid=(1,), compute_capability=90)
    kernel = self._lower(f)
    self.assertEqual(_ttir_type(kernel, "alpha"), "f64")
    self.assertEqual(_param_type(kernel["params"][0]), "fp64")

  def test_float64_annotation_signature(self):
    def f():
      return jt_dist.triton_call(
          1e300, kernel=store_double_kernel,
          out_shape=[_WORDS], grid=(1,), compute_capability=90)
    kernel = self._lower(f)
    self.assertEqual(_ttir_type(kernel, "alpha"), "f64")
    self.assertEqual(_param_type(kernel["params"][0]), "fp64")

  def test_annotation_signature(self):
    def f():
      return jt_dist.triton_call(
          5, 7, kernel=store_annotated_kernel, out_shape=[_WORDS, _WORDS],
          grid=(1,), compute_capability=90)
    kernel = self._lower(f)
    self.assertEqual(_ttir_type(kernel, "n"), "i64")
    self.assertEqual(_ttir_type(kernel, "alpha"), "f32")
    self.assertEqual([_param_type(p) for p in kernel["params"][:2]],
                     ["i64", "fp32"])

  def test_numpy_metaparams_lower_as_python_ones(self):
    x = jnp.asarray(self.random((200,)))

    def f(block, negate, scale):
      return lambda: jt_dist.triton_call(
          x, x.size, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),),
          BLOCK=block, NEGATE=negate, SCALE=scale, compute_capability=90)

    plain = self._lower(f(64, True, 2.0))
    numpy = self._lower(f(np.int64(64), np.bool_(True), np.float32(2.0)))
    self.assertEqual(numpy["ptx"], plain["ptx"])
    self.assertEqual(numpy["grid"], plain["grid"])


class NumpyScalarsTest(testing.TestCase):
  """NumPy scalars bind wherever Python scalars do."""

  def _expected(self, x, negate, scale):
    return -x * scale if negate else x * scale

  def _call(self, kernel, x, grid=None, **metaparams):
    if grid is None:
      grid = lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),)
    return jt_dist.triton_call(
        x, x.size, kernel=kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
        **metaparams)

  @parameterized.parameters(np.int64, np.int32, np.uint16)
  def test_numpy_int_metaparam(self, int_type):
    x = jnp.asarray(self.random((100,)))
    out = self._call(scale_kernel, x, BLOCK=int_type(32), NEGATE=False,
                     SCALE=2.0)
    self.assertAllClose(out, self._expected(np.asarray(x), False, 2.0))

  @parameterized.parameters(True, False)
  def test_numpy_bool_and_float_metaparams(self, negate):
    x = jnp.asarray(self.random((100,)))
    scale = float(self.np_rng.uniform(0.5, 2.0))
    out = self._call(scale_kernel, x, BLOCK=32, NEGATE=np.bool_(negate),
                     SCALE=np.float32(scale))
    self.assertAllClose(
        out, self._expected(np.asarray(x), negate, np.float32(scale)))

  def test_numpy_metaparams_under_jit(self):
    x = jnp.asarray(self.random((100,)))
    f = jax.jit(lambda a: self._call(scale_kernel, a, BLOCK=np.int64(64),
                                     NEGATE=np.bool_(True), SCALE=3.0))
    self.assertAllClose(f(x), self._expected(np.asarray(x), True, 3.0))

  def test_numpy_autotune_configs(self):
    x = jnp.asarray(self.random((100,)))
    out = self._call(tuned_scale_kernel, x, NEGATE=False, SCALE=2.0)
    self.assertAllClose(out, self._expected(np.asarray(x), False, 2.0))

  def test_numpy_heuristics(self):
    x = jnp.asarray(self.random((100,)))
    out = self._call(heuristic_scale_kernel, x, SCALE=2.0)
    self.assertAllClose(out, self._expected(np.asarray(x), True, 2.0))

  def test_numpy_grid_values(self):
    x = jnp.asarray(self.random((100,)))
    out = self._call(scale_kernel, x,
                     grid=lambda meta: (np.int64(x.size) // meta["BLOCK"] + 1,),
                     BLOCK=np.int32(32), NEGATE=True, SCALE=1.0)
    self.assertAllClose(out, self._expected(np.asarray(x), True, 1.0))


if __name__ == "__main__":
  absltest.main()
