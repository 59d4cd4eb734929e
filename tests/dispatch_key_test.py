"""The eager key is computed from the arguments as given: it still misses.

``triton_call`` keys a repeated call before merging keyword operands,
splitting TensorDescriptors or merging ``backend_options``; these tests
check that each of those, when it changes, makes the call miss (or hit)
exactly as it must.
"""

from __future__ import annotations

import inspect
import os
import textwrap
import types
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import _compat
from jt_dist import testing
from jt_dist._call import dispatch as _dispatch
from jt_dist._core import binding as _binding
import fork_server

testing.configure_cpu_devices()

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def scale_kernel(x_ptr, s, out_ptr, N: tl.constexpr):
  offsets = tl.arange(0, N)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * s)


@triton.jit
def desc_copy_kernel(in_desc, out_ptr, M: tl.constexpr, N: tl.constexpr):
  block = in_desc.load([0, 0])
  offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
  tl.store(out_ptr + offs, block)


def _scale(x, s, **options):
  return jt_dist.triton_call(
      x, s, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
      N=x.size, **options)


class _Binds:
  """Counts ``bind_call``: one per miss of the fast path."""

  def __enter__(self):
    self._patch = mock.patch.object(_binding, "bind_call",
                                    wraps=_binding.bind_call)
    self.mock = self._patch.__enter__()
    return self

  def __exit__(self, *exc):
    return self._patch.__exit__(*exc)

  @property
  def count(self) -> int:
    return self.mock.call_count


class KeyFirstTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    _dispatch.invalidate()

  def test_keyword_operands_hit_and_see_new_arrays(self):
    x = self.random((16,))
    with _Binds() as binds:
      for k in range(3):
        y = x + k
        out = jt_dist.triton_call(
            kernel=scale_kernel, x_ptr=jnp.asarray(y), s=2.0,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
            N=16)
        self.assertAllClose(out, y * 2)
    self.assertEqual(binds.count, 1)

  def test_keyword_operand_shape_change_misses(self):
    with _Binds() as binds:
      for n in (16, 32, 16):
        x = self.random((n,))
        out = jt_dist.triton_call(
            kernel=scale_kernel, x_ptr=jnp.asarray(x), s=0.5,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1,),
            N=n)
        self.assertAllClose(out, x * 0.5)
    self.assertEqual(binds.count, 2)

  @parameterized.parameters(
      ({"maxnreg": 64}, {"maxnreg": 128}),
      ({"maxnreg": 64}, {"maxnreg": 64.0}),
      (None, {"maxnreg": 64}),
      ({"num_warps": 4}, {"num_warps": 8}),
  )
  def test_backend_option_change_misses(self, first, second):
    x = jnp.asarray(self.random((16,)))
    with _Binds() as binds:
      for options in (first, second, first):
        _scale(x, 2.0, backend_options=options)
    self.assertEqual(binds.count, 2)

  def test_backend_option_given_twice_raises_on_every_call(self):
    x = jnp.asarray(self.random((16,)))
    _scale(x, 2.0, num_warps=4)
    for _ in range(2):
      with self.assertRaisesRegex(ValueError, "num_warps given both"):
        _scale(x, 2.0, num_warps=4, backend_options={"num_warps": 4})

  @parameterized.parameters(
      ("debug", False, 0), ("enable_fp_fusion", True, 1),
      ("has_side_effect", False, 0), ("num_warps", 4, 4.0))
  def test_equal_option_values_of_other_types_miss(self, name, a, b):
    x = jnp.asarray(self.random((16,)))
    with _Binds() as binds:
      _scale(x, 2.0, **{name: a})
      try:
        _scale(x, 2.0, **{name: b})
      except (TypeError, ValueError):
        pass  # Refused by the checks, which a hit would have skipped.
    self.assertEqual(binds.count, 2)

  def test_tensor_descriptor_array_and_fields_change_misses(self):
    x = self.random((16, 16))
    block = (8, 8)
    with _Binds() as binds:
      for arr, padding in ((x, "zero"), (x + 1, "zero"), (x, "nan"),
                           (x[:8], "zero"), (x - 1, "zero")):
        desc = jt_dist.TensorDescriptor.from_array(jnp.asarray(arr), block,
                                                   padding=padding)
        out = jt_dist.triton_call(
            desc, kernel=desc_copy_kernel,
            out_shape=jax.ShapeDtypeStruct(block, np.float32), grid=(1,),
            M=block[0], N=block[1])
        self.assertAllClose(out, arr[:block[0], :block[1]])
    # New values hit; another padding or array shape misses.
    self.assertEqual(binds.count, 3)

  def test_refs_never_take_the_fast_path(self):
    x = self.random((16,))
    ref = jax.new_ref(jnp.asarray(x))
    out = jax.ShapeDtypeStruct((16,), np.float32)
    for _ in range(2):
      got = jt_dist.triton_call(ref, 3.0, kernel=scale_kernel, out_shape=out,
                                grid=(1,), N=16)
      self.assertAllClose(got, x * 3)
    self.assertEmpty(_dispatch.entries)

  def test_default_options_follow_triton_calls_signature(self):
    # cached() keys the all-defaults call by comparing with DEFAULT_OPTIONS.
    params = inspect.signature(jt_dist.triton_call).parameters
    names = ("name", "custom_call_target_name", "num_warps", "num_stages",
             "num_ctas", "compute_capability", "enable_fp_fusion",
             "backend_options", "input_output_aliases", "zeroed_outputs",
             "debug", "serialized_metadata", "vmap_method", "device",
             "sharding_rule", "has_side_effect", "cost_estimate")
    self.assertEqual(_dispatch.DEFAULT_OPTIONS,
                     tuple(params[n].default for n in names))
    self.assertEqual(names[_dispatch.RULE], "sharding_rule")
    leftover = {n for n, p in params.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY} - set(names)
    self.assertEqual(leftover, {"kernel", "out_shape", "grid", "out_type"})

  def test_mapping_backend_options_hit(self):
    x = jnp.asarray(self.random((16,)))
    options = types.MappingProxyType({"maxnreg": 64})
    with _Binds() as binds:
      for _ in range(3):
        _scale(x, 2.0, backend_options=options)
    self.assertEqual(binds.count, 1)

  def test_environ_reader_sees_changes(self):
    read = _compat.environ_reader(("JT_DIST_TEST_ONLY_VAR",))
    read_two = _compat.environ_reader(("JT_DIST_TEST_ONLY_VAR", "HOME"))
    before, before_two = read(), read_two()
    with mock.patch.dict(os.environ, {"JT_DIST_TEST_ONLY_VAR": "1"}):
      self.assertNotEqual(read(), before)
      self.assertNotEqual(read_two(), before_two)
      seen = read()
    with mock.patch.dict(os.environ, {"JT_DIST_TEST_ONLY_VAR": "2"}):
      self.assertNotEqual(read(), seen)
    self.assertEqual(read(), before)


_FIRST_CALL_TRACED = textwrap.dedent("""
    import sys
    sys.path[:0] = [{root!r}, {root!r} + "/tests"]
    import jt_dist
    import jax, jax.numpy as jnp
    import dispatch_key_test as t
    from jt_dist._call import dispatch as _dispatch
    x = jnp.arange(16, dtype=jnp.float32)
    jax.jit(lambda a: t._scale(a, 2.0))(x)  # jt_dist's first call: traced.
    for _ in range(2):
      t._scale(x, 2.0)
    print(len(_dispatch.entries))
    """)


class FreshProcessTest(testing.TestCase):

  def test_first_call_under_jit_then_eager_calls_are_cached(self):
    env = fork_server.tree_env(_ROOT, JT_DIST_CPU_DEVICES="1",
                               JAX_PLATFORMS="cpu")
    done = fork_server.run(["-c", _FIRST_CALL_TRACED.format(root=_ROOT)],
                           env=env, cwd=_ROOT, timeout=600)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertEqual(done.stdout.strip().splitlines()[-1], "1")


if __name__ == "__main__":
  absltest.main()
