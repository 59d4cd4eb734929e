"""Bad input never crashes or hangs: a table of mistakes and what they raise.

Each row is one distinct bad input: the call that makes the mistake, the
exception type it must raise (a builtin or a jt_dist subclass of one), and a
pattern for what the message must name (the argument, the value, the fix).
The table adds to the cases of tests/errors_test.py, placement_test.py,
autotune_test.py, transforms_test.py, cache_test.py and
tests_multigpu/sharded_test.py, which it does not repeat; the mesh cases
are in tests_multigpu/bad_mesh_test.py.

An exception raised inside a user's own callable (grid, heuristic, pruning,
zeroed_outputs) keeps its type and gains a note naming the callable.
"""

import functools
import os
import re
import sys
from unittest import mock

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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.add import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
import cache_util  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position


@triton.jit
def block_first_kernel(x_ptr, BLOCK: tl.constexpr, out_ptr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


@triton.jit
def declared_add_kernel(x_ptr, y_ptr, n: tl.int32, out_ptr,
                        BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


class _Struct:
  """An output description with any .shape and .dtype, unchecked."""

  def __init__(self, shape, dtype=np.float32):
    self.shape, self.dtype = shape, dtype


def missing_block_grid(meta):
  return (triton.cdiv(meta["n_elements"], meta["BLOCK_SIZE"]),)


def failing_heuristic(meta):
  return meta["n_elements"] // meta["missing"]


def failing_prune(configs, named_args, **kwargs):
  raise RuntimeError(f"cannot prune {len(configs)} configs")


def failing_perf_model(**kwargs):
  return kwargs["x_ptr"].nbytes_per_second


def failing_zeroed(meta):
  return [1 // (meta["BLOCK"] - 16)]


_OUT = jax.ShapeDtypeStruct((16,), jnp.float32)


def _call(t, *args, **kwargs):
  """add_kernel on the test's inputs, with any argument overridden."""
  kwargs.setdefault("kernel", add_kernel)
  kwargs.setdefault("out_shape", _OUT)
  kwargs.setdefault("grid", 1)
  kwargs.setdefault("BLOCK", 16)
  args = args or (t.x, t.y, 16)
  return jt_dist.triton_call(*args, **kwargs)


def _heuristic_kernel(values):
  return triton.heuristics(values)(add_kernel)


def _autotuned(configs, **prune):
  return triton.autotune(configs=configs, key=["n_elements"], **prune)(add_kernel)


_CONFIG = triton.Config({"BLOCK": 16}, num_warps=1)

# (name, call, exception type, pattern the message must match).
_TRITON_CALL_CASES = (
    # --- the kernel -----------------------------------------------------
    ("kernel_partial", lambda t: _call(t, kernel=functools.partial(add_kernel)),
     TypeError, r"`kernel`.*functools\.partial.*@triton\.jit"),
    ("kernel_int", lambda t: _call(t, kernel=7),
     TypeError, r"`kernel`.*7 of type builtins\.int.*@triton\.jit"),
    ("kernel_lambda", lambda t: _call(t, kernel=lambda *a: None),
     TypeError, r"`kernel`.*<lambda>.*function.*Decorate"),
    ("kernel_class", lambda t: _call(t, kernel=_Struct),
     TypeError, r"`kernel`.*_Struct.*type.*@triton\.jit"),
    # --- binding: arities and parameters bound twice -------------------
    ("constexpr_positional_and_by_name",
     lambda t: jt_dist.triton_call(t.x, 16, kernel=block_first_kernel,
                                   out_shape=_OUT, grid=1, BLOCK=16),
     jt_dist.KernelBindingError,
     r"'block_first_kernel'.*metaparam BLOCK=16 binds 'BLOCK'.*already bind"),
    ("output_bound_by_name", lambda t: _call(t, out_ptr=0),
     # A keyword naming a non-constexpr parameter is an operand (0.4).
     jt_dist.KernelBindingError, r"output 0 binds 'BLOCK', a tl.constexpr"),
    ("heuristic_for_positional_parameter",
     lambda t: _call(t, kernel=_heuristic_kernel({"n_elements": lambda m: 16})),
     jt_dist.KernelBindingError, r"'add_kernel'.*\['n_elements'\] are bound twice"),
    ("autotune_config_unknown_parameter",
     lambda t: jt_dist.triton_call(
         t.x, t.y, 16, out_shape=_OUT, grid=1,
         kernel=_autotuned([triton.Config({"BLOKC": 16})])),
     jt_dist.KernelBindingError,
     r"'add_kernel'.*config \(BLOKC: 16.*\['BLOKC'\].*not parameters"),
    ("too_few_args_with_no_outputs_left",
     lambda t: _call(t, t.x),
     jt_dist.KernelBindingError,
     r"'add_kernel'\(x_ptr, y_ptr, n_elements, out_ptr, BLOCK\).*"
     r"\['n_elements', 'out_ptr'\] are not bound.*y_ptr=output 0"),
    # --- the grid -------------------------------------------------------
    ("grid_none", lambda t: _call(t, grid=None),
     TypeError, r"`grid` must be an int.*got None"),
    ("grid_empty_tuple", lambda t: _call(t, grid=()),
     ValueError, r"`grid` must have 1 to 3 dimensions; got \(\) with 0"),
    ("grid_empty_list", lambda t: _call(t, grid=[]),
     ValueError, r"`grid` must have 1 to 3 dimensions; got \(\) with 0"),
    ("grid_numpy_float", lambda t: _call(t, grid=(np.float32(2),)),
     TypeError, r"grid\[0\] \(x\) must be an int; got .*2\.0.*float32"),
    ("grid_callable_returns_none", lambda t: _call(t, grid=lambda meta: None),
     TypeError, r"`grid`.*callable returning one; got None"),
    ("grid_callable_four_axes", lambda t: _call(t, grid=lambda m: (1, 1, 1, 1)),
     ValueError, r"`grid`.*1 to 3 dimensions; got \(1, 1, 1, 1\) with 4"),
    ("grid_callable_zero", lambda t: _call(t, grid=lambda m: (m["n_elements"] // 32,)),
     ValueError, r"grid\[0\] \(x\) must be at least 1; got 0.*triton\.cdiv"),
    ("grid_callable_negative", lambda t: _call(t, grid=lambda m: (-m["n_elements"],)),
     ValueError, r"grid\[0\] \(x\) must be at least 1; got -16"),
    # --- output descriptions --------------------------------------------
    ("out_negative_dim", lambda t: _call(t, out_shape=_Struct((4, -1))),
     ValueError, r"out_shape has shape \(4, -1\), whose dimension 1 is -1"),
    ("out_float_dim", lambda t: _call(t, out_shape=_Struct((16.0,))),
     TypeError, r"out_shape has shape \(16\.0,\).*dimension 0 is 16\.0 of"
     r" type float.*int"),
    ("out_none_dim", lambda t: _call(t, out_shape=_Struct((None, 4))),
     TypeError, r"out_shape has shape \(None, 4\).*dimension 0 is None"),
    ("out_bool_dim", lambda t: _call(t, out_shape=_Struct((True,))),
     TypeError, r"out_shape has shape \(True,\).*of type bool"),
    ("out_shape_not_a_tuple", lambda t: _call(t, out_shape=_Struct(16)),
     TypeError, r"out_shape has shape 16 of type int.*tuple of ints"),
    ("out_dtype_not_a_dtype",
     lambda t: _call(t, out_shape=_Struct((16,), "float33")),
     TypeError, r"out_shape has dtype 'float33', which is not a dtype"),
    ("out_dtype_object", lambda t: _call(t, out_shape=_Struct((16,), object)),
     TypeError, r"out_shape has dtype object.*Supported dtypes: bfloat16"),
    ("out_dtype_int4", lambda t: _call(
        t, out_shape={"a": jax.ShapeDtypeStruct((16,), jnp.int4)}),
     TypeError, r"out_shape\['a'\] has dtype int4.*cannot take"),
    ("out_dtype_float64_complex", lambda t: _call(
        t, out_shape=[_OUT, jax.ShapeDtypeStruct((16,), jnp.complex128)]),
     TypeError, r"out_shape\[1\] has dtype complex128"),
    # --- positional arguments -------------------------------------------
    ("arg_complex_scalar", lambda t: _call(t, t.x, t.y, 2j),
     TypeError, r"args\[2\] = 2j of type complex"),
    ("arg_numpy_complex_scalar", lambda t: _call(t, t.x, t.y, np.complex64(1)),
     TypeError, r"args\[2\] has shape \(\) and dtype complex64.*jnp\.real"),
    ("arg_list", lambda t: _call(t, t.x, t.y, [16]),
     TypeError, r"args\[2\] = \[16\] of type list"),
    ("arg_string_array", lambda t: _call(t, np.array(["a"] * 16), t.y, 16),
     TypeError, r"args\[0\] has shape \(16,\) and dtype str32.*Supported"),
    ("arg_object_array", lambda t: _call(t, t.x, np.array([None] * 16), 16),
     TypeError, r"args\[1\] has shape \(16,\) and dtype object"),
    ("arg_int_beyond_uint64", lambda t: _call(t, t.x, t.y, 2**64 + 5),
     ValueError, r"args\[2\] = 18446744073709551621 does not fit in 64 bits"),
    ("tuple_leaf_int_beyond_uint64", lambda t: _call(t, t.x, t.y, (1, 2**64)),
     ValueError, r"args\[2\]\[1\] = 18446744073709551616 does not fit"),
    ("tuple_leaf_complex_array",
     lambda t: _call(t, t.x, (t.y, np.zeros(4, np.complex64)), 16),
     TypeError, r"args\[1\]\[1\] has shape \(4,\) and dtype complex64"),
    ("declared_int32_overflow",
     lambda t: _call(t, t.x, t.y, 2**31, kernel=declared_add_kernel),
     ValueError, r"args\[2\] = 2147483648 binds parameter 'n' of kernel"
     r" 'declared_add_kernel', declared i32, which holds -2147483648 to"
     r" 2147483647.*tl\.int64"),
    ("declared_int32_underflow",
     lambda t: _call(t, t.x, t.y, -(2**31) - 1, kernel=declared_add_kernel),
     ValueError, r"args\[2\] = -2147483649 binds parameter 'n'.*declared i32"),
    ("declared_int32_given_float",
     lambda t: _call(t, t.x, t.y, 16.0, kernel=declared_add_kernel),
     TypeError, r"args\[2\] = 16\.0 of type float binds parameter 'n'.*"
     r"declared i32; pass an int"),
    # --- options ----------------------------------------------------------
    ("num_warps_zero", lambda t: _call(t, num_warps=0),
     ValueError, r"num_warps=0 must be at least 1 and a power of two"),
    ("num_warps_three", lambda t: _call(t, num_warps=3),
     ValueError, r"num_warps=3 .*power of two.*1, 2, 4, 8"),
    ("num_warps_float", lambda t: _call(t, num_warps=4.0),
     TypeError, r"num_warps=4\.0 of type float must be an int"),
    ("num_stages_negative", lambda t: _call(t, num_stages=-1),
     ValueError, r"num_stages=-1 must be at least 0"),
    ("num_stages_string", lambda t: _call(t, num_stages="3"),
     TypeError, r"num_stages='3' of type str must be an int"),
    ("num_ctas_zero", lambda t: _call(t, num_ctas=0),
     ValueError, r"num_ctas=0 must be at least 1.*Hopper"),
    ("compute_capability_string", lambda t: _call(t, compute_capability="9.0"),
     TypeError, r"compute_capability='9\.0' of type str.*e\.g\. 90"),
    ("name_not_a_string", lambda t: _call(t, name=3),
     TypeError, r"name=3 of type int must be a str"),
    ("serialized_metadata_str", lambda t: _call(t, serialized_metadata="abc"),
     TypeError, r"serialized_metadata='abc' of type str must be bytes"),
    ("debug_string", lambda t: _call(t, debug="yes"),
     TypeError, r"debug='yes' of type str must be True or False"),
    ("enable_fp_fusion_none", lambda t: _call(t, enable_fp_fusion=None),
     TypeError, r"enable_fp_fusion=None of type NoneType"),
    ("aliases_list", lambda t: _call(t, input_output_aliases=[0]),
     TypeError, r"input_output_aliases=\[0\] of type list must be a dict"),
    ("aliases_string_key", lambda t: _call(t, input_output_aliases={"x": 0}),
     TypeError, r"input_output_aliases entry 'x': 0 must map an int"),
    ("zeroed_outputs_int", lambda t: _call(t, zeroed_outputs=0),
     TypeError, r"zeroed_outputs is 0 of type int.*sequence of output"),
    # --- device -----------------------------------------------------------
    ("device_float", lambda t: _call(t, device=0.0),
     TypeError, r"device=0\.0 of type float must be a device index"),
    ("device_bool", lambda t: _call(t, device=True),
     TypeError, r"device=True of type bool"),
    ("device_negative", lambda t: _call(t, device=-1),
     jt_dist.DevicePlacementError,
     r"device=-1 is not a local device index.*indices 0 to"),
    ("device_numpy_out_of_range", lambda t: _call(t, device=np.int32(10**6)),
     jt_dist.DevicePlacementError,
     r"device=1000000 is not a local device index"),
    # --- shard_size ------------------------------------------------------
    ("shard_size_bool_index", lambda t: jt_dist.shard_size(True),
     TypeError, r"shard_size: arg_index=True of type bool must be an int"),
    ("shard_size_no_index", lambda t: jt_dist.shard_size(None),
     TypeError, r"shard_size: arg_index is required"),
    ("shard_size_float_axis", lambda t: jt_dist.shard_size(0, 1.0),
     TypeError, r"shard_size: axis=1\.0 of type float"),
    ("shard_size_negative_index",
     lambda t: _call(t, t.x, t.y, jt_dist.shard_size(-1)),
     ValueError, r"args\[2\] = ShardSize\(arg_index=-1.*3 positional"),
    ("shard_size_axis_out_of_range",
     lambda t: _call(t, t.x, t.y, jt_dist.shard_size(0, axis=1)),
     ValueError, r"args\[2\].*args\[0\] has shape \(16,\) \(rank 1\), so"
     r" axis=1 is out of range"),
    ("shard_size_metaparam_on_scalar",
     lambda t: _call(t, BLOCK=jt_dist.shard_size(2)),
     ValueError, r"metaparam BLOCK = ShardSize.*args\[2\] = 16, a scalar"),
    # --- cache settings --------------------------------------------------
    ("cache_dir_int", lambda t: jt_dist.configure_cache(cache_dir=3),
     TypeError, r"configure_cache: cache_dir=3 of type int must be a str"),
    ("cache_dir_empty", lambda t: jt_dist.configure_cache(cache_dir=""),
     ValueError, r"configure_cache: cache_dir='' is not a usable directory"),
    ("cache_dir_nul", lambda t: jt_dist.configure_cache(cache_dir="a\0b"),
     ValueError, r"cache_dir='a\\x00b' is not a usable.*NUL"),
    ("disk_cache_string", lambda t: jt_dist.configure_cache(disk_cache="no"),
     TypeError, r"disk_cache='no' of type str must be True or False"),
    ("memory_entries_string",
     lambda t: jt_dist.configure_cache(memory_entries="ten"),
     TypeError, r"memory_entries='ten' of type str must be an int"),
    ("memory_entries_float",
     lambda t: jt_dist.configure_cache(memory_entries=2.5),
     TypeError, r"memory_entries=2\.5 of type float must be an int"),
    ("memory_entries_negative",
     lambda t: jt_dist.configure_cache(memory_entries=-3),
     ValueError, r"memory_entries=-3 must be at least 1.*disk_cache=False"),
    # An autotuned call asks the disk for a saved choice.
    ("env_disk_cache_unknown", lambda t: t.with_env(
        {"JT_DIST_DISK_CACHE": "maybe"}, lambda: jt_dist.triton_call(
            t.x, t.y, 16, out_shape=_OUT, grid=1, kernel=_autotuned(
                [triton.Config({"BLOCK": 16}, num_warps=1),
                 triton.Config({"BLOCK": 16}, num_warps=2)]))),
     ValueError, r"JT_DIST_DISK_CACHE='maybe' is neither on.*nor off.*1 or 0"),
    ("cache_dir_bytes", lambda t: jt_dist.configure_cache(cache_dir=b"/tmp"),
     TypeError, r"cache_dir=b'/tmp' of type bytes must be a str"),
)

# Exceptions raised inside a user's callable: (name, call, type, callable).
_USER_CALLABLE_CASES = (
    ("grid_callable_raises", lambda t: _call(t, grid=missing_block_grid),
     KeyError, "the grid callable missing_block_grid"),
    ("grid_callable_wrong_signature", lambda t: _call(t, grid=lambda: (1,)),
     TypeError, "the grid callable <lambda>"),
    ("heuristic_raises",
     lambda t: jt_dist.triton_call(
         t.x, t.y, 16, out_shape=_OUT, grid=1,
         kernel=_heuristic_kernel({"BLOCK": failing_heuristic})),
     KeyError, "the heuristic for 'BLOCK' of kernel 'add_kernel'"
     " failing_heuristic"),
    ("early_config_prune_raises",
     lambda t: jt_dist.triton_call(
         t.x, t.y, 16, out_shape=_OUT, grid=1, kernel=_autotuned(
             [_CONFIG], prune_configs_by={"early_config_prune": failing_prune})),
     RuntimeError, "the early_config_prune of kernel 'add_kernel'"
     " failing_prune"),
    ("perf_model_raises",
     lambda t: jt_dist.triton_call(
         t.x, t.y, 16, out_shape=_OUT, grid=1, kernel=_autotuned(
             [_CONFIG, triton.Config({"BLOCK": 32})],
             prune_configs_by={"perf_model": failing_perf_model, "top_k": 1})),
     AttributeError, "the perf_model of kernel 'add_kernel'"
     " failing_perf_model"),
    ("zeroed_outputs_callable_raises",
     lambda t: _call(t, zeroed_outputs=failing_zeroed),
     ZeroDivisionError, "the zeroed_outputs callable failing_zeroed"),
)


class BadInputTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    self.x = jnp.asarray(self.random((16,)))
    self.y = jnp.asarray(self.random((16,)))
    cache_util.keep_settings(self)

  def with_env(self, env, fn):
    """Calls ``fn`` with ``env`` set (no configure_cache override is left
    over from another test: keep_settings restores them)."""
    with mock.patch.dict(os.environ, env):
      return fn()

  def test_table_has_sixty_distinct_cases(self):
    names = [c[0] for c in _TRITON_CALL_CASES + _USER_CALLABLE_CASES]
    self.assertLen(set(names), len(names))
    self.assertGreaterEqual(len(names), 60)

  @parameterized.named_parameters(*_TRITON_CALL_CASES)
  def test_bad_input_raises(self, call, error, pattern):
    with self.assertRaisesRegex(error, pattern) as cm:
      jax.block_until_ready(call(self))
    # A builtin type first: callers catching ValueError/TypeError still do.
    self.assertIsInstance(cm.exception,
                          (ValueError, TypeError, NotImplementedError))

  @parameterized.named_parameters(*_USER_CALLABLE_CASES)
  def test_user_callable_error_names_the_callable(self, call, error, named):
    with self.assertRaises(error) as cm:
      call(self)
    # The user's own exception, unwrapped: its type and message are theirs.
    self.assertIs(type(cm.exception), error)
    notes = "\n".join(getattr(cm.exception, "__notes__", []))
    self.assertIn(f"jt_dist: raised by {named}", notes)
    self.assertIn(__file__.rstrip("c"), notes)

  def test_device_not_in_this_process(self):
    devices = jax.local_devices()
    if len(devices) < 2:
      self.skipTest("needs two devices to hide one")
    hidden = devices[-1]
    # A device of this process that JAX does not list as addressable;
    # jax.local_devices() is narrowed only inside the block.
    with mock.patch.object(jax, "local_devices", return_value=devices[:-1]):
      with self.assertRaisesRegex(
          jt_dist.DevicePlacementError,
          rf"device={re.escape(repr(hidden))} \(platform {hidden.platform}\)"
          r" is not one of the devices this process launches on.*"
          r"jax\.local_devices\(\) lists"):
        _call(self, device=hidden)

  def test_declared_int32_in_range_runs(self):
    out = _call(self, self.x, self.y, np.int64(16), kernel=declared_add_kernel)
    self.assertAllClose(out, np.asarray(self.x) + np.asarray(self.y))

  def test_numpy_device_index_is_accepted(self):
    out = _call(self, device=np.int64(0))
    self.assertAllClose(out, np.asarray(self.x) + np.asarray(self.y))
    self.assertEqual(out.devices(), {jax.devices()[0]})


if __name__ == "__main__":
  absltest.main()
