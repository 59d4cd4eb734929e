"""``python -m jt_dist [doctor]``: can this machine run Triton kernels?"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import platform as _platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, NamedTuple, TextIO

import jax
import numpy as np
import triton
import triton.language as tl

from jt_dist import _compat
from jt_dist import _settings
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist._backend import target as _target

_PLUGIN_PREFIXES = ("jax-cuda", "jax-rocm")
_TESTED_TRITON = ((3, 6), (3, 9))
_CHECK_ELEMENTS = 4099  # Not a multiple of the block: the mask is exercised.
_CHECK_BLOCK = 256


class Problem(NamedTuple):
  what: str
  fix: str


@dataclasses.dataclass
class Report:
  """Where the doctor writes: sections of lines, then the problems."""

  out: TextIO
  problems: list[Problem] = dataclasses.field(default_factory=list)

  def section(self, title: str) -> None:
    print(f"\n{title}", file=self.out)

  def line(self, label: str, value: Any) -> None:
    print(f"  {label:<14} {value}", file=self.out)

  def problem(self, what: str, fix: str) -> None:
    self.problems.append(Problem(what, fix))


@triton.jit
def _doctor_add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


def _driver_version() -> str:
  """The NVIDIA driver's version from nvidia-smi; "-" without one."""
  if (smi := shutil.which("nvidia-smi")) is None:
    return "-"
  try:
    result = subprocess.run(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True)
  except (OSError, subprocess.SubprocessError) as e:
    return f"unknown (nvidia-smi: {e})"
  return ", ".join(sorted(set(result.stdout.split()))) or "unknown"


def versions(report: Report) -> str:
  """The versions section; returns the NVIDIA driver's version."""
  from jt_dist import __version__  # pylint: disable=g-import-not-at-top

  report.section("versions")
  report.line("python", _platform.python_version())
  report.line("jt_dist", __version__)
  report.line("jax", jax.__version__)
  report.line("jaxlib", _compat.jaxlib_version())
  tested = "-".join(".".join(map(str, v)) for v in _TESTED_TRITON)
  minor = tuple(int(p) for p in triton.__version__.split(".")[:2]
                if p.isdigit())
  note = "" if _TESTED_TRITON[0] <= minor <= _TESTED_TRITON[1] else (
      f" (jt_dist is tested with Triton {tested})")
  report.line("triton", triton.__version__ + note)
  plugins = set()
  for dist in importlib.metadata.distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if name.startswith(_PLUGIN_PREFIXES):
      plugins.add(f"{name} {dist.version}")
  report.line("gpu plugins", ", ".join(sorted(plugins)) or "none")
  driver = _driver_version()
  report.line("driver", driver)
  return driver


def _capability(device: Any) -> str:
  return str(getattr(device, "compute_capability", None) or "-")


def _target_text(device: Any) -> str:
  """ "compute capability 9.0" on CUDA, "arch gfx942" on ROCm."""
  if device.platform != "rocm":
    return f"compute capability {_capability(device)}"
  try:
    arch = _target.rocm_arch(device)
  except Exception as e:  # pylint: disable=broad-except
    arch = f"unknown ({type(e).__name__}: {e})"
  return f"arch {arch or 'unknown'}"


def _has_driver(driver: str) -> bool:
  """Whether ``_driver_version()`` found an NVIDIA driver's version."""
  return driver != "-" and not driver.startswith("unknown")


def devices(report: Report, driver: str = "-") -> list[Any]:
  """The devices section; a problem if the driver has GPUs JAX cannot see."""
  found = jax.local_devices()
  backend = jax.default_backend()
  report.section(f"devices ({len(found)}, default backend {backend})")
  for device in found:
    report.line(f"{device.platform}:{device.id}",
                f"{device.device_kind}; {_target_text(device)}; runtime"
                f" {_compat.platform_version(device)}")
  if backend != "cpu":
    return found
  report.line("note", "no GPU: kernels run through Triton's interpreter")
  if _has_driver(driver):
    try:
      jax.devices("cuda")
      why = "JAX's default backend is the CPU"
    except RuntimeError as e:
      why = " ".join(str(e).split())[:300]
    report.problem(
        f"nvidia-smi reports a driver ({driver}), but JAX runs on the CPU:"
        f" {why}",
        "install JAX's CUDA plugin at jaxlib's version (pip install -U"
        " 'jax[cuda12]' or 'jax[cuda13]' to match the driver), and unset"
        " JAX_PLATFORMS / CUDA_VISIBLE_DEVICES if they hide the GPUs")
  return found


