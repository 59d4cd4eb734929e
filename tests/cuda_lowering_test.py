"""Cross-lowering ``triton_call`` for CUDA on a host without a GPU."""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import types
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist._backend import cache as _cache
from jt_dist import _compat
from jt_dist._gpu import compile as _compile
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist._backend import target as _target
from jt_dist._call import kernel_call as _kernel_call
from jt_dist import testing
import cache_util
import gpu_lowering_util as util
from feature_kernels import acc_sum_kernel
from feature_kernels import add_kernel
from feature_kernels import scale_kernel
from feature_kernels import scale_negate_kernel


def _with_ttir():
  """Lowerings inside the block carry each kernel's TTIR, for tests to read."""
  return mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(ttir=True))


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 64}, num_warps=2),
        triton.Config({"BLOCK": 128}, num_warps=4),
        triton.Config({"BLOCK": 256}, num_warps=8),
    ],
    key=["n"],
)
@triton.jit
def tuned_add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr, K: tl.constexpr):
  rm = tl.arange(0, BM)
  rn = tl.arange(0, BN)
  rk = tl.arange(0, BK)
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k in range(0, K, BK):
    a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
    b = tl.load(b_ptr + (k + rk)[:, None] * BN + rn[None, :])
    acc += tl.dot(a, b)
  tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


def _add(x, y, **options):
  options.setdefault("compute_capability", 90)
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, 128),), BLOCK=128, **options)


def _tuned_add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=tuned_add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),),
      compute_capability=90, **options)


_FFI = "triton_kernel_call_ffi"


