"""Host-side TMA descriptors as kernel arguments (jax-triton 0.4's).

``triton_call`` splits a ``TensorDescriptor`` (a pytree whose one leaf is
its array) into that array, an ordinary operand, and its static ``Info``,
which types the parameter (``tensordesc<fp32[32,32]>``) and tells each
platform how to pass it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import numpy as np

from jt_dist._core import types as _types

_STATIC = {"static": True}  # A field jax's pytrees keep as metadata.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
  """A host-side TMA descriptor of an array, for ``triton_call``.

  Pass it where the kernel takes a tensor descriptor parameter (one the
  kernel reads with ``desc.load([i, j])``). On CUDA GPUs from Hopper on it
  is a TMA descriptor built by jaxlib at launch; elsewhere Triton lowers
  the same accesses to masked loads and stores.

  Attributes:
    base: the array the descriptor views.
    shape: the logical shape accesses are bounded by; an access's lanes
      outside it read ``padding`` and are not written.
    strides: in elements; the last must be 1.
    block_shape: the shape of one ``load``/``store``; powers of two.
    layout: for Gluon kernels, the shared-memory layout
      (``gl.NVMMASharedLayout``); None for ``@triton.jit`` kernels.
    padding: ``"zero"`` or ``"nan"`` (floating dtypes only): what lanes
      outside ``shape`` read.
    round_f32_to_tf32: round float32 values to TF32 as they are loaded.
  """

  base: Any
  shape: tuple[int, ...] = dataclasses.field(metadata=_STATIC)
  strides: tuple[int, ...] = dataclasses.field(metadata=_STATIC)
  block_shape: tuple[int, ...] = dataclasses.field(metadata=_STATIC)
  layout: Any = dataclasses.field(default=None, metadata=_STATIC)
  padding: str = dataclasses.field(default="zero", metadata=_STATIC)
  round_f32_to_tf32: bool = dataclasses.field(default=False, metadata=_STATIC)

  def __post_init__(self):
    for field in ("shape", "strides", "block_shape"):
      value = getattr(self, field)
      try:
        ints = tuple(int(v) for v in value)
      except (TypeError, ValueError):
        raise TypeError(
            f"TensorDescriptor: {field}={value!r} must be a sequence of"
            " ints.") from None
      object.__setattr__(self, field, ints)
    ranks = (len(self.shape), len(self.strides), len(self.block_shape))
    if len(set(ranks)) != 1 or not 1 <= ranks[0] <= 5:
      raise ValueError(
          f"TensorDescriptor: shape {self.shape}, strides {self.strides} and"
          f" block_shape {self.block_shape} must have the same length, from"
          " 1 to 5 (TMA's ranks).")
    if self.padding not in ("zero", "nan"):
      raise ValueError(
          f"TensorDescriptor: padding={self.padding!r}; pass 'zero' or"
          " 'nan'.")
    if self.strides[-1] != 1:
      raise ValueError(
          f"TensorDescriptor: strides {self.strides} must end in 1: TMA"
          " reads the last dimension contiguously.")
    if any(d <= 0 for d in self.shape):
      raise ValueError(
          f"TensorDescriptor: shape {self.shape} must be positive.")
    if any(b <= 0 or b & (b - 1) for b in self.block_shape):
      raise ValueError(
          f"TensorDescriptor: block_shape {self.block_shape} must hold"
          " powers of two.")

  @classmethod
  def from_array(cls, array: Any, block_shape: Sequence[int],
                 layout: Any = None, padding: str = "zero",
                 round_f32_to_tf32: bool = False) -> "TensorDescriptor":
    """A descriptor of the whole of ``array`` (row-major strides).

    Args:
      array: a ``jax.Array`` (or anything with ``.shape`` and ``.dtype``).
      block_shape: the shape of one access.
      layout: a Gluon kernel's shared-memory layout, else None.
      padding: ``"zero"`` or ``"nan"``.
      round_f32_to_tf32: round float32 loads to TF32.

    Returns:
      The descriptor.
    """
    shape = tuple(int(d) for d in array.shape)
    strides = tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))
    return cls(array, shape, strides, tuple(block_shape), layout, padding,
               round_f32_to_tf32)


@dataclasses.dataclass(frozen=True)
class Info:
  """A descriptor without its array."""

  shape: tuple[int, ...]
  strides: tuple[int, ...]
  block_shape: tuple[int, ...]
  layout: Any
  padding: str
  round_f32_to_tf32: bool
  dtype: np.dtype

  @property
  def triton_type(self) -> str:
    """Triton's signature type, e.g. ``tensordesc<fp32[32,32]>``."""
    elem = _types.pointer_type(self.dtype).lstrip("*")
    block = ",".join(map(str, self.block_shape))
    layout = "" if self.layout is None else f",{self.layout!r}"
    return f"tensordesc<{elem}[{block}]{layout}>"

  @property
  def extent(self) -> int:
    """How many elements from the base the descriptor may address."""
    return 1 + sum((d - 1) * s for d, s in zip(self.shape, self.strides))


