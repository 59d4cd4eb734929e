"""``python -m jt_dist``, the doctor: a clean report, and forced problems."""

import io
import os
import re
import tempfile
import types
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import triton
import triton.language as tl

from jt_dist import _compat
from jt_dist._tools import doctor as _doctor
from jt_dist import testing
from jt_dist._gpu import lowering as _gpu_lowering
import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def _sub_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x - y, mask=mask)


def _skip_where_gpus_are_hidden(test):
  # On a GPU host run with JAX_PLATFORMS=cpu the doctor rightly reports the
  # GPUs JAX does not see (test_gpus_unseen_by_jax_are_a_problem): a clean
  # report cannot be had there.
  driver = _doctor._driver_version()  # pylint: disable=protected-access
  if jax.default_backend() == "cpu" and _doctor._has_driver(driver):  # pylint: disable=protected-access
    test.skipTest(f"nvidia-smi reports a driver ({driver}) but JAX runs on"
                  " the CPU here: the doctor reports that as a problem")


def _doctor_process(*args, **env):
  """Runs ``python -m jt_dist`` on this tree's jt_dist; (status, output)."""
  full_env = fork_server.tree_env(_ROOT, **env)
  result = fork_server.run(["-m", "jt_dist", *args], cwd=_ROOT,
                           env=full_env, timeout=600)
  return result.returncode, result.stdout, result.stderr


class DoctorProcessTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.tmp = tmp.name

  def test_clean_report_exits_0(self):
    _skip_where_gpus_are_hidden(self)
    cache_dir = os.path.join(self.tmp, "cache")
    status, out, err = _doctor_process(JT_DIST_CACHE_DIR=cache_dir)
    self.assertEqual(status, 0, out + err)
    for part in (f"jax            {jax.__version__}",
                 f"triton         {triton.__version__}", "gpu plugins",
                 "driver", f"{cache_dir} (writable)", "CUBIN path",
                 "HSACO path",
                 "none: jt_dist works on this machine."):
      self.assertIn(part, out)
    # The child process has its own devices: every one it lists is checked.
    count = int(re.search(r"devices \((\d+), default backend", out)[1])
    self.assertGreaterEqual(count, 1)
    self.assertLen(re.findall(r"\n  \w+:\d+ +ok; first call", out), count)
    self.assertNotIn("PROBLEM", out)

  def test_unwritable_cache_dir_exits_1_with_its_fix(self):
    blocker = os.path.join(self.tmp, "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory")
    cache_dir = os.path.join(blocker, "cache")
    status, out, err = _doctor_process(
        "--skip-kernels", JT_DIST_CACHE_DIR=cache_dir)
    self.assertEqual(status, 1, out + err)
    self.assertIn(f"PROBLEM: the disk cache directory {cache_dir} cannot be"
                  " written", out)
    self.assertIn("FIX: set JT_DIST_CACHE_DIR to a writable directory", out)

  def test_invalid_disk_cache_setting_exits_1(self):
    status, out, err = _doctor_process(
        "--skip-kernels", JT_DIST_DISK_CACHE="sometimes")
    self.assertEqual(status, 1, out + err)
    self.assertIn("JT_DIST_DISK_CACHE='sometimes'", out)
    self.assertIn("FIX: fix or unset JT_DIST_DISK_CACHE", out)

  def test_help(self):
    status, out, err = _doctor_process("--help")
    self.assertEqual(status, 0, out + err)
    self.assertIn("usage: python -m jt_dist", out)
    self.assertIn("--skip-kernels", out)
    self.assertIn("{doctor}", out)

  def test_doctor_command_runs_the_doctor(self):
    # `python -m jt_dist doctor`, as the installation page and the
    # changelog write it.
    _skip_where_gpus_are_hidden(self)
    status, out, err = _doctor_process(
        "doctor", "--skip-kernels",
        JT_DIST_CACHE_DIR=os.path.join(self.tmp, "cache"))
    self.assertEqual(status, 0, out + err)
    self.assertTrue(out.startswith("jt_dist doctor"), out)
    self.assertIn("none: jt_dist works on this machine.", out)
    self.assertEqual(err, "")

  def test_importing_main_runs_nothing(self):
    # A fork of a process that imported jt_dist, but not jt_dist.__main__.
    result = fork_server.run(
        ["-c", "import jt_dist.__main__"], cwd=_ROOT,
        env=fork_server.tree_env(_ROOT), timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout, "")


