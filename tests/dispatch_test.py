"""The eager fast path: bound once per signature, never stale, bounded."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import os
import sys
import textwrap
import threading
import unittest
import weakref
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist._call import api as _api
from jt_dist._core import binding as _binding
from jt_dist._call import memo as _memo
from jt_dist._core import exact as _exact
from jt_dist._core import kernel as _kernel
from jt_dist import testing
import fork_server
import cache_util
import gpu_lowering_util as util
from feature_kernels import scale_kernel

testing.configure_cpu_devices()

_BLOCK = 16
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _times_two(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 2)


def _times_three(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 3)


@triton.jit
def shift_kernel(x_ptr, out_ptr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + SHIFT)


@triton.jit
def narrow_kernel(x_ptr, k: tl.int8, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + k)


@triton.autotune(configs=[triton.Config({"TAG": 16}),
                          triton.Config({"TAG": 32})], key=[])
@triton.jit
def tagged_kernel(x_ptr, out_ptr, TAG: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 0 + TAG)


@triton.jit
def store_scalar_kernel(v, out_ptr):
  tl.store(out_ptr, v)


@triton.jit
def scaled_down_kernel(v, out_ptr):
  tl.store(out_ptr, v / 1e290)


@triton.jit
def int_scaled_down_kernel(v, out_ptr):
  tl.store(out_ptr, (v // 1024).to(tl.int32))


@triton.jit
def offset_kernel(k, x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + k)


@triton.jit
def reciprocal_kernel(s: tl.float32, out_ptr):
  tl.store(out_ptr, 1.0 / s)


@triton.jit
def over_read_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets + 1))


def _scale(x, s, n=None, **options):
  n = x.size if n is None else n
  return jt_dist.triton_call(
      x, s, n, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, _BLOCK),), BLOCK=_BLOCK, **options)


def _programs(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _copy_call(kernel, x, **metaparams):
  return jt_dist.triton_call(
      x, kernel=kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(1,), BLOCK=x.size, **metaparams)


class _Counting:
  """Counts ``_binding.bind_call``: one per miss of the fast path."""

  def __enter__(self):
    self.patch = mock.patch.object(_binding, "bind_call",
                                   wraps=_binding.bind_call)
    self.mock = self.patch.__enter__()
    return self

  def __exit__(self, *exc):
    return self.patch.__exit__(*exc)

  @property
  def binds(self) -> int:
    return self.mock.call_count


class DispatchTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    jax.clear_caches()
    # Each test's calls start unseen: what a call compiles in depends on
    # the values its signature met before.
    testing.clear_memory_caches()

  def _assert_unwritten(self, tail):
    # The CPU poisons outputs (NaN for floats); a GPU leaves whatever was
    # in memory, so only the launched programs' part can be checked there.
    if testing.platform() == "cpu":
      self.assertTrue(np.isnan(tail).all(), tail)

  def test_repeated_call_binds_once(self):
    x = self.random((40,))
    xs = jnp.asarray(x)
    with _Counting() as counting:
      for _ in range(3):
        self.assertAllClose(_scale(xs, 2.5), x * 2.5)
    self.assertEqual(counting.binds, 1)

  def test_float_values_compile_the_first_then_come_at_run_time(self):
    # The first value is compiled in; another makes the call take its
    # floats at run time: one more binding and lowering, then none.
    x = self.random((40,))
    xs = jnp.asarray(x)
    first, *others = (float(s) for s in self.np_rng.uniform(-3, 3, size=6))
    before = jt_dist.cache_info()
    with _Counting() as counting:
      for s in (first, first, *others, first):
        self.assertAllClose(_scale(xs, s), x * np.float32(s))
    self.assertEqual(counting.binds, 2)
    self.assertEqual(jt_dist.cache_info().lowerings - before.lowerings, 2)

  @parameterized.parameters((3, 5, 7), (3, 1, 2), (3, 32, 16), (48, 32, 1))
  def test_int_scalar_values_bind_twice_on_cpu(self, a, b, c):
    # The interpreter specialises on no value (a GPU compiles 1 and
    # multiples of 16 apart, and binds each value: see ScalarRecompileTest).
    if testing.platform() != "cpu":
      self.skipTest("int scalars come at run time on the CPU only")
    x = self.random((64,))
    xs = jnp.asarray(x)
    with _Counting() as counting:
      for n in (a, b, c, a):
        out = np.asarray(_scale(xs, 1.0, n))
        self.assertAllClose(out[:n], x[:n])
    self.assertEqual(counting.binds, 2)

  def test_scalars_by_keyword_and_position_change_between_calls(self):
    # A keyword scalar is keyed by value; a positional one may come at run
    # time: neither may take another call's value.
    x = self.random((64,))
    xs = jnp.asarray(x)
    for s, n in ((2.0, 16), (3.0, 16), (3.0, 48), (2.0, 48), (2.0, 16)):
      for out in (_scale(xs, s, n),
                  jt_dist.triton_call(
                      xs, s, kernel=scale_kernel, out_shape=xs,
                      grid=(4,), n=n, BLOCK=_BLOCK),
                  jt_dist.triton_call(
                      xs, kernel=scale_kernel, out_shape=xs, grid=(4,),
                      alpha=s, n=n, BLOCK=_BLOCK)):
        out = np.asarray(out)
        self.assertAllClose(out[:n], x[:n] * np.float32(s))
        self._assert_unwritten(out[n:])

  @parameterized.parameters(
      ((2**31 - 1, -(2**31), 5), np.int32, 2),
      ((0.1, -3.0e38, 7.5), np.float32, 2),
      ((True, False), np.bool_, 2),
      ((np.int64(-7), np.int64(9), np.int64(3)), np.int32, 2),
      # 64-bit types stay compiled in: each new value binds again.
      ((2**31, 2**31 + 5, 2**31 + 9), np.uint32, 3))
  def test_scalar_values_of_each_type_on_cpu(self, values, dtype, binds):
    if testing.platform() != "cpu":
      self.skipTest("scalars of these types come at run time on the CPU")
    out = jax.ShapeDtypeStruct((1,), dtype)
    with _Counting() as counting:
      for v in (*values, values[0]):
        got = jt_dist.triton_call(v, kernel=store_scalar_kernel,
                                  out_shape=out, grid=(1,))
        self.assertEqual(np.asarray(got)[0], np.asarray(v).astype(dtype))
    self.assertEqual(counting.binds, binds)

  @parameterized.parameters((np.float32,), (np.int32,))
  def test_a_value_beyond_the_run_time_type_is_compiled_in(self, dtype):
    # After a second value the scalars come at run time (fp32, or i32 on
    # the CPU); a value of the same Python type that those do not hold is
    # compiled in (fp64, i64), never squeezed into the run-time type.
    if dtype == np.int32 and testing.platform() != "cpu":
      self.skipTest("ints are compiled in on GPUs")
    if dtype == np.float32:
      kernel, beyond = scaled_down_kernel, 1e300
      first, second = (float(v) for v in self.np_rng.uniform(1, 2, 2))
      expected = lambda v: np.float32(v / 1e290)
    else:
      kernel, beyond = int_scaled_down_kernel, 2**31 + 3 * 1024
      first, second = (int(v) for v in self.np_rng.integers(1, 2**20, 2))
      expected = lambda v: np.int32(v // 1024)
    out = jax.ShapeDtypeStruct((1,), dtype)
    for v in (first, second, beyond, second, beyond):
      got = jt_dist.triton_call(v, kernel=kernel, out_shape=out, grid=(1,))
      self.assertEqual(np.asarray(got)[0], expected(v), v)

  def test_signed_zeros_compiled_in_stay_apart(self):
    # Declared fp32, the scalar is compiled in and keyed by value, though
    # 0.0 == -0.0 in Python.
    out = jax.ShapeDtypeStruct((1,), np.float32)
    for s in (0.0, -0.0, 0.0):
      got = jt_dist.triton_call(s, kernel=reciprocal_kernel, out_shape=out,
                                grid=(1,))
      self.assertEqual(np.asarray(got)[0], np.copysign(np.inf, s))

  def test_signed_zeros_first_compiled_in_then_at_run_time(self):
    # The first value is compiled in, the second comes at run time; the
    # memo tells -0.0 from 0.0 both ways.
    out = jax.ShapeDtypeStruct((1,), np.float32)
    first = float(self.np_rng.choice([-0.0, 0.0]))
    for s in (first, -first, first, -first):
      got = np.asarray(jt_dist.triton_call(
          s, kernel=store_scalar_kernel, out_shape=out, grid=(1,)))
      self.assertEqual(np.signbit(got[0]), np.signbit(s), s)

  def test_a_nan_compiled_in_is_bound_once(self):
    # Each NaN is another object that equals nothing, itself included.
    out = jax.ShapeDtypeStruct((1,), np.float32)
    with _Counting() as counting:
      for _ in range(3):
        got = jt_dist.triton_call(float("nan"), kernel=store_scalar_kernel,
                                  out_shape=out, grid=(1,))
        self.assertTrue(np.isnan(np.asarray(got)[0]))
    self.assertEqual(counting.binds, 1)

  def test_types_of_equal_scalars_are_not_confused(self):
    x = jnp.asarray(self.random((16,)))
    with _Counting() as counting:
      _scale(x, 2)
      _scale(x, 2.0)
      _scale(x, True)
    self.assertEqual(counting.binds, 3)

  def test_arrays_are_not_kept_alive(self):
    x = jnp.asarray(self.random((32,)))
    out = _scale(x, 1.5)
    ref_x, ref_out = weakref.ref(x), weakref.ref(out)
    del x, out
    gc.collect()
    self.assertIsNone(ref_x())
    self.assertIsNone(ref_out())

  def test_kernel_redefined(self):
    x = self.random((16,))
    for i in range(4):
      fn = (_times_two, _times_three)[i % 2]
      kernel = triton.jit(fn)
      self.assertAllClose(_copy_call(kernel, jnp.asarray(x)),
                          x * (2, 3)[i % 2])
      del kernel
      gc.collect()  # A new kernel may take the old one's id().

  def test_kernel_unwrapped_once_however_many_threads(self):
    kernels = (triton.jit(_times_two), triton.jit(_times_three))
    x = self.random((_BLOCK,))
    barrier = threading.Barrier(8)

    def call(i):
      barrier.wait(timeout=120)
      return np.asarray(jt_dist.triton_call(
          jnp.asarray(x), kernel=kernels[i % 2],
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          BLOCK=_BLOCK))

    _kernel.kernel_info.cache_clear()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      results = list(pool.map(call, range(8), timeout=600))
    for i, got in enumerate(results):
      self.assertAllClose(got, x * (2 + i % 2), msg=f"thread {i}")
    # One unwrapped KernelInfo per kernel object, however many threads.
    self.assertEqual(_kernel.kernel_info.cache_info().currsize, len(kernels))

  @parameterized.named_parameters(
      ("arrays_and_metaparams",
       lambda x, i: (_copy_call(shift_kernel, x, SHIFT=3), x + 3)),
      # An unannotated float comes at run time on every platform.
      ("scalars", lambda x, i: (jt_dist.triton_call(
          2.5 + i, kernel=store_scalar_kernel,
          out_shape=jax.ShapeDtypeStruct((), jnp.float32), grid=(1,)),
                                np.float32(2.5 + i))),
      # Ints compiled in (a 64-bit one on the CPU too), after the operand
      # and before it.
      ("fixed_scalars_last", lambda x, i: (_scale(x, 2**33), x * 2.0**33)),
      ("fixed_scalar_first", lambda x, i: (jt_dist.triton_call(
          2**31 + 5, x, kernel=offset_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          BLOCK=x.size), x + np.float32(2**31 + 5))),
      # A float at run time beside an int compiled in.
      ("fixed_and_run_time_scalars", lambda x, i: (jt_dist.triton_call(
          x, 2.5 + i, 2**33, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          BLOCK=x.size), x * np.float32(2.5 + i))),
  )
  def test_repeated_plain_calls_take_no_general_key(self, call):
    x = jnp.asarray(self.random((32,)))
    # As in a fresh process: jax's array class is not known yet.
    fresh = {t for t in _api._OPERAND_TYPES if not issubclass(t, jax.Array)}
    with mock.patch.object(_api, "_OPERAND_TYPES", fresh):
      # The second value of a scalar makes the call that takes it at run
      # time; from then on, no call builds the general key.
      call(x, 0)
      call(x, 1)
      with mock.patch.object(_api, "_template",
                             wraps=_api._template) as template:
        for i in range(2, 5):
          out, expected = call(x, i)
          self.assertAllClose(out, expected)
    self.assertEqual(template.call_count, 0)

  def test_a_value_compiled_in_leaves_the_run_time_call_its_key(self):
    # 1e300 does not fit float32: compiled in, beside the call that takes
    # the other floats at run time, which still builds no general key.
    out = jax.ShapeDtypeStruct((), jnp.float32)
    call = lambda s: jt_dist.triton_call(s, kernel=store_scalar_kernel,
                                         out_shape=out, grid=(1,))
    for s in (2.5, 3.5, 1e300):
      self.assertEqual(float(call(s)), np.inf if s == 1e300 else s)
    with mock.patch.object(_api, "_template",
                           wraps=_api._template) as template:
      for s in (4.5, 5.5):
        self.assertEqual(float(call(s)), s)
    self.assertEqual(template.call_count, 0)

  def test_kernel_source_changed(self):
    x = jnp.asarray(self.random((16,)))
    kernel = triton.jit(_times_two)
    with _Counting() as counting:
      _copy_call(kernel, x)
      _copy_call(kernel, x)
      kernel._unsafe_update_src(kernel.src.replace("* 2", "* 2 + 0"))  # pylint: disable=protected-access
      _copy_call(kernel, x)
    self.assertEqual(counting.binds, 2)

  def test_constexpr_scalar_values_are_exact(self):
    x = self.random((16,)).astype(np.int32)
    for shift in (3, 5, 3, 7):
      out = jt_dist.triton_call(
          jnp.asarray(x), kernel=shift_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          SHIFT=shift, BLOCK=16)
      self.assertAllClose(out, x + shift)

  def test_declared_scalar_range_is_checked_every_call(self):
    x = jnp.asarray(self.random((16,)))
    call = lambda k: jt_dist.triton_call(
        x, k, kernel=narrow_kernel, out_shape=jax.ShapeDtypeStruct(
            x.shape, x.dtype), grid=(1,), BLOCK=16)
    call(5)
    with self.assertRaisesRegex(ValueError, r"args\[1\] = 300.*'k'.*i8"):
      call(300)

  def test_grid_callable_closure_changes(self):
    x = self.random((64,))
    xs = jnp.asarray(x)
    for programs in (1, 4, 2):
      out = np.asarray(jt_dist.triton_call(
          xs, 1.0, 64, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=lambda meta, p=programs: (p,), BLOCK=_BLOCK))
      written = programs * _BLOCK
      self.assertAllClose(out[:written], x[:written])
      self._assert_unwritten(out[written:])

  @parameterized.parameters("method", "keyword_default", "partial")
  def test_grid_callables_of_one_code_are_told_apart(self, kind):
    # Two grids of one code but different objects launch their own grids.
    x = self.random((64,))
    xs = jnp.asarray(x)

    class Grids:

      def __init__(self, programs):
        self.programs = programs

      def grid(self, meta):
        del meta
        return (self.programs,)

    def keyword_default(programs):
      return lambda meta, *, p=programs: (p,)

    def partial(programs):
      return functools.partial(lambda meta, p: (p,), p=programs)

    make = {"method": lambda p: Grids(p).grid,
            "keyword_default": keyword_default, "partial": partial}[kind]
    for programs in (4, 1):
      call = lambda x: jt_dist.triton_call(
          x, 1.0, 64, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=make(programs), BLOCK=_BLOCK)
      for out in (call(xs), jax.jit(call)(xs)):
        out = np.asarray(out)
        written = programs * _BLOCK
        self.assertAllClose(out[:written], x[:written])
        self._assert_unwritten(out[written:])

  @parameterized.parameters(False, True)
  def test_out_shape_arrays_are_not_kept_alive(self, jit):
    x = jnp.asarray(self.random((32,)))
    like = jnp.zeros_like(x)
    seen = []

    def f(x, like):
      seen.append(weakref.ref(like))
      return jt_dist.triton_call(
          x, 1.5, x.size, kernel=scale_kernel, out_shape=like,
          grid=(triton.cdiv(x.size, _BLOCK),), BLOCK=_BLOCK)

    self.assertAllClose((jax.jit(f) if jit else f)(x, like),
                        np.asarray(x) * 1.5)
    del like
    gc.collect()
    # Eagerly the array, under jax.jit its tracer: the memo holds neither.
    self.assertIsNone(seen[0]())

  def test_repeated_call_with_keyword_scalars_binds_once(self):
    x = self.random((64,))
    xs = jnp.asarray(x)
    with _Counting() as counting:
      for _ in range(3):
        out = jt_dist.triton_call(
            xs, kernel=scale_kernel, out_shape=xs, grid=(4,), alpha=2.5,
            n=64, BLOCK=_BLOCK)
        self.assertAllClose(out, x * 2.5)
    self.assertEqual(counting.binds, 1)

  def test_keyword_float_values_lower_at_most_twice(self):
    x = self.random((64,))
    xs = jnp.asarray(x)
    before = jt_dist.cache_info()
    for s in self.np_rng.uniform(-3, 3, size=8):
      out = jt_dist.triton_call(
          xs, kernel=scale_kernel, out_shape=xs, grid=(4,), alpha=float(s),
          n=64, BLOCK=_BLOCK)
      self.assertAllClose(out, x * np.float32(s))
    self.assertLessEqual(jt_dist.cache_info().lowerings - before.lowerings, 2)

  def test_positional_float_values_beside_a_keyword_operand_lower_twice(
      self):
    x = self.random((64,))
    xs = jnp.asarray(x)
    before = jt_dist.cache_info()
    for s in self.np_rng.uniform(-3, 3, size=8):
      out = jt_dist.triton_call(
          float(s), kernel=offset_kernel, out_shape=xs, grid=(1,), x_ptr=xs,
          BLOCK=64)
      self.assertAllClose(out, x + np.float32(s))
    self.assertLessEqual(jt_dist.cache_info().lowerings - before.lowerings, 2)

  def test_grid_callable_sees_new_scalar_values(self):
    x = self.random((64,))
    xs = jnp.asarray(x)
    for n in (16, 48, 32):
      out = np.asarray(jt_dist.triton_call(
          xs, 1.0, n, kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
          BLOCK=_BLOCK))
      self.assertAllClose(out[:n], x[:n])
      self._assert_unwritten(out[n:])

  def test_pin_and_forget_autotune_choice(self):
    x = jnp.asarray(self.random((16,)))
    call = lambda: int(np.asarray(_copy_call(tagged_kernel, x))[0])
    self.addCleanup(jt_dist.pin_autotune_config, tagged_kernel, None)
    self.addCleanup(jt_dist.forget_autotune_choices, tagged_kernel)
    jt_dist.forget_autotune_choices(tagged_kernel)
    chosen = call()  # The first config on the CPU; the fastest on a GPU.
    self.assertIn(chosen, (16, 32))
    other = 48 - chosen
    for tag in (other, chosen, other):
      jt_dist.pin_autotune_config(tagged_kernel, TAG=tag)
      self.assertEqual(call(), tag)
      self.assertEqual(call(), tag)
    jt_dist.pin_autotune_config(tagged_kernel, None)
    jt_dist.forget_autotune_choices(tagged_kernel)
    self.assertIn(call(), (16, 32))

  def test_pin_from_environment(self):
    x = jnp.asarray(self.random((16,)))
    call = lambda: int(np.asarray(_copy_call(tagged_kernel, x))[0])
    jt_dist.forget_autotune_choices(tagged_kernel)
    self.addCleanup(jt_dist.forget_autotune_choices, tagged_kernel)
    other = 48 - call()
    pin = f'{{"tagged_kernel": {{"TAG": {other}}}}}'
    with mock.patch.dict(os.environ, {"JT_DIST_AUTOTUNE_PIN": pin}):
      # The pin is read when a call is lowered: forgetting the choice
      # lowers the kernel's calls again.
      jt_dist.forget_autotune_choices(tagged_kernel)
      self.assertEqual(call(), other)

  def test_bounds_check_flipped(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    x = jnp.asarray(self.random((16,)))
    with mock.patch.dict(os.environ, {"JT_DIST_BOUNDS_CHECK": "1"}):
      with self.assertRaises(jt_dist.OutOfBoundsAccessError):
        _copy_call(over_read_kernel, x)
    with mock.patch.dict(os.environ, {"JT_DIST_BOUNDS_CHECK": "0"}):
      out = np.asarray(_copy_call(over_read_kernel, x))
    self.assertAllClose(out[:15], np.asarray(x)[1:])
    with mock.patch.dict(os.environ, {"JT_DIST_BOUNDS_CHECK": "1"}):
      with self.assertRaises(jt_dist.OutOfBoundsAccessError):
        _copy_call(over_read_kernel, x)

  def test_sync_launches_flipped(self):
    x = jnp.asarray(self.random((16,)))
    waited = []
    real = jax.block_until_ready

    def block(outs):
      waited.append(1)
      return real(outs)

    with mock.patch.object(jax, "block_until_ready", block):
      for value, expected in (("0", 0), ("1", 1), ("0", 1), ("1", 2)):
        # Read when a call is made: a kernel_call made under each value.
        with mock.patch.dict(os.environ, {"JT_DIST_SYNC_LAUNCHES": value}):
          scale = jt_dist.kernel_call(
              scale_kernel, out_shape=x, grid=(1,), alpha=2.0, n=x.size,
              BLOCK=_BLOCK)
        self.assertAllClose(scale(x), np.asarray(x) * 2)
        self.assertLen(waited, expected)

  def test_device_and_sharding_changes(self):
    devices = self.devices(2)
    x = self.random((32,))
    for device in (devices[0], devices[1], devices[0]):
      out = _scale(jax.device_put(x, device), 3.0)
      self.assertEqual(out.devices(), {device})
      self.assertAllClose(out, x * 3)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    sharded = jax.device_put(x, NamedSharding(mesh, P("i")))
    with self.assertRaises(jt_dist.DevicePlacementError):
      _scale(sharded, 3.0)

  def test_device_argument_moves_uncommitted_inputs(self):
    devices = self.devices(2)
    x = self.random((32,))
    for device in (1, 0, 1):
      out = _scale(jnp.asarray(x), 2.0, device=device)
      self.assertEqual(out.devices(), {devices[device]})
      self.assertAllClose(out, x * 2)

  def test_cache_is_bounded(self):
    self.enter_context(testing.isolated_settings())
    jt_dist.configure_cache(dispatch_entries=3)
    refs = []
    for n in range(16, 16 * 9, 16):
      x = self.random((n,))
      self.assertAllClose(_scale(jnp.asarray(x), 2.0), x * 2)
      refs.append(weakref.ref(
          list(_memo.triton_calls._entries.values())[-1]))  # pylint: disable=protected-access
    self.assertLessEqual(jt_dist.cache_info().triton_call_entries, 3)
    gc.collect()
    self.assertGreaterEqual(sum(r() is None for r in refs), len(refs) - 3)

  @parameterized.parameters(0, -2)
  def test_dispatch_entries_below_one(self, value):
    with self.assertRaisesRegex(ValueError, f"dispatch_entries={value}"):
      jt_dist.configure_cache(dispatch_entries=value)

  def test_dispatch_entries_not_int(self):
    with self.assertRaisesRegex(TypeError,
                                "dispatch_entries='8' of type str"):
      jt_dist.configure_cache(dispatch_entries="8")

  def test_bad_input_still_raises_after_a_good_call(self):
    x = jnp.asarray(self.random((16,)))
    _scale(x, 2.0, num_warps=4)
    with self.assertRaisesRegex(TypeError, "num_warps=4.0"):
      _scale(x, 2.0, num_warps=4.0)
    with self.assertRaisesRegex(TypeError, "num_warps=True"):
      _scale(x, 2.0, num_warps=True)

  def test_sharded_triton_call_eager_is_cached(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    x = self.random((64,))
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    with mock.patch.object(jax, "shard_map", wraps=jax.shard_map) as made:
      for s in (2.0, 2.0, 3.0):
        out = jt_dist.sharded_triton_call(
            xs, s, jt_dist.shard_size(0), kernel=scale_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
            mesh=mesh, in_specs=(P("i"),), out_specs=P("i"), BLOCK=_BLOCK)
        self.assertAllClose(out, x * s)
    self.assertEqual(made.call_count, 2)

  @parameterized.named_parameters(
      ("one_device_replicated", 1, P(), "Explicit", 0),
      ("one_device_split_auto", 1, P("i"), "Auto", 0),
      ("one_device_split_explicit", 1, P("i"), "Explicit", 0),
      ("two_devices", 2, P("i"), "Auto", 1))
  def test_sharded_hit_moves_only_operands_not_laid_out(self, size, spec,
                                                        axis_type, puts):
    # On a mesh of the array's own device the operand is laid out already:
    # a hit is one jitted call. Over two devices it must be spread again on
    # every call (the argument is an array on one device).
    mesh = jax.make_mesh((size,), ("i",), devices=self.devices(size),
                         axis_types=(getattr(jax.sharding.AxisType,
                                             axis_type),))
    x = self.random((2 * _BLOCK * size,))  # Two programs per shard.
    xs = jnp.asarray(x)

    def call():
      return jt_dist.sharded_triton_call(
          xs, 2.0, jt_dist.shard_size(0), kernel=scale_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
          mesh=mesh, in_specs=(spec,), out_specs=spec, BLOCK=_BLOCK)

    self.assertAllClose(call(), x * 2)
    with mock.patch.object(jax, "device_put", wraps=jax.device_put) as put:
      for _ in range(2):
        out = call()
        self.assertAllClose(out, x * 2)
    self.assertEqual(put.call_count, 2 * puts)
    self.assertTrue(out.sharding.is_equivalent_to(NamedSharding(mesh, spec),
                                                  1), out.sharding)

  def test_sharding_rule_call_is_cached_and_follows_sharding(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Explicit,))
    rule = jt_dist.ShardingRule("i -> i")
    x = self.random((64,))
    with mock.patch.object(jax, "shard_map", wraps=jax.shard_map) as made:
      for spec in (P("i"), P("i"), P(None)):
        xs = jax.device_put(x, NamedSharding(mesh, spec))
        out = jt_dist.triton_call(
            xs, 2.0, jt_dist.shard_size(0), kernel=scale_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=_programs, sharding_rule=rule, BLOCK=_BLOCK)
        self.assertAllClose(out, x * 2)
    self.assertEqual(made.call_count, 2)

  def test_fast_path_rebinds_on_a_changed_side_effect_or_cost(self):
    x = jnp.asarray(self.random((8,)))
    with mock.patch.object(_binding, "bind_call",
                           wraps=_binding.bind_call) as bind:
      calls = [dict(has_side_effect=False), dict(has_side_effect=True),
               dict(cost_estimate={"flops": 8}),
               dict(cost_estimate={"flops": 9}), dict(has_side_effect=True)]
      for options in calls:
        self.assertAllClose(_scale(x, 2.0, **options), np.asarray(x) * 2)
    seen = [(c.args[4].has_side_effect, c.args[4].cost_estimate)
            for c in bind.call_args_list]
    self.assertEqual(seen, [(False, None), (True, None), (False, {"flops": 8}),
                            (False, {"flops": 9})])

  def test_fast_path_key_follows_backend_options(self):
    x = jnp.asarray(self.random((40,)))
    specs = []
    real = _binding.bind_call

    def bind(*args, **kwargs):
      out = real(*args, **kwargs)
      specs.append(out[1])
      return out

    with mock.patch.object(_binding, "bind_call", bind):
      for options in ({"maxnreg": 64}, {"maxnreg": 64}, {"maxnreg": 128},
                      {"maxnreg": 64}, {"num_warps": 2}):
        self.assertAllClose(_scale(x, 2.0, backend_options=options),
                            np.asarray(x) * 2)
    self.assertEqual([s.backend_options for s in specs],
                     [(("maxnreg", 64),), (("maxnreg", 128),), ()])
    self.assertEqual(specs[-1].launches[0].config.num_warps, 2)


class ExactKeyTest(parameterized.TestCase):
  """``exact.key``, the fast path's key, tells apart what Triton compiles apart."""

  @parameterized.named_parameters(
      ("int_float", 4, 4.0),
      ("bool_int", True, 1),
      ("tuple", (4,), (4.0,)),
      ("nested_tuple", ((1, 2),), ((1, 2.0),)),
      ("list", [4], [4.0]),
      ("signed_zero", 0.0, -0.0),
      ("signed_zero_in_tuple", (0.0,), (-0.0,)),
      ("constexpr", tl.constexpr(4), tl.constexpr(4.0)),
      ("constexpr_signed_zero", tl.constexpr(0.0), tl.constexpr(-0.0)),
      ("numpy_signed_zero", np.float32(0.0), np.float32(-0.0)),
      ("dict", {"a": 1}, {"a": 1.0}),
  )
  def test_python_equal_values_get_different_keys(self, a, b):
    self.assertEqual(a, b)  # Python's view: equal.
    self.assertNotEqual(_exact.key(a), _exact.key(b))

  @parameterized.named_parameters(
      ("int", 4), ("float", 2.5), ("negative_zero", -0.0),
      ("nan", float("nan")), ("inf", float("-inf")), ("tuple", (1, 2.0)),
      ("constexpr", tl.constexpr(3)), ("str", "x"), ("none", None))
  def test_same_value_same_key(self, value):
    self.assertEqual(_exact.key(value), _exact.key(value))
    self.assertEqual(hash(_exact.key(value)), hash(_exact.key(value)))


