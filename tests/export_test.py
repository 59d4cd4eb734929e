"""``jax.export`` of functions calling ``triton_call``.

On a host without a GPU, functions are exported for CUDA (JAX's CUDA plugin
cross-lowers) and the serialised artifacts are checked: round trip, target,
compute capability, recorded versions, PTX or CUBIN. On a CUDA GPU, the
committed artifacts of examples/artifacts/ (made on a CPU host) and freshly
exported ones are deserialised and run against NumPy.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.interpreters import mlir
import jax.numpy as jnp
import jaxlib
import numpy as np
import triton

import jt_dist
from jt_dist import testing
import gpu_lowering_util as util

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ARTIFACTS = sorted(glob.glob(
    os.path.join(_ROOT, "examples", "artifacts", "*.jax_exported")))


def _load_example(name="export_kernel"):
  spec = importlib.util.spec_from_file_location(
      f"jt_dist_example_{name}", os.path.join(_ROOT, "examples", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


add_kernel = _load_example("add").add_kernel


def _add(x, y, **kwargs):
  return jt_dist.triton_call(
      x, y, x.size, kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, 128),), BLOCK=128, **kwargs)


def _export(f, *args, platforms=("cuda",), **options):
  checks = jt_dist.export_safety_checks()
  if not options:
    return jax.export.export(jax.jit(f), platforms=platforms,
                             disabled_checks=checks)(*args)
  with jt_dist.export_options(**options):
    return jax.export.export(jax.jit(f), platforms=platforms,
                             disabled_checks=checks)(*args)


def _without_records(exported):
  """``exported`` with its custom calls' frontend attributes taken out.

  So a module exported by another tool looks: it records no versions.
  """
  with mlir.make_ir_context() as context:
    module = mlir.ir.Module.parse(exported.mlir_module(), context=context)
    stripped = 0
    for op in util.walk_operations(module.operation):
      if (op.name == "stablehlo.custom_call"
          and "mhlo.frontend_attributes" in op.attributes):
        del op.attributes["mhlo.frontend_attributes"]
        stripped += 1
    assert stripped, "the exported module records nothing to take out"
    data = mlir.module_to_bytecode(module)
  return dataclasses.replace(exported, mlir_module_serialized=data)


def _cuda_capability():
  try:
    devices = jax.devices("cuda")
  except RuntimeError:
    return None
  return int(float(devices[0].compute_capability) * 10) if devices else None


@absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class ExportForCudaTest(testing.TestCase):

  def _inputs(self, n=None):
    n = n or int(self.np_rng.integers(100, 3000))
    return jnp.asarray(self.random(n)), jnp.asarray(self.random(n))

  @parameterized.product(cubin=(False, True), capability=(80, 90))
  def test_round_trip_records_target_and_versions(self, cubin, capability):
    x, y = self._inputs()
    exported = _export(_add, x, y, compute_capability=capability,
                       cubin=cubin)
    data = exported.serialize()
    loaded = jax.export.deserialize(data)
    self.assertEqual(loaded.platforms, ("cuda",))
    self.assertEqual(loaded.in_avals, (jax.typeof(x), jax.typeof(y)))
    (call,) = jt_dist.exported_versions(loaded)
    self.assertEqual(call.target, "triton_kernel_call_ffi")
    self.assertEqual(call.kernels, ("add_kernel",))
    self.assertEqual(call.compute_capability, capability)
    self.assertEqual(call.binary, "cubin" if cubin else "ptx")
    self.assertEqual(call.jaxlib, jaxlib.__version__)
    self.assertEqual(call.triton, triton.__version__)
    self.assertEqual(call.jax, jax.__version__)
    self.assertEqual(call.jt_dist, jt_dist.__version__)
    text = loaded.mlir_module()
    self.assertIn("stablehlo.custom_call @triton_kernel_call_ffi", text)
    self.assertIn(f'jt_dist_compute_capability = "{capability}"', text)
    (decoded,) = util.exported_triton_custom_calls(loaded)
    (kernel,) = decoded["calls"]
    self.assertEqual(kernel["compute_capability"], capability)
    self.assertIn(f".target sm_{capability}", kernel["ptx"])
    self.assertEqual(kernel["module_image"] is not None, cubin)
    self.assertEqual(data, loaded.serialize())

  def test_legacy_target_is_exported_too(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name="triton_kernel_call")
    loaded = jax.export.deserialize(
        _export(f, x, y, compute_capability=90).serialize())
    (call,) = jt_dist.exported_versions(loaded)
    self.assertEqual((call.target, call.binary), ("triton_kernel_call", "ptx"))

  @parameterized.parameters("triton_kernel_call_ffi", "triton_kernel_call")
  def test_export_without_safety_checks_names_jt_dists_helper(self, target):
    # JAX refuses the call after lowering, where jt_dist cannot raise; the
    # call it prints carries jt_dist's note, before the kernel's binary on
    # the FFI target (whose binary is not in backend_config).
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name=target)
    with jt_dist.export_options(compute_capability=90):
      with self.assertRaises(ValueError) as caught:
        jax.export.export(jax.jit(f), platforms=("cuda",))(x, y)
    message = str(caught.exception)
    self.assertIn("compatibility guarantees", message)
    self.assertIn(f"@{target}", message)
    note = ("jt_dist.export = \"jax.export.export takes this Triton call only"
            " with disabled_checks=jt_dist.export_safety_checks()\"")
    self.assertIn(note, message)
    if target == "triton_kernel_call_ffi":
      self.assertLess(message.index(note), message.index("opaque = "))
      self.assertLess(message.index(note), 600)

  def test_exported_call_keeps_the_note_and_runs_its_checks(self):
    x, y = self._inputs()
    exported = jax.export.deserialize(
        _export(_add, x, y, compute_capability=90).serialize())
    self.assertIn("jt_dist.export = ", exported.mlir_module())
    self.assertLen(jt_dist.exported_versions(exported), 1)

  def test_safety_checks_name_both_targets(self):
    self.assertLen(jt_dist.export_safety_checks(), 2)
    for target in ("triton_kernel_call_ffi", "triton_kernel_call"):
      self.assertIn(jax.export.DisabledSafetyCheck.custom_call(target),
                    jt_dist.export_safety_checks())

  def test_call_capability_wins_over_options(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, compute_capability=80)
    (call,) = jt_dist.exported_versions(
        _export(f, x, y, compute_capability=90))
    self.assertEqual(call.compute_capability, 80)

  def test_new_options_export_again(self):
    # JAX caches lowerings per function; the options are in its cache key.
    x, y = self._inputs()
    jitted = jax.jit(_add)
    found = []
    for capability in (80, 90):
      with jt_dist.export_options(compute_capability=capability):
        exported = jax.export.export(
            jitted, platforms=("cuda",),
            disabled_checks=jt_dist.export_safety_checks())(x, y)
      found.append(jt_dist.exported_versions(exported)[0].compute_capability)
    self.assertEqual(found, [80, 90])

  def test_missing_compute_capability_errors(self):
    x, y = self._inputs()
    with self.assertRaises(jt_dist.ExportError) as caught:
      _export(_add, x, y)
    message = str(caught.exception)
    self.assertIsInstance(caught.exception, ValueError)
    for part in ("add_kernel", "compute_capability=", "jax.export",
                 "jt_dist.export_options(compute_capability=90)"):
      self.assertIn(part, message)

  @parameterized.parameters("out_shape", "scalar", "grid")
  def test_symbolic_dimension_is_refused_and_concrete_shapes_export(
      self, where):
    (n,) = jax.export.symbolic_shape("n")

    def f(x, y):
      size = x.shape[0]
      return jt_dist.triton_call(
          x, y, size if where == "scalar" else 64, kernel=add_kernel,
          out_shape=jax.ShapeDtypeStruct(
              (size if where == "out_shape" else 64,), x.dtype),
          grid=(size if where == "grid" else 1,), BLOCK=128)

    symbolic = jax.ShapeDtypeStruct((n,), jnp.float32)
    with self.assertRaises(NotImplementedError) as caught:
      _export(f, symbolic, symbolic, compute_capability=90)
    for part in ("symbolic dimension", "shape-polymorphic jax.export is not"
                 " supported", "concrete shapes"):
      self.assertIn(part, str(caught.exception))
    # The advised fix: export with concrete shapes.
    concrete = jax.ShapeDtypeStruct((64,), jnp.float32)
    exported = _export(f, concrete, concrete, compute_capability=90)
    self.assertEqual(exported.in_avals[0].shape, (64,))

  def test_cubin_on_legacy_target_errors(self):
    x, y = self._inputs()
    f = lambda a, b: _add(a, b, custom_call_target_name="triton_kernel_call")
    with self.assertRaisesRegex(
        jt_dist.ExportError, r"cubin=True.*'triton_kernel_call'.*cubin=False"):
      _export(f, x, y, compute_capability=90, cubin=True)

  def test_plain_lowering_records_nothing(self):
    x, y = self._inputs()
    lowered = jax.jit(lambda a, b: _add(a, b, compute_capability=90)).trace(
        x, y).lower(lowering_platforms=("cuda",))
    self.assertNotIn("jt_dist_", lowered.as_text())
    self.assertNotIn("jt_dist.export", lowered.as_text())

  def test_versions_missing_errors(self):
    x, y = self._inputs()
    exported = _without_records(_export(_add, x, y, compute_capability=90))
    with self.assertRaisesRegex(
        jt_dist.ExportError, "'triton_kernel_call_ffi'.*records no versions"):
      jt_dist.exported_versions(exported)


@absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CheckExportedTest(testing.TestCase):

  def _exported(self, **options):
    x = jnp.asarray(self.random(int(self.np_rng.integers(64, 512))))
    return _export(_add, x, x, **options)

  @parameterized.parameters(
      # (made for, binary, checked on, runs)
      (90, False, 90, True), (90, False, 100, False), (80, False, 86, True),
      (80, False, 75, False), (80, True, 86, False), (90, True, 90, True))
  def test_capability_rules(self, made_for, cubin, checked_on, runs):
    exported = self._exported(compute_capability=made_for, cubin=cubin)
    if runs:
      self.assertEqual(
          jt_dist.check_exported(exported, compute_capability=checked_on), [])
      return
    with self.assertRaises(jt_dist.ExportError) as caught:
      jt_dist.check_exported(exported, compute_capability=checked_on)
    message = str(caught.exception)
    for part in ("add_kernel", f"sm_{made_for}", f"sm_{checked_on}",
                 f"compute_capability={checked_on}"):
      self.assertIn(part, message)

  def test_no_cuda_device_errors(self):
    if _cuda_capability() is not None:
      self.skipTest("a CUDA device is present")
    with self.assertRaisesRegex(
        jt_dist.ExportError, r"sm_90.*no CUDA device.*compute_capability="):
      jt_dist.check_exported(self._exported(compute_capability=90))

  def test_version_notes(self):
    exported = self._exported(compute_capability=90)
    with mock.patch.object(jaxlib, "__version__", "9.9.9"):
      (note,) = jt_dist.check_exported(exported, compute_capability=90)
    self.assertIn(f"jaxlib {jaxlib.__version__} and run under 9.9.9", note)
    with mock.patch.object(triton, "__version__", "9.9.9"):
      (note,) = jt_dist.check_exported(exported, compute_capability=90)
    self.assertIn(f"PTX from Triton {triton.__version__}", note)

  def test_not_exported_errors(self):
    with self.assertRaisesRegex(TypeError, "got str.*jax.export.Exported"):
      jt_dist.exported_versions("artifact")


class ExportOptionsTest(testing.TestCase):

  @parameterized.parameters(
      ({"compute_capability": "90"}, TypeError, "compute_capability='90'"),
      ({"compute_capability": True}, TypeError, "compute_capability=True"),
      ({"compute_capability": 0}, ValueError, "compute_capability=0"),
      ({"cubin": "yes"}, TypeError, "cubin='yes'"))
  def test_bad_options_error(self, options, error, named):
    with self.assertRaisesRegex(error, f"export_options: {named}"):
      jt_dist.export_options(**options)

  @absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
  def test_options_are_scoped(self):
    capability = int(self.np_rng.choice([75, 80, 86, 89, 90]))
    x = jnp.asarray(self.random(int(self.np_rng.integers(64, 512))))
    with jt_dist.export_options(compute_capability=capability, cubin=True):
      (inside,) = jt_dist.exported_versions(_export(_add, x, x))
    self.assertEqual((inside.compute_capability, inside.binary),
                     (capability, "cubin"))
    # Once the block is left, neither option holds any more.
    with self.assertRaisesRegex(jt_dist.ExportError,
                                "no compute_capability was given"):
      _export(_add, x, x)
    (after,) = jt_dist.exported_versions(_export(
        lambda a, b: _add(a, b, compute_capability=capability), x, x))
    self.assertEqual(after.binary, "ptx")

  def test_rocm_export_under_jaxlib_without_module_image_errors(self):
    # tests/rocm_lowering_test.py exports for ROCm where jaxlib can.
    x = jnp.asarray(self.random(int(self.np_rng.integers(64, 512))))
    f = lambda a, b: _add(a, b, compute_capability="gfx942")
    # jaxlib 0.11.1 is the first to take machine code (a HSACO) inline.
    with mock.patch.object(jaxlib, "__version__", "0.11.0"):
      with self.assertRaises(NotImplementedError) as caught:
        _export(f, x, x, platforms=("rocm",))
    message = str(caught.exception)
    for part in ("add_kernel", "for rocm under jaxlib", "before 0.11.1",
                 "platforms=['cuda']", "compute_capability="):
      self.assertIn(part, message)

  def test_cpu_export_errors(self):
    x = jnp.asarray(self.random(int(self.np_rng.integers(64, 512))))
    with self.assertRaises(NotImplementedError) as caught:
      _export(_add, x, x, platforms=("cpu",))
    message = str(caught.exception)
    for part in ("add_kernel", "for the CPU", "platforms=['cuda']",
                 "compute_capability=", "export_safety_checks()"):
      self.assertIn(part, message)


@absltest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CommittedArtifactsTest(testing.TestCase):
  """examples/artifacts/: made on a CPU host by examples/export_kernel.py."""

  def test_artifacts_exist(self):
    self.assertLen(_ARTIFACTS, 2)

  @parameterized.parameters(*[os.path.basename(p) for p in _ARTIFACTS])
  def test_artifact_records_its_making(self, name):
    with open(os.path.join(_ROOT, "examples", "artifacts", name), "rb") as f:
      exported = jax.export.deserialize(bytearray(f.read()))
    (call,) = jt_dist.exported_versions(exported)
    self.assertEqual(call.kernels, ("scaled_add_kernel",))
    self.assertEqual(call.compute_capability, 90)
    self.assertEqual(call.binary, name.split(".")[0].split("_")[-1])
    # Triton 3.6's PTX (ISA 8.7) is what a Triton 3.6 GPU host assembles;
    # later Tritons may emit an ISA that host's jaxlib cannot take.
    self.assertTrue(call.triton.startswith("3.6"), call.triton)
    self.assertEqual(exported.in_avals[0].shape, (4096,))

  def test_example_export_matches_its_artifacts_layout(self):
    example = _load_example()
    exported = example.export(90, cubin=False)
    (call,) = jt_dist.exported_versions(exported)
    self.assertEqual((call.binary, call.compute_capability), ("ptx", 90))
    self.assertEqual(example.artifact_name(90, False),
                     "scaled_add_sm90_ptx.jax_exported")


class RunOnGpuTest(testing.TestCase):
  """Deserialises and runs artifacts; needs a CUDA GPU."""

  def setUp(self):
    super().setUp()
    self.capability = _cuda_capability()
    if self.capability is None:
      self.skipTest("needs a CUDA GPU: runs exported kernels")

  @parameterized.parameters(*[os.path.basename(p) for p in _ARTIFACTS])
  def test_committed_artifact_runs(self, name):
    if self.capability != 90:
      self.skipTest(f"the artifacts are for sm_90; this GPU is"
                    f" sm_{self.capability}")
    example = _load_example()
    path = os.path.join(_ROOT, "examples", "artifacts", name)
    error = example.run(path, seed=int(self.np_rng.integers(1 << 30)))
    self.assertLess(error, 1e-5)

  @parameterized.parameters(False, True)
  def test_fresh_export_runs(self, cubin):
    x = self.random(int(self.np_rng.integers(1000, 100_000)))
    y = self.random(x.size)
    exported = _export(_add, jnp.asarray(x), jnp.asarray(y),
                       compute_capability=self.capability, cubin=cubin)
    loaded = jax.export.deserialize(exported.serialize())
    self.assertEqual(
        jt_dist.check_exported(loaded), [])
    out = jax.jit(loaded.call)(jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_array_equal(np.asarray(out), x + y)


if __name__ == "__main__":
  absltest.main()
