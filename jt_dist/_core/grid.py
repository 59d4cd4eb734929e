"""Evaluating and checking launch grids."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping, Sequence, Union

from jt_dist import _errors

Grid = Union[int, Sequence[int]]
GridOrCallable = Union[Grid, Callable[[Mapping[str, Any]], Grid]]

# CUDA's gridDim limits; ROCm's are at least as large.
MAX_GRID = (2**31 - 1, 65535, 65535)
_AXES = ("x", "y", "z")


def evaluate_grid(
    grid: GridOrCallable, named: Mapping[str, Any], where: str
) -> tuple[int, int, int]:
  """Evaluates ``grid`` for one config and pads it to three dimensions.

  Args:
    grid: an int, a sequence of up to three ints, or a callable taking a dict
      of every metaparam and scalar argument by kernel parameter name.
    named: what a callable grid receives.
    where: the config, for error messages.

  Returns:
    The grid as an (x, y, z) tuple.

  Raises:
    TypeError: if the grid is not made of ints.
    ValueError: if it has more than three dimensions, an entry below one, or
      an entry above the launch limit.
  """
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
        f" callable returning one; got {grid!r}{where}."
    ) from None
  if len(dims) > 3 or not dims:
    raise ValueError(
        f"triton_call: `grid` must have 1 to 3 dimensions; got {dims!r} with"
        f" {len(dims)}{where}. Fold extra dimensions into one, and recover"
        " them in the kernel from tl.program_id with // and %."
    )
  for axis, (value, limit) in enumerate(zip(dims, MAX_GRID)):
    _check_dim(value, axis, limit, dims, where, given)
  return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _check_dim(value, axis, limit, dims, where, given) -> None:
  name = f"grid[{axis}] ({_AXES[axis]})"
  if not isinstance(value, numbers.Integral) or isinstance(value, bool):
    raise TypeError(
        f"triton_call: {name} must be an int; got {value!r} of type"
        f" {type(value).__name__} in grid {dims!r}{where}."
        + (" The grid callable must return ints." if callable(given) else "")
    )
  if value <= 0:
    raise ValueError(
        f"triton_call: {name} must be at least 1; got {int(value)} in grid"
        f" {dims!r}{where}. A grid computed with // can round down to 0:"
        " use triton.cdiv(n, BLOCK) instead."
    )
  if value > limit:
    raise ValueError(
        f"triton_call: {name} = {int(value)} exceeds the launch limit of"
        f" {limit} for that axis (grid {dims!r}{where}). Use larger blocks,"
        " or put the longest dimension on axis 0, whose limit is"
        f" {MAX_GRID[0]}."
    )