def _lower(f, *args):
  # A fresh function each time: jit caches lowerings per function, and a
  # cached lowering would not run the lowering rule under test.
  fresh = lambda *a: f(*a)
  return jax.jit(fresh).trace(*args).lower(lowering_platforms=("cuda",))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.JaxlibAutotuningMixin, cache_util.EmptyCacheMixin,
                       testing.TestCase):

  def _inputs(self, n=1000, dtype=np.float32):
    return (jnp.asarray(self.random((n,), dtype)),
            jnp.asarray(self.random((n,), dtype)))

  def test_eager_call_on_gpus_loads_a_float_and_compiles_an_int_in(self):
    # The call the front door makes for an eager call on a GPU (its
    # positional scalars may come at run time), cross-lowered from here.
    n = 32
    x = jnp.asarray(self.random((n,)))
    like = jax.ShapeDtypeStruct(x.shape, x.dtype)
    with mock.patch.object(jax, "default_backend", lambda: "gpu"):
      call = _kernel_call.make(
          scale_kernel, like, (4,), {"BLOCK": 8, "compute_capability": 90},
          (_kernel_call.OPERAND, 2.5, n), runtime_scalars=True)
      lowered = call._jitted.trace(x, 2.5).lower(  # pylint: disable=protected-access
          lowering_platforms=("cuda",))
    self.assertEqual(call.passed, (True, True, False))
    (kernel,) = util.triton_custom_calls(lowered)[0]["calls"]
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("array", 0, 16), ("i32", n), ("array", 0, 16)])

  def test_custom_call_carries_kernel_and_ptx(self):
    x, y = self._inputs()
    (call,) = util.triton_custom_calls(_lower(_add, x, y))
    # CUDA's default: the legacy target (see _gpu.lowering.default_target).
    self.assertEqual(call["target"], "triton_kernel_call")
    self.assertFalse(call["autotuned"])
    (kernel,) = call["calls"]
    self.assertEqual(kernel["name"], "add_kernel")
    self.assertIn(".target sm_90", kernel["ptx"])
    self.assertIn(".entry add_kernel", kernel["ptx"])
    self.assertEqual(kernel["compute_capability"], 90)
    self.assertEqual(kernel["num_warps"], 4)
    self.assertEqual(kernel["grid"], (8, 1, 1))
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("array", 0, 16), ("i32", 1000), ("array", 0, 16)])

  @parameterized.parameters(80, 86, 90)
  def test_compute_capability_selects_sm(self, cc):
    x, y = self._inputs()
    (call,) = util.triton_custom_calls(
        _lower(lambda a, b: _add(a, b, compute_capability=cc), x, y))
    self.assertIn(f".target sm_{cc}", call["calls"][0]["ptx"])

  def test_name_and_metadata_recorded(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, name="my_add", serialized_metadata=b"meta!")
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertEqual(call["name"], "my_add")
    self.assertEqual(call["metadata"], b"meta!")

  def test_scalars_equal_to_one_become_constants(self):
    x = jnp.asarray(self.random((1,)))
    (call,) = util.triton_custom_calls(_lower(_add, x, x))
    # n == 1 is specialised away, as Triton's launcher does.
    self.assertEqual(call["calls"][0]["params"], [("array", 0, 16)] * 3)

  def test_float_and_bool_scalars_are_passed(self):
    x = jnp.asarray(self.random((300,)))
    alpha = float(self.np_rng.uniform(2.0, 3.0))

    def f(a):
      return jt_dist.triton_call(
          a, alpha, True, a.size, kernel=scale_negate_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(3,),
          BLOCK=128, compute_capability=90)

    (call,) = util.triton_custom_calls(_lower(f, x))
    params = call["calls"][0]["params"]
    self.assertEqual(params[0], ("array", 0, 16))
    self.assertEqual(params[1][0], "f32")
    self.assertAlmostEqual(params[1][1], alpha, places=5)
    self.assertEqual(params[2:], [("bool", True), ("i32", 300),
                                  ("array", 0, 16)])

  def test_legacy_target(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name="triton_kernel_call")
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertEqual(call["target"], "triton_kernel_call")
    self.assertIn(".target sm_90", call["calls"][0]["ptx"])

  def test_falls_back_to_legacy_without_ffi_target(self):
    x, y = self._inputs()
    with mock.patch.object(_compat, "triton_ffi_targets",
                           return_value=frozenset()):
      (call,) = util.triton_custom_calls(_lower(_add, x, y))
    self.assertEqual(call["target"], "triton_kernel_call")

  def test_preferring_legacy_switches_the_default_target(self):
    x, y = self._inputs()
    with mock.patch.object(_gpu_lowering, "PREFER_LEGACY_TARGET", True):
      (plain,) = util.triton_custom_calls(_lower(_add, x, y))
      costed = lambda a, b: _add(a, b, cost_estimate={"flops": a.size})
      (with_cost,) = util.triton_custom_calls(_lower(costed, x, y))
    self.assertEqual(plain["target"], "triton_kernel_call")
    self.assertEqual(with_cost["target"], "triton_kernel_call_ffi")

  def test_ffi_requested_but_missing_errors(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b,
                          custom_call_target_name="triton_kernel_call_ffi")
    with mock.patch.object(_compat, "triton_ffi_targets",
                           return_value=frozenset()):
      with self.assertRaisesRegex(ValueError, "does not register it for cuda"):
        _lower(f, x, y)

  def test_unknown_target_name_errors(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name="my_call")
    with self.assertRaisesRegex(ValueError, "'my_call' is not a Triton target"):
      _lower(f, x, y)

  def test_autotuned_kernel_has_one_compiled_kernel_per_config(self):
    x, y = self._inputs(n=512)
    f = lambda a, b: _tuned_add(a, b, input_output_aliases={0: 0})
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertTrue(call["autotuned"])
    self.assertLen(call["calls"], 3)
    self.assertEqual([c["num_warps"] for c in call["calls"]], [2, 4, 8])
    self.assertEqual([c["grid"][0] for c in call["calls"]], [8, 4, 2])
    self.assertLen({c["ptx"] for c in call["calls"]}, 3)
    for kernel in call["calls"]:
      self.assertIn(".target sm_90", kernel["ptx"])
    self.assertIn("BLOCK: 64", call["descriptions"][0])
    self.assertEqual(call["aliases"], [(0, 0, 512 * 4)])
    self.assertIn("operand_index = 0", call["aliases_text"])

  def test_pinned_config_is_lowered_alone_without_a_device(self):
    # Cross-lowering has no CUDA device to time on: a pin still applies,
    # and the call carries the pinned kernel alone, without jaxlib's tuning.
    x, y = self._inputs(n=512)
    jt_dist.pin_autotune_config(tuned_add_kernel, BLOCK=128)
    self.addCleanup(jt_dist.pin_autotune_config, tuned_add_kernel, None)
    (call,) = util.triton_custom_calls(_lower(_tuned_add, x, y))
    self.assertFalse(call["autotuned"])
    self.assertEqual(call["calls"][0]["num_warps"], 4)
    self.assertEqual(call["calls"][0]["grid"][0], 4)

  def test_no_module_image_for_jaxlib_without_the_field(self):
    x, y = self._inputs()
    with mock.patch.object(_compat, "jaxlib_takes_module_image",
                           lambda: False):
      (call,) = util.triton_custom_calls(_lower(_add, x, y))
    self.assertIsNone(call["calls"][0]["module_image"])

  def test_module_image_carries_the_cubin(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name=_FFI)
    with mock.patch.object(_compat, "jaxlib_takes_module_image", lambda: True):
      (call,) = util.triton_custom_calls(_lower(f, x, y))
    (kernel,) = call["calls"]
    image = kernel["module_image"]
    self.assertEqual(call["target"], "triton_kernel_call_ffi")
    self.assertEqual(image["object_file"][:4], b"\x7fELF")
    self.assertEqual(image["kernel_name"], "add_kernel")
    self.assertEqual(image["shared_mem"], kernel["shared_mem"])
    # The rest of the call is what jaxlib serialised.
    self.assertIn(".entry add_kernel", kernel["ptx"])
    self.assertEqual(kernel["grid"], (8, 1, 1))

  @parameterized.parameters("triton_kernel_call", _FFI)
  def test_an_aliased_output_before_a_bound_one_comes_last(self, target):
    # jaxlib hands pointer parameters the operands, then the results, in
    # order: output 0 (aliased, no parameter) must not reach total_ptr.
    x, acc = self._inputs(n=64)

    def f(a, b):
      return jt_dist.triton_call(
          a, b, a.size, kernel=acc_sum_kernel,
          out_shape=(jax.ShapeDtypeStruct(b.shape, b.dtype),
                     jax.ShapeDtypeStruct((1,), jnp.float32)),
          grid=(2,), BLOCK=32, input_output_aliases={1: 0},
          zeroed_outputs=(1,), compute_capability=90,
          custom_call_target_name=target)

    lowered = _lower(f, x, acc)
    (call,) = util.triton_custom_calls(lowered)
    self.assertIn("output_tuple_indices = [1], operand_index = 1",
                  call["aliases_text"])
    self.assertEqual([p[0] for p in call["calls"][0]["params"]],
                     ["array", "array", "i32", "array"])
    self.assertEqual(call["calls"][0]["params"][3][1], 4)  # total zeroed.
    text = lowered.as_text()
    self.assertRegex(text, r"-> \(tensor<1xf32>, tensor<64xf32>\)")
    self.assertRegex(text, r"return %\d+#1, %\d+#0")
    (eqn,) = jax.make_jaxpr(f)(x, acc).eqns
    self.assertEqual(_gpu_lowering.result_order(eqn.params["spec"]), (1, 0))

  def test_legacy_target_leaves_the_cubin_out(self):
    # jaxlib hashes the whole legacy call on every launch.
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name="triton_kernel_call")
    with mock.patch.object(_compat, "jaxlib_takes_module_image", lambda: True):
      (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertEqual(call["target"], "triton_kernel_call")
    self.assertIsNone(call["calls"][0]["module_image"])
    self.assertIn(".entry add_kernel", call["calls"][0]["ptx"])

  def test_ttir_only_on_request_and_padding_is_ignored(self):
    x, y = self._inputs()
    (plain,) = util.triton_custom_calls(_lower(_add, x, y))
    with mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(ttir=True,
                                                      padding_bytes=4096)):
      (padded,) = util.triton_custom_calls(_lower(_add, x, y))
    self.assertEqual(plain["calls"][0]["ttir"], "")
    self.assertIn("tt.func", padded["calls"][0]["ttir"])
    self.assertEqual({**padded["calls"][0], "ttir": ""}, plain["calls"][0])

  def test_module_image_per_autotuning_config_survives_the_disk_cache(self):
    x, y = self._inputs(n=512)
    f = lambda a, b: _tuned_add(a, b, custom_call_target_name=_FFI)
    with mock.patch.object(_compat, "jaxlib_takes_module_image", lambda: True):
      (first,) = util.triton_custom_calls(_lower(f, x, y))
      _cache.memory_cache.clear()
      (second,) = util.triton_custom_calls(_lower(f, x, y))
    images = [c["module_image"] for c in first["calls"]]
    self.assertLen({i["object_file"] for i in images}, 3)
    self.assertEqual([i["object_file"][:4] for i in images], [b"\x7fELF"] * 3)
    self.assertEqual(first["descriptions"], second["descriptions"])
    self.assertEqual(first["calls"], second["calls"])

  def test_aliases_become_output_operand_aliases(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, input_output_aliases={1: 0})
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertIn("output_tuple_indices = []", call["aliases_text"])
    self.assertIn("operand_index = 1", call["aliases_text"])

  def test_zeroed_outputs(self):
    x, y = self._inputs(n=300)
    f = lambda a, b: _add(a, b, zeroed_outputs=(0,))
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertEqual(call["calls"][0]["params"][-1], ("array", 300 * 4, 16))

  def test_num_ctas_before_hopper_errors(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, compute_capability=80, num_ctas=2)
    with self.assertRaisesRegex(ValueError, r"num_ctas=2.*sm_80"):
      _lower(f, x, y)

  def test_num_ctas_on_hopper(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, num_ctas=2)
    (call,) = util.triton_custom_calls(_lower(f, x, y))
    self.assertEqual(call["calls"][0]["num_ctas"], 2)

  def test_missing_compute_capability_without_gpu_errors(self):
    if testing.platform() == "gpu":
      self.skipTest("needs a host without GPUs; this one has GPUs")
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, compute_capability=None)
    with self.assertRaisesRegex(ValueError, r"no CUDA device.*compute_capability="):
      _lower(f, x, y)

  def test_shared_memory_over_limit_errors(self):
    # 4 stages of 64x128 and 128x64 float32 tiles: 262144 bytes, over
    # sm_90's 232448 (small tiles: Triton compiles them in a fraction of the
    # time of larger ones).
    a = jnp.asarray(self.random((64, 512)))
    b = jnp.asarray(self.random((512, 64)))

    def f(a, b):
      return jt_dist.triton_call(
          a, b, kernel=matmul_kernel,
          out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32), grid=(1,),
          BM=64, BN=64, BK=128, K=512, num_stages=4, compute_capability=90)

    with self.assertRaisesRegex(
        ValueError, r"'matmul_kernel'.*bytes of shared memory.*232448.*sm_90"):
      _lower(f, a, b)

  @parameterized.parameters((1024, 4), (1000, 3))
  def test_integers_divisible_by_16_are_specialised(self, n, hints):
    # As Triton's launcher does: the three pointers always carry the hint,
    # the size only when it is a multiple of 16.
    x, y = self._inputs(n=n)
    with _with_ttir():
      (call,) = util.triton_custom_calls(_lower(_add, x, y))
    (kernel,) = call["calls"]
    self.assertEqual(kernel["ttir"].count("tt.divisibility = 16"), hints)

  def test_autotuning_drops_configs_over_shared_memory(self):
    # The first config needs 262144 bytes of shared memory (over sm_90's
    # 232448); the second, one stage of 64x32 tiles, fits.
    a = jnp.asarray(self.random((64, 512)))
    b = jnp.asarray(self.random((512, 64)))
    tuned = triton.autotune(
        configs=[triton.Config(dict(BM=64, BN=64, BK=128), num_stages=4),
                 triton.Config(dict(BM=64, BN=64, BK=32), num_stages=1)],
        key=[])(matmul_kernel)

    def f(a, b):
      return jt_dist.triton_call(
          a, b, kernel=tuned, grid=(1,), K=512, compute_capability=90,
          out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32))

    with self.assertLogs("jt_dist", level="WARNING") as logs:
      (call,) = util.triton_custom_calls(_lower(f, a, b))
    self.assertFalse(call["autotuned"])  # One config left: a plain call.
    self.assertLen(call["calls"], 1)
    self.assertRegex("\n".join(logs.output),
                     r"dropping autotuning config.*BK: 128.*shared memory")

  def test_missing_plugin_errors(self):
    x, y = self._inputs()
    with mock.patch.object(_compat, "gpu_triton_module", return_value=None):
      with self.assertRaisesRegex(RuntimeError, "plugin is not installed"
                                  ) as raised:
        _lower(_add, x, y)
    # jt_dist is on no package index: each advised pip works from its clone
    # (an extra that pyproject.toml declares), or asks for this jax's plugin.
    with open(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "pyproject.toml")) as f:
      extras = re.search(r"(?ms)^\[project.optional-dependencies\]$(.*?)^\[",
                         f.read()).group(1)
    commands = re.findall(r"`([^`]*)`", str(raised.exception))
    self.assertIn('pip install -e ".[cuda12]"', commands)
    for command in commands:
      with self.subTest(command=command):
        local = re.fullmatch(r'(?:pip install -e )?"\.\[(\w+)\]"', command)
        plugin = re.fullmatch(r'pip install "jax\[cuda1[23]\]==([^"]+)"',
                              command)
        self.assertTrue(local or plugin, command)
        if local:
          self.assertRegex(extras, rf"(?m)^{local.group(1)} = ")
        else:
          self.assertEqual(plugin.group(1), jax.__version__)

  def test_global_scratch_needs_newer_jaxlib(self):
    lib = _gpu_lowering.plugin("cuda")
    try:
      lib.TritonKernel("k", 4, 1, 0, "ptx", "ttir", 90, 1024, 16)
    except TypeError:
      pass
    else:
      self.skipTest("this jaxlib's TritonKernel takes a global scratch size")
    with self.assertRaisesRegex(NotImplementedError,
                                r"'k' needs 1024 bytes of global scratch"):
      _compat.make_triton_kernel(lib, "k", 4, 1, 0, "ptx", "ttir", 90, 1024, 16)

  def test_profile_scratch_errors(self):
    x, y = self._inputs()
    real = _compile.compiled_kernel

    def with_profiling(*args):
      compiled, specialization = real(*args)
      return (_compile.dataclasses.replace(compiled, profile_scratch_size=64),
              specialization)

    with mock.patch.object(_compile, "compiled_kernel", with_profiling):
      with self.assertRaisesRegex(NotImplementedError, "profile scratch"):
        _lower(_add, x, y)

  def test_tensor_memory_over_limit_errors(self):
    x, y = self._inputs()
    real = _compile._run_stages

    def big_tmem(*args):
      irs, metadata = real(*args)
      return irs, {**metadata, "tmem_size": 1024}

    with mock.patch.object(_compile, "_run_stages", big_tmem):
      with self.assertRaisesRegex(ValueError, "1024 columns of tensor memory"):
        _lower(_add, x, y)

  def test_debug_prints_irs(self):
    x, y = self._inputs()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      _lower(lambda a, b: _add(a, b, debug=True), x, y)
    text = out.getvalue()
    for stage in ("ttir", "ttgir", "llir", "ptx"):
      self.assertIn(f"add_kernel {stage} -----", text)
    self.assertIn(".target sm_90", text)

  def test_dump_dir_receives_irs_and_metadata(self):
    x, y = self._inputs()
    with tempfile.TemporaryDirectory() as dump:
      with mock.patch.dict(os.environ, {"JT_DIST_DUMP_DIR": dump}):
        _lower(_add, x, y)
      (folder,) = os.listdir(dump)
      files = set(os.listdir(os.path.join(dump, folder)))
      for ext in ("ttir", "ttgir", "llir", "ptx", "json"):
        self.assertIn(f"add_kernel.{ext}", files)
      with open(os.path.join(dump, folder, "add_kernel.json")) as f:
        self.assertIn('"shared_mem"', f.read())

  def test_shard_map_lowers_per_shard(self):
    mesh = jax.make_mesh((2,), ("i",), devices=self.devices(2))
    spec = jax.sharding.PartitionSpec("i")
    x = jax.device_put(jnp.asarray(self.random((512,))),
                       jax.sharding.NamedSharding(mesh, spec))
    f = jax.shard_map(lambda a: _add(a, a), mesh=mesh, in_specs=spec,
                      out_specs=spec)
    (call,) = util.triton_custom_calls(_lower(f, x))
    self.assertEqual(call["calls"][0]["params"][2], ("i32", 256))

  @parameterized.parameters(90, None)
  def test_partially_manual_shard_map_lowers(self, cc):
    # The axis context of a partially manual shard_map holds an
    # AbstractMesh, whose .devices raises ValueError, not AttributeError.
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=self.devices(4),
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    spec = jax.sharding.PartitionSpec("x")
    x = jax.device_put(jnp.asarray(self.random((512,))),
                       jax.sharding.NamedSharding(mesh, spec))
    f = jax.shard_map(lambda a: _add(a, a, compute_capability=cc), mesh=mesh,
                      in_specs=spec, out_specs=spec, axis_names={"x"})
    if cc is None and testing.platform() != "gpu":
      with self.assertRaisesRegex(ValueError,
                                  r"no CUDA device.*compute_capability="):
        _lower(f, x)
      return
    (call,) = util.triton_custom_calls(_lower(f, x))
    self.assertEqual(call["calls"][0]["params"][2], ("i32", 256))


