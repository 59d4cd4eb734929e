"""Tuple operands: (nested) tuples of arrays and scalars for tuple parameters.

Each leaf is one operand, named by its parameter and path (``yz[1]``);
arrays are numbered in flattened order with the others, as
``input_output_aliases`` keys count them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


def is_tuple(arg: Any) -> bool:
  return type(arg) is tuple  # pylint: disable=unidiomatic-typecheck


def leaves_with_paths(arg: Any, path: tuple[int, ...] = ()):
  """``(path, leaf)`` of each leaf of a nested tuple, in order."""
  if not is_tuple(arg):
    return [(path, arg)]
  return [leaf for k, item in enumerate(arg)
          for leaf in leaves_with_paths(item, path + (k,))]


def label(name: str, path: tuple[int, ...]) -> str:
  """``yz[1]`` for the leaf of ``yz`` at path (1,)."""
  return name + "".join(f"[{k}]" for k in path)


def where(i: int, path: tuple[int, ...]) -> str:
  return label(f"args[{i}]", path)


def nest(items: Sequence[tuple[tuple[int, ...], Any]]) -> Any:
  """The nested tuple whose leaves at ``path`` are ``value``."""
  if len(items) == 1 and not items[0][0]:
    return items[0][1]
  groups: dict[int, list] = {}
  for path, value in items:
    groups.setdefault(path[0], []).append((path[1:], value))
  return tuple(nest(groups[k]) for k in sorted(groups))


@dataclasses.dataclass(frozen=True)
class FlatArgs:
  """A call's positional arguments with tuple operands spread into leaves;
  another argument (or an empty tuple, refused later) is one leaf."""

  leaves: tuple  # Every leaf, in order.
  # Per leaf, ``(argument index, path in its tuple)``.
  places: tuple[tuple[int, tuple[int, ...]], ...]
  n_args: int  # The number of positional arguments.

  @property
  def names(self) -> list[str]:
    """Each leaf as messages name it: ``args[1]``, ``args[1][0]``."""
    return [where(i, path) for i, path in self.places]

  def rebuild(self, leaves: Sequence[Any]) -> list[Any]:
    """The positional arguments with ``leaves`` in the leaves' places."""
    groups: list[list] = [[] for _ in range(self.n_args)]
    for (i, path), leaf in zip(self.places, leaves):
      groups[i].append((path, leaf))
    return [nest(items) for items in groups]


def flatten(args: Sequence[Any]) -> FlatArgs:
  leaves, places = [], []
  for i, arg in enumerate(args):
    items = [((), arg)] if _has_empty(arg) else leaves_with_paths(arg)
    for path, leaf in items:
      leaves.append(leaf)
      places.append((i, path))
  return FlatArgs(tuple(leaves), tuple(places), len(args))


def _has_empty(arg: Any) -> bool:
  """Whether a (nested) tuple is or holds an empty tuple."""
  return is_tuple(arg) and (not arg or any(_has_empty(a) for a in arg))
