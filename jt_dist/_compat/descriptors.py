"""Tensor descriptors (TMA) as each Triton and jaxlib release builds them."""

from __future__ import annotations

from typing import Any

import triton

from jt_dist._compat.jaxlib_triton import jaxlib_version


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
        f" ({jaxlib_version()}, {platform}) lacks; jaxlib 0.11.2"
        " has it."
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
