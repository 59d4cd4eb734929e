"""The front doors' memo: a call's static parts -> its ``KernelCall``.

``triton_call`` and ``sharded_triton_call`` each keep one, so that a
repeated call finds the jitted function it made before; jax.jit then does
the rest (shapes, dtypes, shardings, compiled executables). Keys compare
values as Triton specialises on them (``jt_dist._core.exact``).
"""

from __future__ import annotations

import types
from typing import Any

import jax

from jt_dist import _settings
from jt_dist._core import exact as _exact


class Memo:
  """A bounded map; the oldest entry goes first when it is full. Its bound,
  ``jt_dist._settings.dispatch_entries()``, is asked at each put and trim
  (``configure_cache`` trims the memos when it changes it)."""

  def __init__(self):
    self._entries: dict[Any, Any] = {}
    # The dict's own lookup: a front door calls it once per call.
    self.get = self._entries.get

  def put(self, key: Any, value: Any) -> None:
    self._entries[key] = value
    self.trim()

  def trim(self) -> None:
    """Evicts the oldest entries over the bound."""
    entries = self._entries
    limit = _settings.dispatch_entries()
    while len(entries) > limit:
      # pop, not del: configure_cache may trim from another thread.
      entries.pop(next(iter(entries)), None)

  def clear(self) -> None:
    self._entries.clear()

  def __len__(self) -> int:
    return len(self._entries)


triton_calls = Memo()
sharded_calls = Memo()
_settings.trim_on_configure(triton_calls.trim)
_settings.trim_on_configure(sharded_calls.trim)


def out_key(out_shape: Any) -> Any:
  """The key of ``out_shape``: its structure, shapes, dtypes, shardings."""
  if type(out_shape) is jax.ShapeDtypeStruct:  # pylint: disable=unidiomatic-typecheck
    # Its own __hash__ is Python; a tuple of its fields hashes in C.
    return (out_shape.shape, out_shape.dtype, out_shape.sharding,
            out_shape.weak_type)
  leaves, tree = jax.tree_util.tree_flatten(
      out_shape, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))
  return tree, tuple(
      (type(leaf), tuple(leaf.shape), leaf.dtype,
       getattr(leaf, "sharding", None)) for leaf in leaves)


def grid_key(grid: Any) -> Any:
  """The key of a grid: its values; a function's code, closure and defaults
  (an inline lambda is a new object per call with the same code; the values
  it was made with tell two apart); any other callable (a bound method, a
  ``functools.partial``) as the object it is. Raises TypeError for an
  unhashable part: the caller then keys nothing."""
  if type(grid) is tuple:  # pylint: disable=unidiomatic-typecheck
    return _exact.plain_tuple_key(grid)
  if type(grid) is not types.FunctionType:  # pylint: disable=unidiomatic-typecheck
    return _exact.key(grid)
  cells = tuple(c.cell_contents for c in (grid.__closure__ or ()))
  return (grid.__code__, _exact.key(cells), _exact.key(grid.__defaults__),
          _exact.key(grid.__kwdefaults__))
