"""Cross-lowering ``triton_call`` for ROCm (gfx942, gfx90a) on a CPU host.

Needs JAX's ROCm plugin (jax-rocm7-plugin, --no-deps); on a host without
ROCm, conftest.py loads a stub HIP runtime so that the plugin's Triton
bindings import. Each test checks what reaches jaxlib: the HSACO is an
AMDGPU code object for the arch asked for, and the kernel name, grid,
warps, shared memory and parameters match what Triton reports. Where the
stub is loaded, jaxlib's own ROCm call is run on it, which shows which
module image jaxlib loads and how it launches it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import triton
from triton.backends import compiler as triton_backends
from triton.compiler import compiler as triton_compiler

import jt_dist
from jt_dist import _compat
from jt_dist import testing
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist._backend import target as _target
import amdgpu_elf
import cache_util
import gpu_lowering_util as util
import hip_stub
from feature_kernels import add_kernel
from feature_kernels import scale_negate_kernel

ARCHS = ("gfx942", "gfx90a")
_HERE = os.path.dirname(os.path.abspath(__file__))


_CONFIGS = [
    triton.Config({"BLOCK": 64}, num_warps=2),
    triton.Config({"BLOCK": 128}, num_warps=4),
    triton.Config({"BLOCK": 256}, num_warps=8),
]
tuned_add_kernel = triton.autotune(configs=_CONFIGS, key=["n"])(add_kernel)


def _with_ttir():
  """Lowerings inside the block carry each kernel's TTIR, for tests to read."""
  return mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(ttir=True))


def _add(x, y, arch, block=128, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, block),), BLOCK=block,
      compute_capability=arch, **options)


def _rocm_calls(f, *args):
  return util.triton_custom_calls(util.lower(f, *args, platform="rocm"))


def _triton_reference(kernel, signature, constexprs, arch, num_warps):
  """``triton.compile``'s own result for the launch, pointers 16-aligned."""
  target = triton_backends.GPUTarget("hip", arch, 64)
  divisible = triton_compiler.make_backend(target).parse_attr("D")
  names = list(signature)
  attrs = {(names.index(name),): divisible
           for name, kind in signature.items() if kind.startswith("*")}
  source = triton_compiler.ASTSource(kernel, signature, constexprs, attrs)
  with tempfile.TemporaryDirectory() as cache:
    with mock.patch.dict(os.environ, {"TRITON_CACHE_DIR": cache}):
      return triton.compile(source, target=target,
                            options={"num_warps": num_warps})


_ADD_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                  "out_ptr": "*fp32", "BLOCK": "constexpr"}


