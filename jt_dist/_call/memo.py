"""The front doors' memo: a call's static parts -> its ``KernelCall``.

``triton_call`` and ``sharded_triton_call`` each keep one, so that a
repeated call finds the jitted function it made before; jax.jit then does
the rest (shapes, dtypes, shardings, compiled executables). Keys compare
values as Triton specialises on them (``jt_dist._core.exact``).
"""

from __future__ import annotations

from typing import Any

import jax

from jt_dist._backend import cache as _cache
from jt_dist._core import exact as _exact

DEFAULT_ENTRIES = 256


class Memo:
  """A bounded map; the oldest entry goes first when it is full."""

  def __init__(self, max_entries: int = DEFAULT_ENTRIES):
    self.max_entries = max_entries
    self._entries: dict[Any, Any] = {}
    # The dict's own lookup: a front door calls it once per call.
    self.get = self._entries.get

  def put(self, key: Any, value: Any) -> None:
    self._entries[key] = value
    self._evict()

  def resize(self, max_entries: int) -> None:
    self.max_entries = max_entries
    self._evict()

  def _evict(self) -> None:
    entries = self._entries
    while len(entries) > self.max_entries:
      del entries[next(iter(entries))]

  def clear(self) -> None:
    self._entries.clear()

  def __len__(self) -> int:
    return len(self._entries)


triton_calls = Memo()
sharded_calls = Memo()


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
  """The key of a grid: its values, or a callable's code and closure.

  An inline lambda is a new object per call with the same code; its
  closure's and defaults' values tell two lambdas apart. Raises TypeError
  for a closure over an unhashable value: the caller then keys nothing.
  """
  if type(grid) is tuple:  # pylint: disable=unidiomatic-typecheck
    return _exact.plain_tuple_key(grid)
  code = getattr(grid, "__code__", None)
  if code is None:
    return _exact.key(grid)
  cells = tuple(c.cell_contents for c in (grid.__closure__ or ()))
  return code, _exact.key(cells), _exact.key(grid.__defaults__)


def configure_cache(*, disk_cache: bool | None = None,
                    cache_dir: str | None = None,
                    memory_entries: int | None = None,
                    dispatch_entries: int | None = None) -> None:
  """Sets how kernels and calls are cached; arguments left None are unchanged.

  Args:
    disk_cache: whether to use the on-disk cache of compiled kernels
      (overrides ``JT_DIST_DISK_CACHE``).
    cache_dir: the on-disk cache's directory (overrides
      ``JT_DIST_CACHE_DIR``).
    memory_entries: how many compiled kernels the in-process cache keeps.
    dispatch_entries: how many eager call signatures ``triton_call`` and
      ``sharded_triton_call`` each keep (256 by default). Each holds a
      jitted function and its compiled executables until it is evicted.

  Raises:
    TypeError: an argument has the wrong type.
    ValueError: ``memory_entries`` or ``dispatch_entries`` is below 1, or
      ``cache_dir`` is empty or holds a NUL character.
  """
  if dispatch_entries is not None:
    if not isinstance(dispatch_entries, int) or isinstance(
        dispatch_entries, bool):
      raise TypeError(
          f"configure_cache: dispatch_entries={dispatch_entries!r} of type"
          f" {type(dispatch_entries).__name__} must be an int, e.g. 256.")
    if dispatch_entries < 1:
      raise ValueError(
          f"configure_cache: dispatch_entries={dispatch_entries!r} must be"
          " at least 1 (the number of eager call signatures kept in"
          " memory).")
  _cache.configure(disk_cache=disk_cache, cache_dir=cache_dir,
                   memory_entries=memory_entries)
  if dispatch_entries is not None:
    for memo in (triton_calls, sharded_calls):
      memo.resize(dispatch_entries)