class DoctorInProcessTest(testing.TestCase):

  def _run(self, *argv):
    out = io.StringIO()
    with tempfile.TemporaryDirectory() as cache_dir, mock.patch.dict(
        os.environ, {"JT_DIST_CACHE_DIR": cache_dir}):
      status = _doctor.main(list(argv), out=out)
    return status, out.getvalue()

  def test_wrong_kernel_result_exits_1_with_its_fix(self):
    # The check compares with NumPy: a kernel computing x - y must fail it.
    with mock.patch.object(_doctor, "_doctor_add_kernel", _sub_kernel):
      status, out = self._run()
    self.assertEqual(status, 1, out)
    device = jax.local_devices()[0]
    self.assertIn(f"{device.platform}:{device.id}          FAILED:"
                  " AssertionError:", out)
    self.assertRegex(out, r"PROBLEM: .*the test kernel failed: AssertionError:"
                     r" \d+ of 4099 elements differ")
    fix = "reinstall Triton" if device.platform == "cpu" else "nvidia-smi"
    self.assertRegex(out, rf"FIX: .*{fix}")

  def test_failing_device_names_the_device_and_error(self):
    seen = []

    def failing(device):
      seen.append(device)
      raise RuntimeError("simulated launch failure")

    with mock.patch.object(_doctor, "check_kernel", failing):
      status, out = self._run()
    self.assertEqual(status, 1, out)
    self.assertEqual(seen, jax.local_devices())
    self.assertIn("the test kernel failed: RuntimeError: simulated launch"
                  " failure", out)

  def test_gpus_unseen_by_jax_are_a_problem(self):
    if jax.default_backend() != "cpu":
      self.skipTest("JAX sees the GPUs here")
    with mock.patch.object(_doctor, "_driver_version", lambda: "570.86"):
      status, out = self._run("--skip-kernels")
    self.assertEqual(status, 1, out)
    self.assertIn("PROBLEM: nvidia-smi reports a driver (570.86), but JAX"
                  " runs on the CPU", out)
    self.assertIn("FIX: install JAX's CUDA plugin at jaxlib's version", out)

  def test_an_unknown_command_is_refused(self):
    err = io.StringIO()
    with mock.patch("sys.stderr", err), self.assertRaises(SystemExit) as exit_:
      _doctor.main(["docter"])
    self.assertEqual(exit_.exception.code, 2)
    self.assertIn("invalid choice: 'docter'", err.getvalue())

  def test_skip_kernels_skips_the_check(self):
    _skip_where_gpus_are_hidden(self)
    with mock.patch.object(_doctor, "check_kernel",
                           side_effect=AssertionError("called")):
      status, out = self._run("--skip-kernels")
    self.assertEqual(status, 0, out)
    self.assertNotIn("kernel check", out)


def _amd_device(ident, arch="gfx942:sramecc+:xnack-"):
  """A ROCm device as JAX describes one (no AMD GPU exists here)."""
  return types.SimpleNamespace(
      platform="rocm", id=ident, local_hardware_id=ident,
      device_kind="AMD Instinct MI300X",
      compute_capability=arch,
      client=types.SimpleNamespace(platform_version="rocm 7.0.2"))


def _nvidia_device(ident=0):
  return types.SimpleNamespace(
      platform="gpu", id=ident, local_hardware_id=ident,
      device_kind="NVIDIA H100 80GB HBM3", compute_capability="9.0",
      client=types.SimpleNamespace(platform_version="cuda 13000"))


@absltest.skipUnless(hasattr(getattr(_compat.gpu_triton_module(),
                                     "_cuda_triton", None), "TritonKernel"),
                     "needs jaxlib's CUDA Triton bindings (jax-cuda12-plugin"
                     " or jax-cuda13-plugin)")