@unittest.skipUnless(util.HAS_ROCM_TRITON_CALL, util.ROCM_SKIP_REASON)
class RocmLoweringTest(util.JaxlibAutotuningMixin, cache_util.EmptyCacheMixin,
                       testing.TestCase):

  def _inputs(self, n=1000):
    return (jnp.asarray(self.random((n,))), jnp.asarray(self.random((n,))))

  def hsaco(self, kernel) -> bytes:
    """The HSACO a decoded kernel call gives jaxlib, inline or in a file.

    jaxlib 0.11.1 and later take it inline (``module_image``), and the
    ``ptx`` field names its content; older ones read the file named there.
    """
    image = kernel["module_image"]
    if _gpu_lowering.rocm_binary_inline():
      self.assertEqual(image["kernel_name"], kernel["name"])
      self.assertEqual(image["shared_mem"], kernel["shared_mem"])
      self.assertStartsWith(kernel["ptx"],
                            f"jt_dist-inline-hsaco:{kernel['name']}-")
      self.assertFalse(os.path.exists(kernel["ptx"]))
      return image["object_file"]
    self.assertIsNone(image)
    with open(kernel["ptx"], "rb") as f:
      return f.read()

  def assertHsacoFor(self, image, arch, name, num_warps, shared_mem):
    """``image`` is an AMDGPU code object of kernel ``name`` for ``arch``."""
    hsaco = amdgpu_elf.parse(image)
    self.assertEqual(hsaco.machine, amdgpu_elf.EM_AMDGPU)
    self.assertEqual(hsaco.os_abi, amdgpu_elf.ELFOSABI_AMDGPU_HSA)
    self.assertEqual(hsaco.e_type, amdgpu_elf.ET_DYN)
    self.assertEqual(hsaco.mach, amdgpu_elf.MACH[arch],
                     f"e_flags 0x{hsaco.flags:x} is not {arch}'s")
    self.assertContainsSubset({name, f"{name}.kd"}, hsaco.symbols)
    self.assertEqual(amdgpu_elf.metadata_int(image, ".wavefront_size"), 64)
    self.assertEqual(
        amdgpu_elf.metadata_int(image, ".max_flat_workgroup_size"),
        num_warps * 64)
    self.assertEqual(
        amdgpu_elf.metadata_int(image, ".group_segment_fixed_size"),
        shared_mem)

  @parameterized.product(arch=ARCHS, alone=(True, False))
  def test_call_carries_the_hsaco_triton_compiles(self, arch, alone):
    # Alone, the call is the program that eager dispatch compiles; else it
    # sits in a larger jitted computation.
    x, y = self._inputs()
    f = ((lambda a, b: _add(a, b, arch)) if alone
         else (lambda a, b: _add(a * 2, b, arch) + 1))
    (call,) = _rocm_calls(f, x, y)
    self.assertEqual(call["target"], "triton_kernel_call_ffi")
    (kernel,) = call["calls"]
    reference = _triton_reference(add_kernel, _ADD_SIGNATURE, {"BLOCK": 128},
                                  arch, 4)
    image = self.hsaco(kernel)
    self.assertEqual(image, reference.asm["hsaco"])
    self.assertEqual(kernel["name"], reference.metadata.name)
    self.assertEqual(kernel["num_warps"], reference.metadata.num_warps)
    self.assertEqual(kernel["shared_mem"], reference.metadata.shared)
    self.assertEqual(kernel["grid"], (8, 1, 1))
    self.assertEqual(kernel["params"], [
        ("array", 0, 16), ("array", 0, 16), ("i32", 1000), ("array", 0, 16)])
    self.assertEqual(kernel["compute_capability"], 0)
    self.assertHsacoFor(image, arch, "add_kernel", 4, kernel["shared_mem"])

  @parameterized.parameters(*ARCHS)
  def test_jaxlib_loads_and_launches_what_triton_reports(self, arch):
    if hip_stub.stub_path() is None:
      self.skipTest(f"needs the stub HIP runtime ({hip_stub.STATUS})")
    x, y = self._inputs(n=3000)
    f = lambda a, b: _add(a, b, arch, block=256, num_warps=8,
                          zeroed_outputs=(0,),
                          custom_call_target_name="triton_kernel_call")
    lowered = util.lower(f, x, y, platform="rocm")
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    image = self.hsaco(kernel)  # Before jaxlib deletes a file holding it.
    launch = hip_stub.launch_legacy_call(
        _gpu_lowering.plugin("rocm"), util.legacy_opaque(lowered), 3)
    self.assertEqual(launch.launches, 1)
    self.assertEqual(launch.image, image)
    self.assertEqual(launch.kernel_name, "add_kernel")
    self.assertEqual(launch.grid, (12, 1, 1))
    self.assertEqual(launch.block, (8 * 64, 1, 1))  # 64-wide wavefronts.
    self.assertEqual(launch.shared_mem, kernel["shared_mem"])
    self.assertEqual((launch.memsets, launch.memset_bytes), (1, 3000 * 4))
    self.assertHsacoFor(launch.image, arch, "add_kernel", 8,
                        kernel["shared_mem"])

  @parameterized.parameters(*ARCHS)
  def test_autotuned_kernel_carries_one_hsaco_per_config(self, arch):
    x, y = self._inputs(n=512)
    f = lambda a, b: jt_dist.triton_call(
        a, b, a.size, kernel=tuned_add_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=lambda meta: (triton.cdiv(a.size, meta["BLOCK"]),),
        input_output_aliases={0: 0}, compute_capability=arch)
    (call,) = _rocm_calls(f, x, y)
    self.assertTrue(call["autotuned"])
    self.assertEqual([c["num_warps"] for c in call["calls"]], [2, 4, 8])
    self.assertEqual([c["grid"][0] for c in call["calls"]], [8, 4, 2])
    images = [self.hsaco(c) for c in call["calls"]]
    self.assertLen(set(images), 3)
    # jaxlib caches loaded modules by name, shared memory and this field.
    self.assertLen({c["ptx"] for c in call["calls"]}, 3)
    for kernel, config in zip(call["calls"], _CONFIGS):
      reference = _triton_reference(add_kernel, _ADD_SIGNATURE,
                                    config.kwargs, arch, config.num_warps)
      self.assertEqual(self.hsaco(kernel),
                       reference.asm["hsaco"])
      self.assertHsacoFor(self.hsaco(kernel), arch,
                          "add_kernel", config.num_warps, kernel["shared_mem"])
    self.assertIn("BLOCK: 64", call["descriptions"][0])
    self.assertEqual(call["aliases"], [(0, 0, 512 * 4)])

  @parameterized.parameters(*ARCHS)
  def test_sharded_triton_call_over_8_devices(self, arch):
    devices = self.devices(8)[:8]
    mesh = jax.make_mesh((8,), ("x",), devices=devices)
    n = 8 * 384
    sharding = NamedSharding(mesh, P("x"))
    x = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)

    def f(a, b):
      return jt_dist.sharded_triton_call(
          a, b, jt_dist.shard_size(0), kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct((n,), jnp.float32),
          grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
          mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
          BLOCK=128, compute_capability=arch)

    (call,) = _rocm_calls(f, x, x)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (3, 1, 1))
    self.assertEqual(kernel["params"][2], ("i32", 384))
    self.assertHsacoFor(self.hsaco(kernel), arch,
                        "add_kernel", 4, kernel["shared_mem"])

  @parameterized.parameters(*ARCHS)
  def test_sharding_rule_call_splits_per_shard(self, arch):
    devices = self.devices(8)[:8]
    mesh = jax.make_mesh((8,), ("x",), devices=devices,
                         axis_types=(AxisType.Explicit,))
    n = 8 * 256
    x = jax.ShapeDtypeStruct((n,), jnp.float32,
                             sharding=NamedSharding(mesh, P("x")))

    def f(a, b):
      return jt_dist.triton_call(
          a, b, jt_dist.shard_size(0), kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
          sharding_rule=jt_dist.ShardingRule("i, i -> i"), BLOCK=64,
          compute_capability=arch)

    (call,) = _rocm_calls(f, x, x)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (4, 1, 1))
    self.assertEqual(kernel["params"][2], ("i32", 256))
    self.assertHsacoFor(self.hsaco(kernel), arch,
                        "add_kernel", 4, kernel["shared_mem"])

  @parameterized.parameters(*ARCHS)
  def test_vmap_puts_the_batch_on_the_grid(self, arch):
    x = jax.ShapeDtypeStruct((5, 1000), jnp.float32)
    y = jax.ShapeDtypeStruct((1000,), jnp.float32)
    f = jax.vmap(lambda a, b: _add(a, b, arch), in_axes=(0, None))
    (call,) = _rocm_calls(f, x, y)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (8, 5, 1))
    self.assertLen([p for p in kernel["params"] if p[0] == "array"], 3)
    self.assertHsacoFor(self.hsaco(kernel), arch,
                        kernel["name"], 4, kernel["shared_mem"])

  @parameterized.parameters(*ARCHS)
  def test_zeroed_and_aliased_outputs(self, arch):
    x, y = self._inputs(n=300)
    (zeroed,) = _rocm_calls(
        lambda a, b: _add(a, b, arch, zeroed_outputs=(0,)), x, y)
    self.assertEqual(zeroed["calls"][0]["params"][-1], ("array", 300 * 4, 16))
    (aliased,) = _rocm_calls(
        lambda a, b: _add(a, b, arch, input_output_aliases={1: 0}), x, y)
    self.assertIn("operand_index = 1", aliased["aliases_text"])
    self.assertIn("output_tuple_indices = []", aliased["aliases_text"])

  @parameterized.product(arch=ARCHS, n=(1, 300, 1024))
  def test_scalars_and_specialisation_are_those_of_cuda(self, arch, n):
    x = jnp.asarray(self.random((n,)))
    alpha = float(self.np_rng.uniform(2.0, 3.0))

    def f(a, cc):
      return jt_dist.triton_call(
          a, alpha, True, a.size, kernel=scale_negate_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
          grid=(triton.cdiv(n, 128),), BLOCK=128, compute_capability=cc)

    with _with_ttir():
      (rocm,) = _rocm_calls(lambda a: f(a, arch), x)
    (kernel,) = rocm["calls"]
    size = [] if n == 1 else [("i32", n)]  # 1 is specialised away.
    params = kernel["params"]
    self.assertEqual(params[1][0], "f32")
    self.assertAlmostEqual(params[1][1], alpha, places=5)
    self.assertEqual(
        [params[0]] + params[2:],
        [("array", 0, 16), ("bool", True)] + size + [("array", 0, 16)])
    # Two pointers, and the size where it is a multiple of 16.
    self.assertEqual(kernel["ttir"].count("tt.divisibility = 16"),
                     2 + (n % 16 == 0 and n != 1))
    if not util.HAS_TRITON_CALL:
      return  # The same expectations hold the CUDA suite's results.
    with _with_ttir():
      (cuda,) = util.triton_custom_calls(
          util.lower(lambda a: f(a, 90), x, platform="cuda"))
    self.assertEqual(cuda["calls"][0]["params"], params)
    self.assertEqual(cuda["calls"][0]["ttir"].count("tt.divisibility = 16"),
                     kernel["ttir"].count("tt.divisibility = 16"))

  @parameterized.parameters(*ARCHS)
  def test_hsaco_outlives_the_process_that_lowered_it(self, arch):
    # As an executable from JAX's persistent compilation cache would be:
    # lowered in a process that has ended, with its caches and temporary
    # files gone, and loaded by jaxlib in another.
    if hip_stub.stub_path() is None:
      self.skipTest(f"needs the stub HIP runtime ({hip_stub.STATUS})")
    result, opaques = _lowered_in_an_ended_process()
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    opaque = opaques[arch]
    (call,) = util.decode_any_call(hip_stub.decompressed(opaque))["calls"]
    plugin = _gpu_lowering.plugin("rocm")
    if not _gpu_lowering.rocm_binary_inline():
      # This jaxlib reads the HSACO from a file, which went with the child.
      self.assertIsNone(call["module_image"])
      with self.assertRaisesRegex(RuntimeError, re.escape(call["ptx"])):
        hip_stub.launch_legacy_call(plugin, opaque, 3)
      return
    self.assertStartsWith(call["ptx"], "jt_dist-inline-hsaco:")
    launch = hip_stub.launch_legacy_call(plugin, opaque, 3)
    self.assertEqual(launch.kernel_name, "add_kernel")
    self.assertEqual((launch.grid, launch.block), ((16, 1, 1), (128, 1, 1)))
    self.assertHsacoFor(launch.image, arch, "add_kernel", 2, launch.shared_mem)

  @parameterized.parameters(*ARCHS)
  def test_jaxlib_without_module_image_reads_then_deletes_a_file(self, arch):
    # Why the HSACO goes inline: a jaxlib that reads the file deletes it.
    x, y = self._inputs(n=200)
    f = lambda a, b: _add(a, b, arch, block=32, num_warps=1,
                          custom_call_target_name="triton_kernel_call")
    with mock.patch.object(_compat, "jaxlib_takes_module_image",
                           lambda: False):
      lowered = util.lower(f, x, y, platform="rocm")
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    self.assertIsNone(kernel["module_image"])
    path = kernel["ptx"]
    with open(path, "rb") as f:
      self.assertHsacoFor(f.read(), arch, "add_kernel", 1,
                          kernel["shared_mem"])
    if hip_stub.stub_path() is None:
      return
    launch = hip_stub.launch_legacy_call(_gpu_lowering.plugin("rocm"),
                                         util.legacy_opaque(lowered), 3)
    self.assertEqual(launch.block, (64, 1, 1))
    self.assertFalse(os.path.exists(path))

  @parameterized.parameters(*ARCHS)
  def test_export_carries_the_hsaco(self, arch):
    if not _gpu_lowering.rocm_binary_inline():
      self.skipTest("jaxlib before 0.11.1 cannot take the HSACO inline;"
                    " export_test.py checks the refusal")
    x = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with jt_dist.export_options(compute_capability=arch):
      exported = jax.export.export(
          jax.jit(lambda a, b: _add(a, b, None)), platforms=["rocm"],
          disabled_checks=jt_dist.export_safety_checks())(x, x)
    again = jax.export.deserialize(exported.serialize())
    (call,) = util.exported_triton_custom_calls(again)
    (kernel,) = call["calls"]
    self.assertHsacoFor(self.hsaco(kernel), arch, "add_kernel", 4,
                        kernel["shared_mem"])
    (recorded,) = jt_dist.exported_versions(again)
    self.assertEqual(
        (recorded.platform, recorded.compute_capability, recorded.binary,
         recorded.kernels), ("rocm", arch, "hsaco", ("add_kernel",)))
    self.assertEqual(jt_dist.check_exported(again, compute_capability=arch),
                     [])
    other = ARCHS[1 - ARCHS.index(arch)]
    with self.assertRaisesRegex(
        jt_dist.ExportError, rf"add_kernel were compiled for {arch}.*not on"
        rf" {other}.*compute_capability='{other}'"):
      jt_dist.check_exported(again, compute_capability=other)
    if testing.platform() != "gpu":
      with self.assertRaisesRegex(
          jt_dist.ExportError, rf"compiled for ROCm \({arch}\).*sees no"
          " ROCm device.*'gfx942'"):
        jt_dist.check_exported(again)
    with mock.patch.object(_compat, "jaxlib_takes_module_image",
                           lambda: False):
      with self.assertRaisesRegex(jt_dist.ExportError,
                                  r"add_kernel carry their HSACO.*0\.11\.1"):
        jt_dist.check_exported(again, compute_capability=arch)

  def test_export_without_arch_errors(self):
    if not _gpu_lowering.rocm_binary_inline():
      self.skipTest("jaxlib before 0.11.1 refuses ROCm exports first")
    x = jax.ShapeDtypeStruct((1000,), jnp.float32)
    with self.assertRaisesRegex(
        jt_dist.ExportError, r"'add_kernel' is being exported with jax.export"
        r" for rocm.*compute_capability='gfx942'"):
      jax.export.export(
          jax.jit(lambda a, b: _add(a, b, None)), platforms=["rocm"],
          disabled_checks=jt_dist.export_safety_checks())(x, x)

  def test_cuda_capability_for_rocm_errors(self):
    x, y = self._inputs()
    with self.assertRaisesRegex(
        ValueError, r"compute_capability=90 names a GPU of the other"
        r" platform.*lowered for rocm.*'gfx942'"):
      _rocm_calls(lambda a, b: _add(a, b, 90), x, y)

  def test_missing_arch_without_device_errors(self):
    if testing.platform() == "gpu":
      self.skipTest("needs a host without GPUs; this one has GPUs")
    x, y = self._inputs()
    with self.assertRaisesRegex(
        ValueError, r"no ROCm device.*compute_capability='gfx942'"):
      _rocm_calls(lambda a, b: _add(a, b, None), x, y)

  def test_missing_plugin_errors(self):
    x, y = self._inputs()
    with mock.patch.object(_compat, "gpu_triton_module", return_value=None):
      with self.assertRaisesRegex(RuntimeError, r"lowering for rocm.*ROCm"
                                  ) as raised:
        _rocm_calls(lambda a, b: _add(a, b, "gfx942"), x, y)
    # JAX's ROCm plugin follows jax's releases; no jax extra names it.
    self.assertIn(f'`pip install "jax-rocm7-plugin=={jax.__version__}"`',
                  str(raised.exception))