def check_kernel(device: Any) -> tuple[float, float]:
  """Seconds of a checked add's first call on ``device`` and of one more."""
  from jt_dist._call.api import triton_call  # pylint: disable=g-import-not-at-top

  x, y = np.random.default_rng().standard_normal((2, _CHECK_ELEMENTS),
                                                 dtype=np.float32)

  @jax.jit
  def fn(a, b):
    return triton_call(
        a, b, a.size, kernel=_doctor_add_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=(triton.cdiv(a.size, _CHECK_BLOCK),), BLOCK=_CHECK_BLOCK)

  a, b = jax.device_put(x, device), jax.device_put(y, device)
  start = time.perf_counter()
  out = np.asarray(jax.block_until_ready(fn(a, b)))
  first = time.perf_counter() - start
  if not np.array_equal(out, x + y):
    raise AssertionError(f"{int(np.sum(out != x + y))} of {x.size} elements"
                         " differ from NumPy's x + y")
  start = time.perf_counter()
  jax.block_until_ready(fn(a, b))
  return first, time.perf_counter() - start


def _format_seconds(seconds: float) -> str:
  if seconds >= 1:
    return f"{seconds:.2f} s"
  if seconds >= 1e-3:
    return f"{seconds * 1e3:.2f} ms"
  return f"{seconds * 1e6:.0f} µs"


def kernels(report: Report, found: list[Any]) -> None:
  """The kernel section: ``check_kernel`` on every device."""
  report.section("kernel check (compile, run, compare with NumPy)")
  for device in found:
    name = f"{device.platform}:{device.id}"
    try:
      first, launch = check_kernel(device)
    except Exception as e:  # pylint: disable=broad-except
      message = " ".join(str(e).split())[:300]
      report.line(name, f"FAILED: {type(e).__name__}: {message}")
      report.problem(
          f"{name} ({device.device_kind}): the test kernel failed:"
          f" {type(e).__name__}: {message}",
          _kernel_fix(device))
      continue
    report.line(name, f"ok; first call {_format_seconds(first)} (compiling"
                f" included), one launch {_format_seconds(launch)}")


def _kernel_fix(device: Any) -> str:
  if device.platform == "cpu":
    return ("reinstall Triton (pip install 'triton>=3.6'); its interpreter"
            " runs kernels on the CPU")
  dump = (", and rerun with JT_DIST_DUMP_DIR=/tmp/dump to inspect the"
          " kernel's IR")
  if device.platform == "rocm":
    return ("make JAX's ROCm plugin match jaxlib (jax-rocm7-plugin and"
            " jax-rocm7-pjrt at jaxlib's version), check the GPU with"
            " rocm-smi" + dump)
  return ("make the JAX GPU plugin match jaxlib (pip install -U"
          " 'jax[cuda12]' or 'jax[cuda13]' for your driver), check the"
          " driver with nvidia-smi" + dump)


def _cache_size(root: str) -> tuple[int, int]:
  """(entries, bytes)."""
  entries = total = 0
  for folder, _, files in os.walk(root):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(folder, name))
      except OSError:
        continue
      entries += name.endswith(".json")
  return entries, total