class DoctorCubinPathTest(testing.TestCase):
  """Which calls load jt_dist's CUBINs, by jaxlib and the default target."""

  def _line(self, module_image, ffi, prefer_legacy):
    out = io.StringIO()
    report = _doctor.Report(out)
    targets = frozenset({_gpu_lowering.FFI_TARGET}) if ffi else frozenset()
    with mock.patch.object(_compat, "jaxlib_takes_module_image",
                           return_value=module_image), \
         mock.patch.object(_compat, "triton_ffi_targets",
                           return_value=targets), \
         mock.patch.object(_gpu_lowering, "PREFER_LEGACY_TARGET",
                           prefer_legacy):
      _doctor.cubin_path(report, [_nvidia_device()])
    self.assertEqual(report.problems, [])
    return out.getvalue()

  @parameterized.parameters(True, False)
  def test_inactive_without_module_images_or_ffi(self, prefer_legacy):
    for module_image, ffi in ((False, True), (True, False)):
      out = self._line(module_image, ffi, prefer_legacy)
      self.assertIn("CUBIN path     inactive: jaxlib assembles each", out)
      self.assertIn(f"this is {_compat.jaxlib_version()}", out)

  def test_legacy_default_names_the_calls_that_load_cubins(self):
    out = self._line(True, True, True)
    self.assertIn("CUBIN path     on the FFI target:", out)
    self.assertIn("jt_dist.CUSTOM_CALL_TARGET_NAME", out)
    self.assertIn("the default legacy target carries PTX", out)

  def test_ffi_default_is_active(self):
    out = self._line(True, True, False)
    self.assertIn("CUBIN path     active: jaxlib loads the CUBINs", out)


class DoctorRocmTest(testing.TestCase):
  """The doctor on an AMD host, with JAX's device description faked."""

  def _report(self, step, found):
    out = io.StringIO()
    report = _doctor.Report(out)
    step(report, found)
    return report, out.getvalue()

  def test_devices_show_the_gfx_arch(self):
    found = [_amd_device(0), _amd_device(1, "gfx90a")]
    with mock.patch.object(jax, "local_devices", return_value=found), \
         mock.patch.object(jax, "default_backend", return_value="gpu"):
      report, out = self._report(lambda r, _: _doctor.devices(r), None)
    self.assertIn("rocm:0         AMD Instinct MI300X; arch gfx942; runtime"
                  " rocm 7.0.2", out)
    self.assertIn("rocm:1         AMD Instinct MI300X; arch gfx90a;", out)
    self.assertEqual(report.problems, [])

  def test_arch_from_jaxlib_when_the_device_has_none(self):
    device = _amd_device(3, arch=None)
    lib = types.SimpleNamespace(_hip_triton=types.SimpleNamespace(
        get_arch_details=lambda i: f"gfx950:sramecc+:{i}"))
    with mock.patch.object(_compat, "gpu_triton_module", return_value=lib):
      self.assertEqual(_doctor._target_text(device), "arch gfx950")  # pylint: disable=protected-access

  @absltest.skipUnless(hasattr(getattr(_compat.gpu_triton_module(),
                                       "_hip_triton", None), "TritonKernel"),
                       "needs jaxlib's ROCm Triton bindings"
                       " (jax-rocm7-plugin)")
  def test_hsaco_path_with_the_plugin(self):
    for inline, words in ((True, "inline: each call carries its HSACO"),
                          (False, "file: jaxlib reads each HSACO")):
      with mock.patch.object(_gpu_lowering, "rocm_binary_inline",
                             return_value=inline):
        report, out = self._report(_doctor.hsaco_path, [_amd_device(0)])
      self.assertIn(f"HSACO path     {words}", out)
      self.assertEqual(report.problems, [])

  def test_missing_rocm_plugin_is_a_problem_with_its_fix(self):
    with mock.patch.object(_compat, "gpu_triton_module", return_value=None):
      report, out = self._report(_doctor.hsaco_path, [_amd_device(0)])
    self.assertIn("n/a (no Triton custom call for ROCm)", out)
    (problem,) = report.problems
    self.assertIn("lowering for rocm needs jaxlib's Triton custom call",
                  problem.what)
    self.assertIn("jax-rocm7-plugin", problem.fix)

  def test_no_rocm_device(self):
    report, out = self._report(_doctor.hsaco_path, [jax.devices("cpu")[0]])
    self.assertIn("HSACO path     n/a (no ROCm device)", out)
    self.assertEqual(report.problems, [])

  def test_kernel_failure_on_rocm_names_the_rocm_fix(self):
    self.assertIn("jax-rocm7-plugin", _doctor._kernel_fix(_amd_device(0)))  # pylint: disable=protected-access


if __name__ == "__main__":
  absltest.main()
