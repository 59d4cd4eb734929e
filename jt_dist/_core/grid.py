"""Evaluating and checking launch grids."""

from __future__ import annotations

import numbers
from typing import Any, Mapping

from jt_dist import _errors

# CUDA's gridDim limits; ROCm's are at least as large.
MAX_GRID = (2**31 - 1, 65535, 65535)


def evaluate_grid(grid: Any, named: Mapping[str, Any],
                  where: str) -> tuple[int, int, int]:
  """``grid`` (an int, up to 3 ints or a callable of ``named``) as x, y, z."""
  given = grid
  if callable(grid):
    grid = _errors.call_user(grid, "the grid callable", dict(named))
  if isinstance(grid, numbers.Integral):
    grid = (grid,)
  try:
    dims = tuple(grid)
  except TypeError:
    raise TypeError(
        f"triton_call: `grid` must be an int, a tuple of up to 3 ints or a"
        f" callable returning one; got {grid!r}{where}.") from None
  if len(dims) > 3 or not dims:
    raise ValueError(
        f"triton_call: `grid` must have 1 to 3 dimensions; got {dims!r} with"
        f" {len(dims)}{where}. Fold extra dimensions into one, and recover"
        " them in the kernel from tl.program_id with // and %.")
  for axis, (value, limit) in enumerate(zip(dims, MAX_GRID)):
    name = f"grid[{axis}] ({'xyz'[axis]})"
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
      raise TypeError(
          f"triton_call: {name} must be an int; got {value!r} of type"
          f" {type(value).__name__} in grid {dims!r}{where}."
          + (" The grid callable must return ints." if callable(given) else ""))
    if value <= 0:
      raise ValueError(
          f"triton_call: {name} must be at least 1; got {int(value)} in grid"
          f" {dims!r}{where}. A grid computed with // can round down to 0:"
          " use triton.cdiv(n, BLOCK) instead.")
    if value > limit:
      raise ValueError(
          f"triton_call: {name} = {int(value)} exceeds the launch limit of"
          f" {limit} for that axis (grid {dims!r}{where}). Use larger blocks,"
          " or put the longest dimension on axis 0, whose limit is"
          f" {MAX_GRID[0]}.")
  return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
