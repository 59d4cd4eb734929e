"""Metaparams equal in Python but distinct to Triton never share a call.

``4 == 4.0``, ``(4,) == (4.0,)``, ``tl.constexpr(4) == tl.constexpr(4.0)``
and ``0.0 == -0.0`` in Python, yet Triton compiles a different kernel for
each: a constexpr's type and sign reach the code generator. Two eager calls
that differ only there must each run their own kernel, through
``triton_call`` (with and without a named option), ``kernel_call`` and
``sharded_triton_call``. The kernels make the difference visible: an int32
times an int constexpr wraps around, times a float one does not; a positive
float times ``-0.0`` is ``-0.0``.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 32


@triton.jit
def scale_kernel(x_ptr, out_ptr, Z: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, (tl.load(x_ptr + offsets) * Z).to(tl.float32))


@triton.jit
def scale_first_kernel(x_ptr, out_ptr, SCALES: tl.constexpr,
                       BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets,
           (tl.load(x_ptr + offsets) * SCALES[0]).to(tl.float32))


@triton.jit
def negative_zero_probe_kernel(x_ptr, out_ptr, Z: tl.constexpr,
                               BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, (tl.load(x_ptr + offsets) * Z).to(tl.float32))


@functools.cache
def _negative_zero_kept() -> bool:
  """Whether this Triton compiles a ``-0.0`` constexpr as ``-0.0``.

  Triton 3.6 makes it ``+0.0`` (compiled, and so in the interpreter): the
  two values then are one kernel. Its own kernel, only ever called with
  ``-0.0``, so that no cached call can answer for another value.
  """
  x = jnp.ones((_N,), jnp.float32)
  out = jt_dist.triton_call(
      x, kernel=negative_zero_probe_kernel, out_shape=x, grid=(1,), Z=-0.0,
      BLOCK=_N)
  return bool((np.asarray(out).view(np.int32) < 0).all())


def _has_negative_zero(*values) -> bool:
  return any(isinstance(_unwrap(v), float) and _unwrap(v) == 0.0
             and np.signbit(_unwrap(v)) for v in values)


def _unwrap(value):
  """The number a metaparam scales by: its first element, its contents."""
  if isinstance(value, tuple):
    value = value[0]
  return value.value if isinstance(value, tl.constexpr) else value


def _expected(x: np.ndarray, value) -> np.ndarray:
  """``x * value`` as the kernel computes it, stored as float32."""
  scale = _unwrap(value)
  if isinstance(scale, int):
    # int32 times an int constexpr: int32 arithmetic, which wraps.
    return (x.astype(np.int64) * scale).astype(np.int32).astype(np.float32)
  return x.astype(np.float32) * np.float32(scale)


# (kernel, metaparam name, first value, second value, input dtype).
_PAIRS = (
    ("tuple_int_then_float", scale_first_kernel, "SCALES", (4,), (4.0,),
     np.int32),
    ("tuple_float_then_int", scale_first_kernel, "SCALES", (4.0,), (4,),
     np.int32),
    ("constexpr_int_then_float", scale_kernel, "Z", tl.constexpr(4),
     tl.constexpr(4.0), np.int32),
    ("constexpr_float_then_int", scale_kernel, "Z", tl.constexpr(4.0),
     tl.constexpr(4), np.int32),
    ("zero_then_negative_zero", scale_kernel, "Z", 0.0, -0.0, np.float32),
    ("negative_zero_then_zero", scale_kernel, "Z", -0.0, 0.0, np.float32),
)

_OPTIONS = (("no_option", {}), ("num_warps", {"num_warps": 4}))


def _cases():
  for name, *pair in _PAIRS:
    for option_name, options in _OPTIONS:
      yield (f"{name}_{option_name}", *pair, options)


class EagerMetaparamTest(testing.TestCase):

  def _input(self, dtype) -> np.ndarray:
    if dtype == np.int32:
      # Large enough that times 4 leaves int32's range.
      return self.np_rng.integers(2**29, 2**31 - 1, size=_N, dtype=np.int32)
    return self.np_rng.uniform(0.5, 2.0, size=_N).astype(np.float32)

  def _check(self, out, x, value, what):
    out = np.asarray(out)
    expected = _expected(x, value)
    # Bit for bit: the sign of a zero is what tells two of the cases apart.
    np.testing.assert_array_equal(
        out.view(np.int32), expected.view(np.int32),
        err_msg=f"{what} with {value!r} ran another kernel")

  def _skip_unless_distinct(self, first, second):
    if _has_negative_zero(first, second) and not _negative_zero_kept():
      self.skipTest("this Triton compiles a -0.0 constexpr as +0.0, so"
                    " Z=0.0 and Z=-0.0 are one kernel")

  def _run_pair(self, call, kernel, name, first, second, dtype):
    self._skip_unless_distinct(first, second)
    x = self._input(dtype)
    xs = jnp.asarray(x)
    for value in (first, second, first, second):
      self._check(call(kernel, xs, {name: value}), x, value,
                  f"{kernel.fn.__name__}")

  @parameterized.named_parameters(*_cases())
  def test_triton_call(self, kernel, name, first, second, dtype, options):
    def call(kernel, x, metaparams):
      return jt_dist.triton_call(
          x, kernel=kernel, out_shape=jax.ShapeDtypeStruct(x.shape,
                                                           jnp.float32),
          grid=(1,), BLOCK=_N, **options, **metaparams)
    self._run_pair(call, kernel, name, first, second, dtype)

  @parameterized.named_parameters(*_cases())
  def test_kernel_call(self, kernel, name, first, second, dtype, options):
    def call(kernel, x, metaparams):
      return jt_dist.kernel_call(
          kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
          grid=(1,), BLOCK=_N, **options, **metaparams)(x)
    self._run_pair(call, kernel, name, first, second, dtype)

  @parameterized.named_parameters(
      (name, *pair) for name, *pair in _PAIRS)
  def test_held_kernel_calls_stay_apart(self, kernel, name, first, second,
                                        dtype):
    # Both calls made first, then called alternately.
    self._skip_unless_distinct(first, second)
    x = self._input(dtype)
    out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
    calls = {i: jt_dist.kernel_call(kernel, out_shape=out, grid=(1,),
                                    BLOCK=_N, **{name: value})
             for i, value in enumerate((first, second))}
    for i in (0, 1, 0, 1):
      self._check(calls[i](jnp.asarray(x)), x, (first, second)[i],
                  "kernel_call")

  @parameterized.named_parameters(
      (name, *pair) for name, *pair in _PAIRS)
  def test_sharded_triton_call(self, kernel, name, first, second, dtype):
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))

    def call(kernel, x, metaparams):
      return jt_dist.sharded_triton_call(
          x, kernel=kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32), grid=(1,),
          mesh=mesh, in_specs=(P(),), out_specs=P(), BLOCK=_N, **metaparams)
    self._run_pair(call, kernel, name, first, second, dtype)


if __name__ == "__main__":
  absltest.main()