class ScalarRecompileTest(cache_util.EmptyCacheMixin, testing.TestCase):
  """A new scalar value compiles Triton again only where Triton would."""

  def _lower(self, n):
    x = jnp.zeros((64,), jnp.float32)
    f = lambda a: _scale(a, 1.0, n, compute_capability=90)
    return jax.jit(f).trace(x).lower(lowering_platforms=("cuda",))

  @parameterized.parameters(((3, 5, 7), 1), ((3, 1), 2), ((3, 32, 48), 2),
                            ((16, 32), 1))
  def test_triton_compiles(self, values, compiles):
    before = jt_dist.cache_info()
    for n in values:
      self.assertLen(util.triton_custom_calls(self._lower(n)), 1)
    self.assertEqual(jt_dist.cache_info().compiles - before.compiles, compiles)


_RSS_SCRIPT = textwrap.dedent("""
    import gc, json, sys
    sys.path[:0] = [{root!r}, {root!r} + "/tests"]
    import jt_dist
    import jax, jax.numpy as jnp, numpy as np
    import dispatch_test as t
    from jt_dist._call import memo as _memo

    def rss_mib():
      with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

    x = jnp.asarray(np.arange(16, dtype=np.float32))
    mode, calls = sys.argv[1], int(sys.argv[2])
    if mode == "layer":
      t._scale(x, 2.0)
      (call,) = {{c for c in _memo.triton_calls._entries.values()
                  if hasattr(c, "_jitted")}}
      # A value that repeats is compiled in: the array is the one operand.
      call._jitted = jax.jit(lambda a: a * 2)
      step = lambda i: t._scale(x, 2.0)
    else:
      step = lambda i: t._scale(x, 1.0 + i * 1e-3)
    marks = []
    for i in range(calls):
      step(i)
      if i % (calls // 10) == 0:
        gc.collect()
        marks.append(rss_mib())
    gc.collect()
    marks.append(rss_mib())
    calls = {{c for c in _memo.triton_calls._entries.values()
              if hasattr(c, "_jitted")}}
    print(json.dumps(dict(marks=marks, entries=len(_memo.triton_calls),
                          calls=len(calls))))
    """)