def _fake_device(platform, cc, ident):
  return types.SimpleNamespace(platform=platform, compute_capability=cc,
                               id=ident, __str__=lambda self=None: f"d{ident}")


def _ctx(devices):
  return types.SimpleNamespace(module_context=types.SimpleNamespace(
      axis_context=types.SimpleNamespace(device_assignment=tuple(devices),
                                         num_devices=len(devices))))


class DefaultTargetTest(parameterized.TestCase):
  """Which custom-call target a call that names none gets (pure logic)."""

  @parameterized.product(exporting=[False, True], cost_estimate=[False, True],
                         prefer_legacy=[False, True, None])
  def test_without_ffi_always_legacy(self, exporting, cost_estimate,
                                     prefer_legacy):
    self.assertEqual(
        _gpu_lowering.default_target(False, exporting=exporting,
                                     cost_estimate=cost_estimate,
                                     prefer_legacy=prefer_legacy),
        _gpu_lowering.LEGACY_TARGET)

  @parameterized.product(exporting=[False, True], cost_estimate=[False, True])
  def test_ffi_by_default(self, exporting, cost_estimate):
    self.assertEqual(
        _gpu_lowering.default_target(True, exporting=exporting,
                                     cost_estimate=cost_estimate,
                                     prefer_legacy=False),
        _gpu_lowering.FFI_TARGET)

  @parameterized.parameters((True, False), (False, True), (True, True))
  def test_preferring_legacy_keeps_ffi_where_needed(self, exporting,
                                                    cost_estimate):
    self.assertEqual(
        _gpu_lowering.default_target(True, exporting=exporting,
                                     cost_estimate=cost_estimate,
                                     prefer_legacy=True),
        _gpu_lowering.FFI_TARGET)

  def test_preferring_legacy_elsewhere(self):
    self.assertEqual(
        _gpu_lowering.default_target(True, exporting=False,
                                     cost_estimate=False, prefer_legacy=True),
        _gpu_lowering.LEGACY_TARGET)

  def test_module_setting_is_the_default(self):
    for prefer in (False, True):
      with mock.patch.object(_gpu_lowering, "PREFER_LEGACY_TARGET", prefer):
        self.assertEqual(
            _gpu_lowering.default_target(True, exporting=False,
                                         cost_estimate=False),
            _gpu_lowering.LEGACY_TARGET if prefer
            else _gpu_lowering.FFI_TARGET)


