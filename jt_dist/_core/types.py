"""Mapping JAX dtypes and Python scalars to Triton's type names."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# Element types a kernel pointer may carry, by NumPy/JAX dtype name.
_POINTER_ELEMENT_TYPES = {
    "bfloat16": "bf16", "float64": "fp64", "float32": "fp32",
    "float16": "fp16", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
    "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2fnuz": "fp8e5b16",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
    "uint64": "u64", "uint32": "u32", "uint16": "u16", "uint8": "u8",
    "bool": "i1"}

SUPPORTED_DTYPES = tuple(_POINTER_ELEMENT_TYPES)

# A float of at least this magnitude rounds to infinity as a float32: the
# largest finite float32 is 2**128 - 2**104, and its ulp 2**104.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# The scalar types jaxlib's Triton call can carry, by the annotation that
# chooses them (Triton 3.9 spells bool "u1"); others leave it to the value.
ANNOTATED_TYPES = {"i1": "i1", "u1": "i1", "i32": "i32", "u32": "u32",
                   "i64": "i64", "u64": "u64", "fp32": "fp32", "fp64": "fp64"}


def is_shape_dtype(x: Any) -> bool:
  """Whether ``x`` describes an array: it has ``.shape`` and ``.dtype``."""
  return hasattr(x, "shape") and hasattr(x, "dtype")


def refuse_symbolic(values: Any, where: str) -> None:
  """Raises NotImplementedError where ``values`` (a shape, or one value)
  hold a symbolic dimension: ``int(...)`` of one raises too."""
  for value in values if isinstance(values, tuple) else (values,):
    if jax.export.is_symbolic_dim(value):
      raise NotImplementedError(
          f"triton_call: {where} holds the symbolic dimension {value!r}:"
          " shape-polymorphic jax.export is not supported, since a Triton"
          " kernel is compiled for concrete shapes. Export with concrete"
          " shapes (jax.ShapeDtypeStruct((1024,), dtype)), once per shape"
          " you need.")


def pointer_dtype(dtype: Any, where: str, shape: Any = None) -> np.dtype:
  """``dtype`` as a NumPy dtype a kernel pointer can carry; ``where`` and
  ``shape`` (None for an output) are for messages."""
  try:
    dtype = np.dtype(dtype)
  except TypeError:
    raise TypeError(
        f"triton_call: {where} has dtype {dtype!r}, which is not a dtype."
        f" Use a NumPy or JAX dtype such as jnp.float32; supported:"
        f" {', '.join(SUPPORTED_DTYPES)}.") from None
  if pointer_type(dtype) is not None:
    return dtype
  given, supported, hint = f"dtype {dtype.name}", "Supported dtypes", ""
  if shape is not None:
    given, supported = f"shape {tuple(shape)} and {given}", "Supported"
    if dtype.kind == "c":
      hint = (" Pass the real and imaginary parts as two arrays (jnp.real(x),"
              " jnp.imag(x)), or view them as pairs of reals with"
              " jax.lax.bitcast_convert_type.")
  raise TypeError(
      f"triton_call: {where} has {given}, which Triton kernels cannot take."
      f" {supported}: {', '.join(SUPPORTED_DTYPES)}.{hint}")


def pointer_type(dtype: Any) -> str | None:
  """Triton's pointer type for an array of ``dtype``, or None if unsupported."""
  element = _POINTER_ELEMENT_TYPES.get(np.dtype(dtype).name)
  return None if element is None else "*" + element


def is_scalar(value: Any) -> bool:
  """Whether ``value`` is passed to the kernel by value rather than pointer."""
  return isinstance(value,
                    (bool, int, float, np.bool_, np.integer, np.floating))


def scalar_type(value: Any) -> str | None:
  """Triton's type for a scalar argument; None for an int over 64 bits. Ints
  as Triton's launcher types them, floats as jax-triton 0.4 does: fp32 where
  float32 holds them (``np.float32``/``np.float16`` always), else fp64."""
  if isinstance(value, (bool, np.bool_)):
    return "i1"
  if isinstance(value, (int, np.integer)):
    value = int(value)
    if -(2**31) <= value < 2**31:
      return "i32"
    if -(2**63) <= value < 2**63:
      return "i64"
    if 2**63 <= value < 2**64:
      return "u64"
    return None
  if isinstance(value, (np.float32, np.float16)):
    return "fp32"
  magnitude = abs(float(value))
  fits = (magnitude in (0.0, float("inf")) or magnitude != magnitude
          or FLOAT32_TINY <= magnitude <= FLOAT32_MAX)
  return "fp32" if fits else "fp64"


def overflows_float32(value: Any) -> bool:
  """Whether a finite float scalar rounds to infinity as a float32."""
  if isinstance(value, (bool, np.bool_, int, np.integer)):
    return False
  magnitude = abs(float(value))
  return magnitude != float("inf") and magnitude >= FLOAT32_OVERFLOW


def python_scalar(value: Any, as_type: str | None = None) -> bool | int | float:
  """``value`` as the Python scalar jaxlib casts to ``as_type`` (its own)."""
  as_type = as_type or scalar_type(value)
  if as_type == "i1":
    return bool(value)
  if as_type.startswith("fp"):
    return float(value)
  return int(value)


def plain_constexpr(value: Any) -> Any:
  """A constexpr with NumPy scalars (in tuples too) as Python scalars, the
  only ones Triton's code generator takes."""
  if isinstance(value, (np.bool_, np.integer, np.floating)):
    return python_scalar(value)
  if type(value) is tuple:  # pylint: disable=unidiomatic-typecheck
    return tuple(plain_constexpr(v) for v in value)
  return value


# The range of each integer type a parameter may declare, by Triton's name.
INT_RANGES = {f"{sign}{bits}": (0, 2**bits - 1) if sign == "u"
              else (-(2**(bits - 1)), 2**(bits - 1) - 1)
              for sign in "iu" for bits in (8, 16, 32, 64)}