@unittest.skipUnless(sys.platform.startswith("linux"), "reads /proc")
class MemoryTest(testing.TestCase):
  """RSS stays flat: in a fresh process, after a warm-up tenth."""

  def _run(self, mode, calls):
    env = fork_server.tree_env(_ROOT, JT_DIST_CPU_DEVICES="1",
                               JAX_PLATFORMS="cpu")
    done = fork_server.run(
        ["-c", _RSS_SCRIPT.format(root=_ROOT), mode, str(calls)], env=env,
        cwd=_ROOT, timeout=600)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    import json  # pylint: disable=g-import-not-at-top
    return json.loads(done.stdout.strip().splitlines()[-1])

  def test_rss_flat_over_20000_eager_calls(self):
    # The interpreter takes milliseconds per launch, so the 20,000 calls
    # run jt_dist's cache layer over a jitted XLA stand-in for the kernel:
    # everything jt_dist keeps per call (key, lookup, entry, dispatch).
    result = self._run("layer", 20000)
    marks = result["marks"]
    self.assertLess(marks[-1] - marks[1], 8.0, marks)

  def test_rss_flat_over_1000_scalar_values(self):
    # Through the interpreter: the first value is compiled into a call of
    # its own; every other value is a new runtime operand of one more call
    # and executable, never a new one of either. The calls are kept under
    # the first call's value, and the scalars' types (in the plain key and
    # in the general one).
    result = self._run("values", 1000)
    marks = result["marks"]
    self.assertEqual(result["calls"], 2, result)
    self.assertEqual(result["entries"], 3, result)
    self.assertLess(marks[-1] - marks[1], 8.0, marks)


if __name__ == "__main__":
  absltest.main()