class TargetTest(testing.TestCase):

  def test_override_wins(self):
    ctx = _ctx([_fake_device("cuda", "8.0", 0)])
    self.assertEqual(_target.resolve_target(ctx, "cuda", 90).arch, 90)

  def test_devices_of_the_lowering_not_device_zero(self):
    ctx = _ctx([_fake_device("cuda", "8.6", 1)])
    with mock.patch.object(_target, "local_devices",
                           return_value=[_fake_device("cuda", "9.0", 0)]):
      self.assertEqual(_target.resolve_target(ctx, "cuda", None).arch, 86)

  def test_differing_devices_compile_for_lowest_with_a_note(self):
    ctx = _ctx([_fake_device("cuda", "9.0", 0), _fake_device("cuda", "8.0", 1)])
    with self.assertLogs("jt_dist", "WARNING") as logs:
      self.assertEqual(_target.resolve_target(ctx, "cuda", None).arch, 80)
    self.assertIn("Compiling for the lowest, 80", "\n".join(logs.output))

  def test_cpu_devices_do_not_count(self):
    if testing.platform() == "gpu":
      self.skipTest("needs a host without GPUs; this one has GPUs")
    ctx = _ctx([_fake_device("cpu", None, 0)])
    with self.assertRaisesRegex(ValueError, "compute_capability="):
      _target.resolve_target(ctx, "cuda", None)

  def test_rocm_arch_from_devices(self):
    ctx = _ctx([_fake_device("rocm", "gfx942:sramecc+:xnack-", 0)])
    target = _target.resolve_target(ctx, "rocm", None)
    self.assertEqual((target.arch, target.warp_size), ("gfx942", 64))

  def test_rocm_differing_archs_error(self):
    ctx = _ctx([_fake_device("rocm", "gfx942", 0),
                _fake_device("rocm", "gfx90a", 1)])
    with self.assertRaisesRegex(ValueError, r"differ in GPU arch.*gfx90a"):
      _target.resolve_target(ctx, "rocm", None)

  def test_rocm_without_device_errors(self):
    with self.assertRaisesRegex(ValueError, r"ROCm GPU arch \(gfx...\)"):
      _target.resolve_target(_ctx([]), "rocm", None)

  @parameterized.parameters((90, 232448), (80, 166912), (86, 101376),
                            (89, 101376), (75, 65536), (100, 232448))
  def test_shared_memory_table(self, cc, limit):
    self.assertEqual(
        _target.shared_memory_limit(_target.Target("cuda", cc)), limit)


if __name__ == "__main__":
  absltest.main()