def _writable(root: str) -> str | None:
  """None if a file can be created in ``root``; else why not."""
  try:
    os.makedirs(root, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
      pass
  except OSError as e:
    return f"{type(e).__name__}: {e}"
  return None


def disk_cache(report: Report) -> None:
  """The disk cache section: location, size, whether it can be written."""
  report.section("disk cache of compiled kernels")
  try:
    enabled = _settings.disk_cache()
    root = _settings.cache_dir()
  except (TypeError, ValueError) as e:
    report.line("setting", f"INVALID: {e}")
    report.problem(f"the disk cache's settings are invalid: {e}",
                   "fix or unset JT_DIST_DISK_CACHE / JT_DIST_CACHE_DIR")
    return
  if not enabled:
    report.line("directory", f"{root} (off: JT_DIST_DISK_CACHE or"
                " jt_dist.configure_cache)")
    return
  why = _writable(root)
  entries, size = _cache_size(root) if why is None else (0, 0)
  state = "writable" if why is None else f"NOT writable ({why})"
  report.line("directory", f"{root} ({state})")
  report.line("size", f"{entries} kernels, {size / 2**20:.2f} MiB")
  if why is not None:
    report.problem(
        f"the disk cache directory {root} cannot be written ({why}), so"
        " every process compiles every kernel again",
        "set JT_DIST_CACHE_DIR to a writable directory, or"
        " JT_DIST_DISK_CACHE=0 to turn the disk cache off")


def _has_custom_call(report: Report, platform: str, label: str, absent: str,
                     fix: str) -> bool:
  """Whether jaxlib's Triton custom call for ``platform`` is installed."""
  try:
    _gpu_lowering.plugin(platform)
  except RuntimeError as e:
    report.line(label, absent)
    report.problem(str(e), fix)
    return False
  return True


def cubin_path(report: Report, found: list[Any]) -> None:
  """Whether jaxlib loads jt_dist's CUBINs or assembles the PTX itself."""
  if not any(d.platform in ("cuda", "gpu") for d in found
             if _capability(d)[:1].isdigit()):
    report.line("CUBIN path", "n/a (no CUDA device)")
    return
  if not _has_custom_call(report, "cuda", "CUBIN path",
                          "n/a (no Triton custom call)",
                          "install JAX's CUDA plugin at jaxlib's version"):
    return
  has_ffi = _gpu_lowering.FFI_TARGET in _compat.triton_ffi_targets(
      _gpu_lowering.plugin("cuda"))
  if not (_compat.jaxlib_takes_module_image() and has_ffi):
    report.line("CUBIN path", "inactive: jaxlib assembles each kernel's PTX"
                f" in every process (needs jaxlib >= 0.11.1 and the FFI"
                f" target; this is {_compat.jaxlib_version()})")
  elif _gpu_lowering.PREFER_LEGACY_TARGET:
    report.line("CUBIN path", "on the FFI target: calls that name"
                " custom_call_target_name=jt_dist.CUSTOM_CALL_TARGET_NAME, and"
                " exported calls, load the CUBINs jt_dist assembles (and"
                " caches); the default legacy target carries PTX, which jaxlib"
                " assembles once per kernel in each process")
  else:
    report.line("CUBIN path", "active: jaxlib loads the CUBINs jt_dist"
                " assembles (and caches)")


def hsaco_path(report: Report, found: list[Any]) -> None:
  """On ROCm: the plugin, and how jaxlib gets each kernel's HSACO."""
  if not any(d.platform == "rocm" for d in found):
    report.line("HSACO path", "n/a (no ROCm device)")
    return
  if not _has_custom_call(report, "rocm", "HSACO path",
                          "n/a (no Triton custom call for ROCm)",
                          "install JAX's ROCm plugin at jaxlib's version"
                          " (pip install jax-rocm7-plugin==<jaxlib's"
                          " version>)"):
    return
  if _gpu_lowering.rocm_binary_inline():
    report.line("HSACO path", "inline: each call carries its HSACO, which"
                " jaxlib loads as is (executables from JAX's persistent"
                " compilation cache load in any process)")
  else:
    report.line("HSACO path", "file: jaxlib reads each HSACO from a"
                " temporary file and deletes it, so an executable from"
                " JAX's persistent compilation cache cannot load in another"
                f" process (inline needs jaxlib >= 0.11.1; this is"
                f" {_compat.jaxlib_version()})")


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
  """Runs the doctor; returns the exit status."""
  parser = argparse.ArgumentParser(
      prog="python -m jt_dist",
      description="Checks that jt_dist can run Triton kernels here: versions,"
      " devices, a test kernel on each device, the disk cache. Exits 0 only"
      " when everything works; each problem is printed with its fix.")
  # The only command, so naming it is optional.
  parser.add_argument(
      "command", nargs="?", choices=("doctor",), default="doctor",
      help="what to run: the doctor (the default)")
  parser.add_argument(
      "--skip-kernels", action="store_true",
      help="do not compile and run the test kernel on each device")
  args = parser.parse_args(argv)
  report = Report(out or sys.stdout)
  print("jt_dist doctor", file=report.out)
  found = devices(report, versions(report))
  if not args.skip_kernels:
    kernels(report, found)
  disk_cache(report)
  cubin_path(report, found)
  hsaco_path(report, found)
  report.section("problems")
  if not report.problems:
    print("  none: jt_dist works on this machine.", file=report.out)
  for problem in report.problems:
    print(f"  PROBLEM: {problem.what}\n    FIX: {problem.fix}",
          file=report.out)
  return 1 if report.problems else 0