def split(args: Sequence[Any]) -> tuple[tuple[Any, ...], tuple]:
  """``(args with arrays for descriptors, ((position, Info), ...))``."""
  found = tuple((i, info(a, f"args[{i}]")) for i, a in enumerate(args)
                if isinstance(a, TensorDescriptor))
  return tuple(a.base if isinstance(a, TensorDescriptor) else a
               for a in args), found


def _first_in(tree: Any, name: str) -> str | None:
  """Where ``tree``, called ``name``, holds its first TensorDescriptor
  (``args[0]``, ``out_shape['c']``), or None."""
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, TensorDescriptor))[0]
  return next((name + jax.tree_util.keystr(path) for path, leaf in leaves
               if isinstance(leaf, TensorDescriptor)), None)


def refuse_split(front: str, split_by: str, args: Sequence[Any],
                 out_shape: Any, kwargs: dict | None = None) -> None:
  """Refuses a descriptor in a call run per shard: its shape and strides
  are the global array's, and each shard needs its own."""
  if where := (_first_in(args, "args") or next(
      (f"the keyword operand {name}=" for name, value in (kwargs or {}).items()
       if isinstance(value, TensorDescriptor)), None)
               or _first_in(out_shape, "out_shape")):
    raise NotImplementedError(
        f"{front}: {where} is a TensorDescriptor, and {split_by} cannot split"
        " one: its shape and strides are those of the global array, not of"
        " a shard. Pass the array, and build the descriptor per shard,"
        " inside jax.shard_map: TensorDescriptor.from_array(local_x,"
        " block_shape) for an input, or one whose base is the shard's"
        " jax.ShapeDtypeStruct for an output.")


def info(desc: TensorDescriptor, where: str) -> Info:
  """``desc`` without its array, checked; ``where`` names it in errors
  (``args[0]``, ``out_shape[1]``)."""
  base = desc.base
  if not _types.is_shape_dtype(base):
    raise TypeError(
        f"triton_call: {where} is a TensorDescriptor whose base is {base!r}"
        f" of type {type(base).__name__}; its base must be a jax.Array.")
  dtype = np.dtype(base.dtype)
  if _types.pointer_type(dtype) is None or dtype.itemsize * 8 not in (
      8, 16, 32, 64):
    raise TypeError(
        f"triton_call: {where} is a TensorDescriptor of dtype {dtype.name},"
        " which TMA descriptors cannot hold.")
  if desc.padding == "nan" and (dtype.kind != "f" or dtype.itemsize < 2):
    raise ValueError(
        f"triton_call: {where} is a TensorDescriptor of dtype {dtype.name}"
        " with padding='nan', which needs a floating dtype of 16 bits or"
        " more; pass padding='zero'.")
  if desc.round_f32_to_tf32 and dtype != np.float32:
    raise ValueError(
        f"triton_call: {where} is a TensorDescriptor of dtype {dtype.name}"
        " with round_f32_to_tf32=True, which needs float32.")
  info = Info(desc.shape, desc.strides, desc.block_shape, desc.layout,
              desc.padding, desc.round_f32_to_tf32, dtype)
  size = math.prod(base.shape)
  if info.extent > size:
    raise ValueError(
        f"triton_call: {where} is a TensorDescriptor with shape"
        f" {desc.shape} and strides {desc.strides}, which address"
        f" {info.extent} elements, but its base has shape"
        f" {tuple(base.shape)} ({size} elements). Describe a view inside the"
        " array, e.g. TensorDescriptor.from_array(x, block_shape).")
  return info
