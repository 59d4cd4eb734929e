"""``shard_size``: a placeholder for a shard-local size, resolved per shard."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from jt_dist._core import types as _types


@dataclasses.dataclass(frozen=True)
class ShardSize:
  """Stands for the size of a positional array argument, where the kernel runs.

  Inside ``sharded_triton_call`` (or any ``shard_map``) the argument is the
  shard, so the value is shard-local; in a plain ``triton_call`` it is the
  array's own size. Create it with ``jt_dist.shard_size``.
  """

  arg_index: int
  axis: int | None = None

  def resolve(self, args: Sequence[Any], where: str) -> int:
    """The size this placeholder stands for, given the call's arguments."""
    if not 0 <= self.arg_index < len(args):
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}], but the call"
          f" has {len(args)} positional arguments (indices 0 to"
          f" {len(args) - 1}). Use the index of an array argument.")
    target = args[self.arg_index]
    if type(target) is tuple:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}], a tuple"
          " operand, which has no size of its own. Point it at an array"
          " argument: pass the array whose size you need as a positional"
          " argument of its own, or give the size as a plain int.")
    if _types.is_scalar(target) or not hasattr(target, "shape"):
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}] = {target!r},"
          " a scalar, which has no size. Point it at an array argument.")
    shape = tuple(target.shape)
    if self.axis is None:
      return math.prod(shape)
    if not -len(shape) <= self.axis < len(shape):
      raise ValueError(
          f"{where} = {self!r}: args[{self.arg_index}] has shape {shape}"
          f" (rank {len(shape)}), so axis={self.axis} is out of range.")
    return shape[self.axis]


def shard_size(arg_index: int, axis: int | None = None) -> ShardSize:
  """A placeholder for the shard-local size of a positional array argument.

  Pass it as a positional scalar argument or as a metaparam of
  ``triton_call`` or ``sharded_triton_call``. It is resolved where the kernel
  runs, so the kernel and a grid callable both see the local value.

  Args:
    arg_index: the index of the array among the call's positional arguments.
    axis: a dimension of that array, or None for its total element count.

  Returns:
    The placeholder.

  Raises:
    TypeError: ``arg_index`` or ``axis`` is not an int.
  """
  for name, value in (("arg_index", arg_index), ("axis", axis)):
    if value is not None and (not isinstance(value, int)
                              or isinstance(value, bool)):
      raise TypeError(
          f"shard_size: {name}={value!r} of type {type(value).__name__} must"
          " be an int.")
  if arg_index is None:
    raise TypeError("shard_size: arg_index is required (an int).")
  return ShardSize(arg_index, axis)


def resolve(args: Sequence[Any], metaparams: Mapping[str, Any]):
  """Args (a list) and metaparams with each ``ShardSize`` (tuple leaves of
  args too) resolved."""
  new_args = [_resolved(a, args, f"triton_call: args[{i}]")
              for i, a in enumerate(args)]
  return new_args, {k: v.resolve(args, f"triton_call: metaparam {k}")
                    if isinstance(v, ShardSize) else v
                    for k, v in metaparams.items()}


def _resolved(arg: Any, args: Sequence[Any], where: str) -> Any:
  if type(arg) is tuple:  # pylint: disable=unidiomatic-typecheck
    return tuple(_resolved(a, args, f"{where}[{k}]")
                 for k, a in enumerate(arg))
  return arg.resolve(args, where) if isinstance(arg, ShardSize) else arg