# Lowers a call for ROCm (legacy target) and writes its backend config.
# Lowers the add for every arch in ARCHS, each call's opaque to a file.
_CHILD = """
import os
import hip_stub
hip_stub.load_if_needed()
import jax, jax.numpy as jnp
import rocm_lowering_test as t
x = jnp.zeros((2000,), jnp.float32)
for arch in t.ARCHS:
  f = lambda a, b: t._add(a, b, arch, num_warps=2,
                          custom_call_target_name="triton_kernel_call")
  lowered = jax.jit(f).trace(x, x).lower(lowering_platforms=("rocm",))
  with open(os.path.join(os.environ["OPAQUE_DIR"], arch), "wb") as out:
    out.write(t.util.legacy_opaque(lowered))
"""


@functools.cache
def _lowered_in_an_ended_process():
  """One child lowers for every arch, then ends; its files go with it.

  A real interpreter, not a fork: the plugin must find the stub HIP runtime
  before jax is imported. Returns the child's ``CompletedProcess`` and each
  arch's opaque, read before the child's cache and temporary folder are
  deleted.
  """
  with tempfile.TemporaryDirectory() as work:
    env = dict(os.environ, JT_DIST_CACHE_DIR=os.path.join(work, "cache"),
               TMPDIR=work, OPAQUE_DIR=work,
               PYTHONPATH=os.pathsep.join(
                   [_HERE, os.path.dirname(_HERE),
                    os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", _CHILD], env=env,
                            capture_output=True, text=True, timeout=600,
                            check=False)
    opaques = {}
    for arch in ARCHS:
      path = os.path.join(work, arch)
      if os.path.exists(path):
        with open(path, "rb") as f:
          opaques[arch] = f.read()
  return result, opaques


class RocmTargetTest(testing.TestCase):
  """Choosing the ROCm target; needs no plugin."""

  def test_named_arch_wins(self):
    target = _target.resolve_target(None, "rocm", "gfx90a")
    self.assertEqual((target.arch, target.warp_size, target.describe()),
                     ("gfx90a", 64, "gfx90a"))

  def test_gfx_arch_for_cuda_errors(self):
    with self.assertRaisesRegex(
        ValueError, r"compute_capability='gfx942' names a GPU of the other"
        r" platform.*lowered for cuda.*such as 90"):
      _target.resolve_target(None, "cuda", "gfx942")

  @parameterized.parameters("gfx942:sramecc+", "GFX942", "942", "gfx")
  def test_malformed_arch_errors(self, arch):
    x = jnp.zeros((8,), jnp.float32)
    with self.assertRaisesRegex(
        TypeError,
        rf"compute_capability={re.escape(repr(arch))} of type str.*'gfx942'"):
      _add(x, x, arch)


if __name__ == "__main__":
  absltest.main()
