"""Scalars as a runtime operand of the CPU's host callback.

A scalar's value is part of a ``CallSpec``, so an eager loop passing a new
value each step (a learning rate, a step count) would otherwise make a new
XLA executable every step. On the CPU nothing needs the value at compile
time: a ``KernelCall`` made for the CPU binds a spec whose scalars are
marked runtime (``CallSpec.with_runtime_scalars``), and passes their 64-bit
patterns as one extra ``uint32`` operand of its jitted function (64-bit
integers do not survive JAX's default 32-bit mode), which the host callback
unpacks before the launch.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any, Sequence

import numpy as np

# One 8-byte slot per scalar, by Triton type: signed, unsigned or float.
_FORMATS = {"i1": "q", "i8": "q", "i16": "q", "i32": "q", "i64": "q",
            "u8": "Q", "u16": "Q", "u32": "Q", "u64": "Q",
            "fp16": "d", "bf16": "d", "fp32": "d", "fp64": "d"}


def _scalar_types(spec) -> tuple[str, ...]:
  return tuple(op.type for op in spec.operands if op.kind == "scalar")


def packable(scalar_type: str | None) -> bool:
  """Whether a scalar of Triton type ``scalar_type`` has a runtime slot."""
  return scalar_type in _FORMATS


def _struct(spec) -> struct.Struct:
  return _layout(_scalar_types(spec))


@functools.lru_cache(maxsize=256)
def _layout(types: tuple[str, ...]) -> struct.Struct:
  return struct.Struct("<" + "".join(_FORMATS[t] for t in types))


def pack(types: Sequence[str], values: Sequence[Any]) -> np.ndarray:
  """The operand that carries ``values`` of Triton ``types``, in order.

  Python and NumPy ints and floats pack as they are (ints through
  ``__index__``), so callers need no conversion per value.
  """
  return np.frombuffer(_layout(tuple(types)).pack(*values), np.uint32)


def unpack(spec, arrays: Sequence[Any]):
  """Splits the host callback's operands; returns ``(spec, arrays)``.

  The returned spec has the scalar values in place and is no longer marked
  runtime, so the launch proceeds as for any other call.
  """
  *arrays, words = arrays
  layout = _struct(spec)
  values = iter(layout.unpack(np.ascontiguousarray(words).tobytes()))
  operands = []
  for op in spec.operands:
    if op.kind == "scalar":
      value = next(values)
      op = dataclasses.replace(
          op, value=bool(value) if op.type == "i1" else value)
    operands.append(op)
  spec = dataclasses.replace(spec, operands=tuple(operands),
                             runtime_scalars=False)
  return spec, arrays
