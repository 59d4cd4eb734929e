"""jaxlib's Triton custom call: parts whose presence or signature differ."""

from __future__ import annotations

import functools
import importlib
import re


@functools.lru_cache(maxsize=None)
def gpu_triton_module():
  """jaxlib's Triton custom-call bindings, or None without a GPU plugin."""
  # ``jax._src.lib.gpu_triton`` is an attribute bound to jaxlib's module,
  # not an importable submodule, so import_module must name jaxlib's.
  try:
    module = importlib.import_module("jaxlib.gpu_triton")
  except ImportError:
    return None
  return module if hasattr(module, "TritonKernel") else None


def triton_ffi_targets(platform: str) -> frozenset[str]:
  """FFI custom-call targets registered by the GPU plugin of ``platform``."""
  module = gpu_triton_module()
  plugin = None if module is None else getattr(
      module, "_cuda_triton" if platform == "cuda" else "_hip_triton", None)
  if plugin is None or not hasattr(plugin, "registrations"):
    return frozenset()
  return frozenset(plugin.registrations())


def make_triton_kernel(lib, name, num_warps, num_ctas, shared_mem, binary,
                       ttir, arch_number, scratch_size, scratch_align):
  """jaxlib's ``TritonKernel``; jaxlib up to 0.11 takes no global scratch."""
  args = [name, num_warps, num_ctas, shared_mem, binary, ttir, arch_number]
  if not scratch_size:
    return lib.TritonKernel(*args)
  try:
    return lib.TritonKernel(*args, scratch_size, scratch_align)
  except TypeError:
    raise NotImplementedError(
        f"triton_call: kernel {name!r} needs {scratch_size} bytes of global"
        " scratch memory (e.g. for on-device TMA descriptors), which this"
        f" jaxlib ({jaxlib_version()})"
        " cannot allocate. Upgrade jax and jaxlib to a release whose"
        " TritonKernel takes a global scratch size, or avoid the feature."
    ) from None


def jaxlib_version() -> str:
  import jaxlib  # pylint: disable=g-import-not-at-top
  return str(getattr(jaxlib, "__version__", "unknown"))


def jaxlib_takes_module_image() -> bool:
  """Whether jaxlib's Triton proto reads a kernel's CUBIN (0.11.1+)."""
  match = re.match(r"\d+(?:\.\d+){0,2}", jaxlib_version())
  return bool(match) and tuple(map(int, match[0].split("."))) >= (0, 11, 1)
