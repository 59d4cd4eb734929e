"""Which GPU a kernel is compiled for: the one ``compute_capability=`` names,
else that of the devices the computation is lowered for (never "device 0":
a mixed host's second GPU gets its own code).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax

from jt_dist import _compat

logger = logging.getLogger("jt_dist")

# Opt-in shared memory per block (bytes), by compute capability: checked at
# lowering, where an error can name the config.
_CUDA_SHARED_MEMORY = {
    70: 98304, 72: 98304, 75: 65536,
    80: 166912, 86: 101376, 87: 166912, 89: 101376,
    90: 232448,
    100: 232448, 101: 232448, 103: 232448, 110: 232448,
    120: 101376, 121: 101376,
}
# LDS per workgroup (bytes), by gfx arch; 64 KiB unless listed.
_ROCM_SHARED_MEMORY = {"gfx950": 163840}
_ROCM_DEFAULT_SHARED_MEMORY = 65536
_NO_DEVICE = (
    "triton_call: cannot tell which {what} to compile for: the computation"
    " is lowered for {name}, but no {name} device is visible (e.g."
    " cross-lowering on a host without a GPU). Pass compute_capability= to"
    " triton_call{example}.")
_NO_DEVICE_WORDS = {
    "cuda": {"what": "CUDA compute capability", "name": "CUDA",
             "example": ", e.g. compute_capability=90 for H100/H200 (sm_90)"},
    "rocm": {"what": "ROCm GPU arch (gfx...)", "name": "ROCm",
             "example": " with the arch, e.g. compute_capability='gfx942' for"
                        " MI300X or 'gfx90a' for MI250X"},
}


@dataclasses.dataclass(frozen=True)
class Target:
  """A GPU to compile for."""

  platform: str  # "cuda" or "rocm".
  arch: int | str  # 90 (sm_90) on CUDA, a gfx arch ("gfx942") on ROCm.

  @property
  def warp_size(self) -> int:
    return 32 if self.platform == "cuda" else 64

  @property
  def triton_target(self):
    return _compat.gpu_target("cuda" if self.platform == "cuda" else "hip",
                              self.arch, self.warp_size)

  @property
  def arch_number(self) -> int:
    """The capability jaxlib records in its proto; 0 where it has none."""
    return self.arch if isinstance(self.arch, int) else 0

  def describe(self) -> str:
    return f"sm_{self.arch}" if self.platform == "cuda" else str(self.arch)


def shared_memory_limit(target: Target) -> int | None:
  """The most shared memory a block may use on ``target``; None if unknown."""
  if target.platform == "rocm":
    return _ROCM_SHARED_MEMORY.get(str(target.arch), _ROCM_DEFAULT_SHARED_MEMORY)
  # An unlisted minor revision takes its major's closest lower one's.
  same_major = [cc for cc in _CUDA_SHARED_MEMORY
                if cc // 10 == target.arch // 10 and cc <= target.arch]
  return _CUDA_SHARED_MEMORY[max(same_major)] if same_major else None


def _devices_of_mesh() -> tuple:
  """The devices of the concrete mesh set with ``jax.set_mesh``, if any."""
  try:
    return _compat.mesh_devices(jax.sharding.get_mesh())
  except (RuntimeError, ValueError):
    return ()


def local_devices(platform: str) -> list[Any]:
  """This host's devices of ``platform``; none without such a backend."""
  try:
    return list(jax.devices(platform))
  except RuntimeError:  # No such backend on this host.
    return []


def cuda_capability(device: Any) -> int | None:
  """A CUDA device's compute capability as an int (90 for "9.0"), or None."""
  text = getattr(device, "compute_capability", None)
  if isinstance(text, int):
    return text
  try:
    major, minor = str(text).split(".")[:2]
    return int(major) * 10 + int(minor)
  except ValueError:
    return None


def rocm_arch(device: Any) -> str | None:
  """A ROCm device's gfx arch without feature flags ("gfx942"), or None."""
  arch = str(getattr(device, "compute_capability", "") or "")
  if not arch.startswith("gfx"):
    # The ROCm plugin's own: jaxlib's module-level names may be CUDA's.
    lib = getattr(_compat.gpu_triton_module(), "_hip_triton", None)
    if lib is None or not hasattr(lib, "get_arch_details"):
      return None
    arch = str(lib.get_arch_details(device.local_hardware_id))
  return arch.split(":")[0]  # Drop feature flags such as ":sramecc+".


def candidate_devices(ctx, platform: str) -> list[Any]:
  """The platform's devices the call is lowered for, best source first."""
  # Only the platform's devices count (cross-lowering assigns CPU ones).
  for source in (lambda: _compat.lowering_axis_facts(ctx).devices,
                 _devices_of_mesh,
                 lambda: local_devices(platform)):
    devices = [d for d in source()
               if getattr(d, "platform", None) in (platform, "gpu")]
    if devices:
      return devices
  return []


def resolve_target(ctx, platform: str, compute_capability: int | None
                   ) -> Target:
  """The GPU ``compute_capability`` names, else the lowering devices' GPU:
  of several, the lowest CUDA capability (its code runs on all); on ROCm,
  several archs are refused."""
  if compute_capability is not None:
    return _named_target(platform, compute_capability)
  arch_of = cuda_capability if platform == "cuda" else rocm_arch
  pairs = [(d, arch) for d in candidate_devices(ctx, platform)
           if (arch := arch_of(d)) not in (None, "")]
  if not pairs:
    raise ValueError(_NO_DEVICE.format(**_NO_DEVICE_WORDS[platform]))
  distinct = sorted({arch for _, arch in pairs}, key=str)
  if len(distinct) == 1:
    return Target(platform, distinct[0])
  what = "compute capability" if platform == "cuda" else "GPU arch"
  by_arch = {a: [str(d) for d, b in pairs if b == a] for a in distinct}
  if platform != "cuda":
    raise ValueError(
        f"triton_call: the devices the call is lowered for differ in"
        f" {what}: {by_arch}. A ROCm kernel runs only on the arch it was"
        " compiled for: place the call on devices of one arch.")
  lowest = min(distinct)
  logger.warning(
      "jt_dist: the devices the call is lowered for differ in %s: %s."
      " Compiling for the lowest, %s, whose code runs on all of them.",
      what, by_arch, lowest)
  return Target(platform, lowest)


def _named_target(platform: str, named: int | str) -> Target:
  """The target ``compute_capability=`` names; ValueError on a mismatch."""
  if platform == "rocm" and isinstance(named, str):
    return Target("rocm", named)
  if platform == "cuda" and not isinstance(named, str):
    return Target("cuda", int(named))
  expected = ("a ROCm GPU arch such as 'gfx942'" if platform == "rocm"
              else "a CUDA compute capability such as 90")
  raise ValueError(
      f"triton_call: compute_capability={named!r} names a GPU of the other"
      f" platform, but the call is lowered for {platform}. Pass {expected},"
      " or lower for the platform it names (jax.jit(...).trace(...)"
      ".lower(lowering_platforms=(...,)).")


def check_num_ctas(target: Target, num_ctas: int, label: str) -> None:
  """Refuses thread-block clusters (``num_ctas > 1``) before sm_90."""
  if num_ctas > 1 and target.platform == "cuda" and target.arch < 90:
    raise ValueError(
        f"triton_call: num_ctas={num_ctas} (config: {label}) needs thread"
        " block clusters, which CUDA GPUs have from Hopper (compute"
        f" capability 90) on; the target is {target.describe()}. Use"
        " num_ctas=1, or compile for compute_capability>=90.")
