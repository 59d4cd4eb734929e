"""CPU calls run in jt_dist's own XLA FFI target.

A call's custom call carries its ``cost_estimate`` as ``cost_estimate_json``,
as jax-triton 0.4 records it on GPUs (its ``test_cost_estimate`` reads the
HLO text), runs the kernel through the interpreter, and raises jt_dist's
own exceptions. A call without ``cost_estimate`` carries no estimate; where
the target cannot register, calls take JAX's buffer callback. Inputs are fresh and random; results are checked against
NumPy.
"""

import ctypes
import os
import textwrap
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton

from jt_dist import testing
import fork_server

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._compat import xla_ffi as _xla_ffi  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import ffi_target as _ffi_target  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 300


def _add(x, y, n=None, **kwargs):
  n = x.size if n is None else n
  return jt_dist.triton_call(
      x, y, n, kernel=add_kernel, out_shape=jax.ShapeDtypeStruct(
          x.shape, x.dtype), grid=(triton.cdiv(x.size, 8),), BLOCK=8,
      **kwargs)


def _hlo(f, *args):
  return jax.jit(f).lower(*args).compiler_ir("hlo").as_hlo_text()


def _custom_calls(hlo):
  return [line for line in hlo.splitlines() if "custom-call(" in line]


class CpuCostEstimateTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the CPU lowering runs only on the CPU backend")
    self.rng = np.random.default_rng()

  def _cost(self):
    flops, nbytes = (int(v) for v in self.rng.integers(1, 10**9, size=2))
    return {"flops": flops, "bytes_accessed": nbytes}

  def test_hlo_carries_the_estimate_as_jax_triton_does(self):
    cost = self._cost()
    x = jnp.asarray(self.random((20,)))
    hlo = _hlo(lambda a, b: _add(a, b, cost_estimate=cost), x, x)
    calls = _custom_calls(hlo)
    self.assertLen(calls, 1)
    self.assertIn(f'custom_call_target="{_ffi_target.TARGET}"', calls[0])
    # jax-triton 0.4's test_cost_estimate regexes.
    self.assertRegex(
        hlo, rf"cost_estimate_json\s*=\s*.*flops\\22\s*:\s*{cost['flops']}")
    self.assertRegex(
        hlo, rf"cost_estimate_json\s*=\s*.*bytes_accessed\\22\s*:\s*"
        rf"{cost['bytes_accessed']}")

  def test_without_estimate_the_call_carries_none(self):
    x = jnp.asarray(self.random((20,)))
    calls = _custom_calls(_hlo(_add, x, x))
    self.assertLen(calls, 1)
    self.assertIn(f'custom_call_target="{_ffi_target.TARGET}"', calls[0])
    self.assertNotIn("cost_estimate_json", calls[0])

  def test_side_effect_is_kept(self):
    x = jnp.asarray(self.random((20,)))
    hlo = _hlo(lambda a, b: _add(a, b, cost_estimate=self._cost(),
                                 has_side_effect=True), x, x)
    self.assertIn("custom_call_has_side_effect=true", hlo)

  @parameterized.parameters(((20,), np.float32), ((3, 7), np.int32),
                            ((0,), np.float32))
  def test_results_eager_and_under_jit(self, shape, dtype):
    x = jnp.asarray(self.random(shape, dtype))
    y = jnp.asarray(self.random(shape, dtype))
    f = lambda a, b: _add(a, b, cost_estimate=self._cost())
    want = np.asarray(x) + np.asarray(y)
    self.assertAllClose(f(x, y), want)
    self.assertAllClose(jax.jit(f)(x, y), want)
    # The inputs are XLA's buffers: the kernel must not change them.
    self.assertAllClose(jax.jit(lambda a, b: (f(a, b), a + 0))(x, y)[1], x)

  @parameterized.parameters(False, True)
  def test_kernel_error_raises_jt_dists_exception(self, jit):
    x = jnp.asarray(self.random((20,)))
    bad = lambda a, b: _add(a, b, n=40, cost_estimate=self._cost())
    good = lambda a, b: _add(a, b, cost_estimate=self._cost())
    if jit:
      bad, good = jax.jit(bad), jax.jit(good)
    with self.assertRaisesKernelError(jt_dist.OutOfBoundsAccessError,
                                      jitted=jit) as caught:
      jax.block_until_ready(bad(x, x))
    self.assertRegex(
        caught.message,
        r"kernel 'add_kernel', program id \(2, 0, 0\): load through 'x_ptr'"
        r" \(input 0\)")
    # The next call is fine.
    self.assertAllClose(good(x, x), np.asarray(x) * 2)

  def test_failed_registration_falls_back_to_the_buffer_callback(self):
    x = jnp.asarray(self.random((20,)))
    with mock.patch.object(_ffi_target, "_REGISTERED", None), \
        mock.patch.object(jax.ffi, "register_ffi_target",
                          side_effect=RuntimeError("refused")):
      hlo = _hlo(lambda a, b: _add(a, b, cost_estimate=self._cost()), x, x)
    self.assertIn("xla_buffer_python_cpu_callback", hlo)
    self.assertNotIn("cost_estimate_json", hlo)

  def test_shard_map_then_psum_over_eight_devices(self):
    # In a subprocess: an error before a collective makes XLA abort the
    # process after its rendezvous timeout rather than raise.
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(_ROOT, "tests")!r})
        from jt_dist import testing
        testing.configure_cpu_devices(8)
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import PartitionSpec as P
        import cpu_cost_estimate_test as t
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
        rng = np.random.default_rng()
        for per_shard in (64, 40000):
          x = rng.standard_normal(8 * per_shard).astype(np.float32)
          y = rng.standard_normal(8 * per_shard).astype(np.float32)
          def body(a, b):
            return jax.lax.psum(t._add(a, b, cost_estimate={{"flops": 3}}),
                                "x")
          f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                                    out_specs=P()))
          got = np.asarray(f(x, y))
          want = (x + y).reshape(8, per_shard).sum(0)
          np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        print("done")
        """)
    env = fork_server.tree_env(_ROOT, JAX_PLATFORMS="cpu")
    env.pop("JT_DIST_CPU_DEVICES", None)
    result = fork_server.run(["-c", script], env=env, cwd=os.getcwd(),
                             timeout=_TIMEOUT_S)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("done", result.stdout)



class HandlerGuardTest(testing.TestCase):
  """The handler on hand-made call frames: refusals, never a crash."""

  def _api(self, major):
    messages = []

    def error_create(args):
      messages.append((args.contents.message.decode(), args.contents.errc))
      return 0x1234  # Any non-NULL pointer reads as an error.

    self.callback = _xla_ffi.ERROR_CREATE(error_create)
    api = _xla_ffi.ApiHead(struct_size=_xla_ffi.MIN_API_SIZE,
                           Error_Create=self.callback)
    api.api_version.major_version = major
    return api, messages

  def test_metadata_query_refused_for_another_major_version(self):
    for major, want in ((0, _xla_ffi.CLAIMED_API), (1, (0, 0))):
      api, _ = self._api(major)
      metadata = _xla_ffi.Metadata()
      extension = _xla_ffi.MetadataExtension(metadata=ctypes.pointer(metadata))
      extension.extension_base.type = _xla_ffi.EXTENSION_METADATA
      frame = _xla_ffi.CallFrame(
          struct_size=ctypes.sizeof(_xla_ffi.CallFrame),
          extension_start=ctypes.cast(ctypes.pointer(extension), ctypes.POINTER(
              _xla_ffi.ExtensionBase)), api=ctypes.addressof(api))
      self.assertIsNone(_ffi_target._handle(ctypes.pointer(frame)))
      got = (metadata.api_version.major_version,
             metadata.api_version.minor_version)
      self.assertEqual(got, want, f"API major version {major}")

  def test_short_call_frame_is_an_error(self):
    api, messages = self._api(0)
    size = int(np.random.default_rng().integers(
        24, _xla_ffi.MIN_CALL_FRAME_SIZE))
    frame = _xla_ffi.CallFrame(struct_size=size, api=ctypes.addressof(api),
                               stage=_xla_ffi.STAGE_EXECUTE)
    self.assertEqual(_ffi_target._handle(ctypes.pointer(frame)), 0x1234)
    self.assertLen(messages, 1)
    self.assertRegex(messages[0][0], rf"call frame of {size} bytes")
    self.assertEqual(messages[0][1], _xla_ffi.ERRC_INVALID_ARGUMENT)

  def test_unknown_index_is_an_error(self):
    api, messages = self._api(0)
    name = b"index"
    span = _xla_ffi.ByteSpan(
        ctypes.cast(ctypes.c_char_p(name), ctypes.c_void_p), len(name))
    value = ctypes.c_uint64(2**63 + int(np.random.default_rng().integers(99)))
    scalar = _xla_ffi.Scalar(
        _xla_ffi.DTYPE_U64, ctypes.cast(ctypes.pointer(value), ctypes.c_void_p))
    names = (ctypes.POINTER(_xla_ffi.ByteSpan) * 1)(ctypes.pointer(span))
    types = (ctypes.c_int * 1)(_xla_ffi.ATTR_SCALAR)
    values = (ctypes.c_void_p * 1)(ctypes.addressof(scalar))
    frame = _xla_ffi.CallFrame(struct_size=ctypes.sizeof(_xla_ffi.CallFrame),
                               api=ctypes.addressof(api),
                               stage=_xla_ffi.STAGE_EXECUTE)
    frame.attrs.size, frame.attrs.types = 1, types
    frame.attrs.names, frame.attrs.attrs = names, values
    self.assertEqual(_ffi_target._handle(ctypes.pointer(frame)), 0x1234)
    self.assertRegex(messages[0][0], rf"no CPU kernel for custom call index"
                     rf" {value.value}: the executable was not lowered")

if __name__ == "__main__":
  absltest.main()
