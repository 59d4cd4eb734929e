"""Values compared as Triton specialises on them, for keys and specs.

Python says ``4 == 4.0 == True``, ``0.0 == -0.0`` and ``(4,) == (4.0,)``;
Triton compiles a different kernel for each. So every key or spec standing
for a compiled kernel compares values through ``key``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from triton import language as tl

# Types whose ``==`` already tells every Triton-distinct value apart once
# the type is compared too.
PLAIN = frozenset((int, bool, str, bytes, type(None)))


def key(value: Any) -> Any:
  """A hashable stand-in for ``value``, equal only for equal kernels."""
  kind = type(value)
  if kind in PLAIN:
    return kind, value
  if kind is float:
    # The sign of zero, NaNs and infinities are in the bits.
    return kind, value.hex() if math.isfinite(value) else repr(value)
  if kind is tuple or kind is list:
    return kind, tuple(key(v) for v in value)
  if kind is dict:
    return kind, tuple((key(k), key(v)) for k, v in value.items())
  if isinstance(value, np.generic):
    return kind, value.tobytes()
  if isinstance(value, tl.constexpr):
    return kind, key(value.value)
  hash(value)
  return kind, value


def items_key(items) -> tuple:
  """``key`` of each value of ``(name, value)`` pairs, names kept."""
  return tuple((name, key(value)) for name, value in items)


def dict_key(mapping: dict) -> tuple:
  """``items_key`` of a dict's items; quickly for ints and strings."""
  kinds = tuple(map(type, mapping.values()))
  if PLAIN.issuperset(kinds):
    # The common case, keyed without a Python loop.
    return tuple(mapping.items()), kinds
  return items_key(mapping.items())


def plain_tuple_key(value: Any) -> Any:
  """``key`` of a tuple of ints (a grid, say), quickly; else ``key``."""
  if type(value) is tuple:  # pylint: disable=unidiomatic-typecheck
    kinds = tuple(map(type, value))
    if PLAIN.issuperset(kinds):
      return kinds, value
  return key(value)
