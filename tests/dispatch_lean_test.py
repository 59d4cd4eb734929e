"""The lean eager hit: placement left to jit, never a different answer.

``jt_dist._call.lean`` keys an all-array call without the arrays'
shardings. Each test makes the lean entry first (two calls), then changes
what that key leaves out, and checks the call does what the full path does.
"""

from __future__ import annotations

import os
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
from jt_dist import testing
from jt_dist._call import dispatch as _dispatch
from jt_dist._call import lean as _lean
from jt_dist._core import binding as _binding
from jt_dist._core import call_cache as _call_cache
import lean_util

testing.configure_cpu_devices()

_BLOCK = 16


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask),
           mask=mask)


@triton.jit
def shifted_read_kernel(x_ptr, y_ptr, out_ptr, n: tl.constexpr,
                        BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets,
           tl.load(x_ptr + offsets + 1, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.autotune(configs=[triton.Config({"SCALE": 2}),
                          triton.Config({"SCALE": 3})], key=[])
@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n: tl.constexpr,
                      BLOCK: tl.constexpr, SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, SCALE * x + tl.load(y_ptr + offsets, mask=mask),
           mask=mask)


def _add(x, y, kernel=add_kernel, **options):
  return jt_dist.triton_call(
      x, y, kernel=kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, _BLOCK),), n=x.size, BLOCK=_BLOCK, **options)


class _Counting:
  """Counts full-path bindings and full-key computations."""

  def __enter__(self):
    self._patches = [mock.patch.object(_binding, "bind_call",
                                       wraps=_binding.bind_call),
                     mock.patch.object(_dispatch, "key", wraps=_dispatch.key)]
    self.binds, self.keys = (p.__enter__() for p in self._patches)
    return self

  def __exit__(self, *exc):
    for p in reversed(self._patches):
      p.__exit__(*exc)


class LeanHitTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    _dispatch.invalidate()

  def _pair(self, shape=(40,), dtype=np.float32, device=None):
    x, y = (self.random(shape).astype(dtype) for _ in range(2))
    if device is None:
      return x, y, jnp.asarray(x), jnp.asarray(y)
    return (x, y, jax.device_put(x, device), jax.device_put(y, device))

  def test_third_call_skips_the_full_key(self):
    x, y, xs, ys = self._pair()
    self.assertAllClose(_add(xs, ys), x + y)
    with _Counting() as counting:
      for _ in range(4):
        self.assertAllClose(_add(xs, ys), x + y)
    # The first call filed the entry: every later one is a lean hit.
    self.assertEqual(counting.binds.call_count, 0)
    self.assertEqual(counting.keys.call_count, 0)
    self.assertLen(_call_cache.lean_entries, 1)

  def test_device_changes_run_where_the_arrays_are(self):
    devices = self.devices(2)
    for device in (devices[0], devices[0], devices[1], devices[0]):
      x, y, xs, ys = self._pair(device=device)
      out = _add(xs, ys)
      self.assertEqual(out.devices(), {device})
      self.assertAllClose(out, x + y)

  def test_default_device_moves_uncommitted_arrays(self):
    devices = self.devices(2)
    x, y, xs, ys = self._pair()
    for device in (devices[0], devices[0], devices[1], devices[1]):
      with jax.default_device(device):
        out = _add(xs, ys)
      self.assertEqual(out.devices(), {device})
      self.assertAllClose(out, x + y)

  def test_arrays_on_different_devices_get_the_placement_error(self):
    devices = self.devices(2)
    _, _, xs, ys = self._pair(device=devices[0])
    _add(xs, ys)
    _add(xs, ys)
    with self.assertRaisesRegex(jt_dist.DevicePlacementError,
                                r"sit on different devices.*args\[0\]"):
      _add(xs, jax.device_put(ys, devices[1]))

  @parameterized.named_parameters(("split", P("i")), ("replicated", P()))
  def test_arrays_over_several_devices_get_the_placement_error(self, spec):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    x, y, xs, ys = self._pair(shape=(64,))
    self.assertAllClose(_add(xs, ys), x + y)
    self.assertAllClose(_add(xs, ys), x + y)
    spread = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (x, y)]
    with self.assertRaisesRegex(jt_dist.DevicePlacementError,
                                r"args\[0\] \(shape \(64,\).*spans 2"):
      _add(*spread)

  def test_new_dtype_binds_again(self):
    x, y, xs, ys = self._pair()
    _add(xs, ys)
    _add(xs, ys)
    with _Counting() as counting:
      x16, y16 = x.astype(np.float16), y.astype(np.float16)
      out = _add(jnp.asarray(x16), jnp.asarray(y16))
    self.assertEqual(out.dtype, np.float16)
    self.assertAllClose(out, x16 + y16)
    self.assertEqual(counting.binds.call_count, 1)

  def test_new_input_shape_with_same_metaparams(self):
    # The kernel reads n elements whatever the arrays' size: as the full
    # path would, the call reads the first 40 of 48.
    x, y, xs, ys = self._pair()
    _add(xs, ys)
    _add(xs, ys)
    wide = [self.random((48,)) for _ in range(2)]
    out = jt_dist.triton_call(
        *map(jnp.asarray, wide), kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(triton.cdiv(x.size, _BLOCK),), n=x.size, BLOCK=_BLOCK)
    self.assertAllClose(out, wide[0][:40] + wide[1][:40])

  def test_metaparam_types_are_not_confused(self):
    _, _, xs, ys = self._pair(shape=(16,))
    _add(xs, ys)
    _add(xs, ys)
    with self.assertRaisesRegex(TypeError, "grid"):
      jt_dist.triton_call(
          xs, ys, kernel=add_kernel, out_shape=jax.ShapeDtypeStruct(
              xs.shape, xs.dtype), grid=(1.0,), n=16, BLOCK=_BLOCK)

  def test_kernel_fault_is_raised_as_itself(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    x, y, xs, ys = self._pair(shape=(16,))
    with mock.patch.dict(os.environ, {"JT_DIST_BOUNDS_CHECK": "0"}):
      _add(xs, ys, kernel=shifted_read_kernel)
      out = _add(xs, ys, kernel=shifted_read_kernel)
    self.assertAllClose(np.asarray(out)[:15], x[1:] + y[:15])
    self.assertLen(_call_cache.lean_entries, 1)
    with self.assertRaises(jt_dist.OutOfBoundsAccessError):
      _add(xs, ys, kernel=shifted_read_kernel)

  def test_sync_launches_flipped(self):
    _, _, xs, ys = self._pair()
    waited = []
    real = jax.block_until_ready

    def block(outs):
      waited.append(1)
      return real(outs)

    with mock.patch.object(jax, "block_until_ready", block):
      for value, expected in (("0", 0), ("0", 0), ("1", 1), ("1", 2),
                              ("0", 2)):
        with mock.patch.dict(os.environ, {"JT_DIST_SYNC_LAUNCHES": value}):
          _add(xs, ys)
        self.assertLen(waited, expected)

  def test_autotuned_kernel_follows_pins(self):
    x, y, xs, ys = self._pair()
    kernel = scaled_add_kernel
    self.addCleanup(jt_dist.pin_autotune_config, kernel, None)
    self.addCleanup(jt_dist.forget_autotune_choices, kernel)
    jt_dist.forget_autotune_choices(kernel)
    chosen = None
    for _ in range(3):
      out = np.asarray(_add(xs, ys, kernel=kernel))
      fits = [s for s in (2, 3) if np.allclose(out, s * x + y, rtol=1e-5)]
      self.assertLen(fits, 1)
      self.assertIn(chosen, (None, fits[0]))
      chosen = fits[0]
    self.assertLen(_call_cache.lean_entries, 1)
    other = 5 - chosen
    pin = f'{{"scaled_add_kernel": {{"SCALE": {other}}}}}'
    with mock.patch.dict(os.environ, {"JT_DIST_AUTOTUNE_PIN": pin}):
      for _ in range(3):
        self.assertAllClose(_add(xs, ys, kernel=kernel), other * x + y)
    for tag in (other, chosen):
      jt_dist.pin_autotune_config(kernel, SCALE=tag)
      for _ in range(3):
        self.assertAllClose(_add(xs, ys, kernel=kernel), tag * x + y)

  def test_options_and_scalars_take_the_full_path(self):
    _, _, xs, ys = self._pair()
    for _ in range(3):
      _add(xs, ys, num_warps=2)
    self.assertEmpty(_call_cache.lean_entries)

  def test_keyword_operands_are_never_lean(self):
    x, y, xs, ys = self._pair()
    for _ in range(3):
      out = jt_dist.triton_call(
          xs, y_ptr=ys, kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=(triton.cdiv(x.size, _BLOCK),), n=x.size, BLOCK=_BLOCK)
      self.assertAllClose(out, x + y)
    self.assertEmpty(_call_cache.lean_entries)

  def test_bounded_and_emptied_by_invalidate(self):
    _, _, xs, ys = self._pair()
    _add(xs, ys)
    _add(xs, ys)
    self.assertLen(_call_cache.lean_entries, 1)
    jt_dist.configure_cache(dispatch_entries=2)
    try:
      self.assertEmpty(_call_cache.lean_entries)
      for n in (16, 32, 48, 64):
        x = jnp.zeros((n,), jnp.float32)
        _add(x, x)
        _add(x, x)
        self.assertLessEqual(len(_call_cache.lean_entries), 2)
    finally:
      jt_dist.configure_cache(dispatch_entries=_dispatch.DEFAULT_ENTRIES)
    _dispatch.invalidate()
    self.assertEmpty(_call_cache.lean_entries)


class LeanPythonHitTest(lean_util.PythonHitMixin, LeanHitTest):
  """``LeanHitTest`` with the lean hit in Python, the C one's reference."""


class LeanShardedTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    _dispatch.invalidate()

  def _call(self, xs, ys, mesh, in_specs, n):
    return jt_dist.sharded_triton_call(
        xs, ys, kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(xs.shape, xs.dtype), grid=(1,),
        mesh=mesh, in_specs=in_specs, out_specs=P("i"), n=n, BLOCK=_BLOCK)

  def test_named_mesh_and_specs_hit_lean_and_follow_layout(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    x, y = self.random((32,)), self.random((32,))
    split = NamedSharding(mesh, P("i"))
    xs, ys = jax.device_put(x, split), jax.device_put(y, split)
    for _ in range(3):
      out = self._call(xs, ys, mesh, (P("i"), P("i")), 16)
      self.assertAllClose(out, x + y)
    self.assertLen(_call_cache.lean_entries, 1)
    # Laid out otherwise: moved as in_specs say, as the full path does.
    whole = [jax.device_put(a, devices[0]) for a in (x, y)]
    out = self._call(*whole, mesh, (P("i"), P("i")), 16)
    self.assertAllClose(out, x + y)
    self.assertTrue(out.sharding.is_equivalent_to(split, 1), out.sharding)

  def test_specs_from_arguments_are_never_lean(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((2,), ("i",), devices=devices)
    x = self.random((32,))
    xs = jax.device_put(x, NamedSharding(mesh, P("i")))
    for _ in range(3):
      out = jt_dist.sharded_triton_call(
          xs, xs, kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
          out_specs=P("i"), n=16, BLOCK=_BLOCK)
      self.assertAllClose(out, 2 * x)
    self.assertEmpty(_call_cache.lean_entries)

  def test_arrays_outside_the_mesh_get_the_full_path_error(self):
    devices = self.devices(4)
    mesh = jax.make_mesh((2,), ("i",), devices=devices[:2])
    x = self.random((32,))
    xs = jnp.asarray(x)
    self._call(xs, xs, mesh, (P("i"), P("i")), 16)
    self._call(xs, xs, mesh, (P("i"), P("i")), 16)
    other = jax.make_mesh((2,), ("i",), devices=devices[2:])
    elsewhere = jax.device_put(x, NamedSharding(other, P("i")))
    answers = []

    def lean_call(*args):
      answers.append(real(*args))
      return answers[-1]

    real = _lean.call
    with mock.patch.object(_lean, "call", lean_call):
      out = self._call(elsewhere, elsewhere, mesh, (P("i"), P("i")), 16)
    # jit refused the lean hit; the full path moved the arrays to the mesh.
    self.assertEqual(answers, [_lean.MISS])
    self.assertAllClose(out, 2 * x)
    self.assertEqual(out.sharding.device_set, set(devices[:2]))

if __name__ == "__main__":
  absltest.main()
