"""jaxlib's Triton custom call, and the tensor descriptors (TMA) it takes:
parts whose presence or signature differ per jaxlib and Triton release."""

from __future__ import annotations

import functools
import importlib
import re
from typing import Any

import triton


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


def triton_ffi_targets(plugin) -> frozenset[str]:
  """FFI custom-call targets that a GPU plugin's Triton bindings register."""
  return frozenset(plugin.registrations()
                   if hasattr(plugin, "registrations") else ())


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
        f" jaxlib ({jaxlib_version()}) cannot allocate. Upgrade jax and"
        " jaxlib to a release whose TritonKernel takes a global scratch size,"
        " or avoid the feature.") from None


def jaxlib_version() -> str:
  import jaxlib  # pylint: disable=g-import-not-at-top
  return str(getattr(jaxlib, "__version__", "unknown"))


def jaxlib_takes_module_image() -> bool:
  """Whether jaxlib's Triton proto reads a kernel's CUBIN (0.11.1+)."""
  match = re.match(r"\d+(?:\.\d+){0,2}", jaxlib_version())
  return bool(match) and tuple(map(int, match[0].split("."))) >= (0, 11, 1)


def descriptors_round_to_tf32() -> bool:
  """Whether Triton's host descriptors take ``round_f32_to_tf32`` (3.9)."""
  from triton.tools import tensor_descriptor  # pylint: disable=g-import-not-at-top
  return ("round_f32_to_tf32"
          in tensor_descriptor.TensorDescriptor.__dataclass_fields__)


def check_tf32_descriptor(info, kernel: str) -> None:
  """Refuses ``round_f32_to_tf32`` before Triton 3.9, which lacks it."""
  if info.round_f32_to_tf32 and not descriptors_round_to_tf32():
    raise NotImplementedError(
        f"triton_call: kernel {kernel!r} takes a TensorDescriptor with"
        " round_f32_to_tf32=True, which Triton"
        f" {triton.__version__} does not support (Triton 3.9 does). Round"
        " the array first, e.g. with jax.lax.reduce_precision(x, 8, 10), or"
        " upgrade Triton.")


def interpreter_descriptor(base, info):
  """Triton's host descriptor over ``base`` (a ``data_ptr`` object), its
  fields set directly: the constructor wants a torch-like tensor."""
  from triton.tools import tensor_descriptor  # pylint: disable=g-import-not-at-top
  cls = tensor_descriptor.TensorDescriptor
  desc = cls.__new__(cls)
  fields = {"base": base, "shape": list(info.shape),
            "strides": list(info.strides),
            "block_shape": list(info.block_shape), "padding": info.padding,
            "round_f32_to_tf32": info.round_f32_to_tf32}
  for name in cls.__dataclass_fields__:
    setattr(desc, name, fields[name])
  return desc


def descriptor_fallback_flags(info) -> list[tuple[Any, str]]:
  """The flags after a descriptor's shape and strides, without TMA:
  ``padding == "nan"``, then (Triton 3.9+) ``round_f32_to_tf32``."""
  flags = [(info.padding == "nan", "i1")]
  if descriptors_round_to_tf32():
    flags.append((bool(info.round_f32_to_tf32), "i1"))
  return flags


def tma_parameter(lib, meta, info, platform: str):
  """jaxlib's TMA descriptor parameter for ``info``, per Triton's ``meta``
  (only jaxlibs newer than 0.11.0 build one)."""
  make = getattr(lib, "create_tma_descriptor_parameter", None)
  if make is None or platform != "cuda":
    raise NotImplementedError(
        "triton_call: a TensorDescriptor compiled to a TMA descriptor needs"
        " jaxlib's Triton call to build it at launch"
        " (create_tma_descriptor_parameter), which the installed jaxlib"
        f" ({jaxlib_version()}, {platform}) lacks; jaxlib 0.11.2 has it."
        " Upgrade jax and its CUDA plugin, or pass the array itself and"
        " build the descriptor inside the kernel (tl.make_tensor_descriptor).")
  if meta.get("is_im2col") or meta.get("fp4_padded"):
    raise NotImplementedError(
        "triton_call: im2col and fp4-padded TMA descriptors are not"
        " supported; pass a tiled descriptor.")
  from triton.backends.nvidia import driver  # pylint: disable=g-import-not-at-top
  elem_type = meta["elem_type"]
  if info.round_f32_to_tf32:
    elem_type = driver.TMA_TF32
  return make(elem_type=driver.TMA_DTYPE_DEVICE_TO_HOST[elem_type],
              swizzle=meta["swizzle"], shape=list(info.shape),
              strides=list(info.strides), block_shape=list(meta["block_size"]),
              oob_fill=1 if info.padding == "nan" else 0)
