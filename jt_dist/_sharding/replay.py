"""Eager per-shard calls from a cache: the jitted ``shard_map``, replayed.

An eager ``sharded_triton_call``, or a ``triton_call`` with a
``sharding_rule`` on sharded arrays, builds a ``shard_map`` of the kernel
call and runs it. The first call with a signature files a ``ReplayEntry``
holding that ``shard_map`` jitted; later calls call it, moving only the
operands that are not laid out as it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from jt_dist._core import call_cache as _call_cache
from jt_dist._core import kernel as _kernel
from jt_dist._sharding import specs as _specs


@dataclasses.dataclass(eq=False)
class ReplayEntry:
  """A call run once per shard: a jitted ``shard_map`` and its operands.

  ``targets`` holds, per array operand, the sharding it is moved to, or
  None where it is laid out already (the key holds its sharding, so that
  is so on every call with this signature).
  """

  fn: Callable[..., Any]
  array_positions: tuple[int, ...]
  targets: tuple
  out_tree: Any
  grid: Any
  source: tuple
  kernel: Any  # Held: the key has its id.
  moves: bool = True  # Whether any target is not None.
  single: bool = False  # Whether out_shape is one leaf.
  # Whether the operands are exactly the arguments, in order, unmoved.
  direct: bool = False

  def __post_init__(self):
    # Read on every hit (``jt_dist._call.dispatch``), unpacked once here.
    self.jit_fn, self.src = self.source
    # Whether ``matches`` must run: more than the source to check.
    self.checks = callable(self.grid) or not hasattr(self.jit_fn, "src")

  def matches(self, grid: Any) -> bool:
    jit_fn, src = self.source
    return getattr(jit_fn, "src", None) is src and (
        not callable(grid) or grid is self.grid)

  def __call__(self, args: Sequence[Any]) -> Any:
    if self.direct:  # One call of the jitted ``shard_map``.
      outs = self.fn(*args)
    elif self.moves:
      outs = self.fn(*[
          args[i] if target is None else jax.device_put(args[i], target)
          for i, target in zip(self.array_positions, self.targets)])
    else:  # Laid out already.
      outs = self.fn(*[args[i] for i in self.array_positions])
    if self.single:
      return outs[0]
    return jax.tree_util.tree_unflatten(self.out_tree, list(outs))


def _replay_target(x: Any, spec: Any, mesh: Any) -> Any:
  """Where a per-shard call's operand must move: None if it may stay.

  An operand whose sharding lays it out as ``spec`` does over ``mesh``
  (one device's array on a mesh of that one device, say) is passed as it
  is: the jitted ``shard_map`` takes it without a ``device_put`` per call.
  Not where ``spec`` names an explicit mesh axis: ``shard_map`` then
  checks the operand's type, which only a move gives that axis.
  """
  target = _specs.move_target(x, spec, mesh)
  if target is None:
    return None
  try:
    named = {axis for entry in spec if entry is not None
             for axis in ((entry,) if isinstance(entry, str) else entry)}
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    current = x.sharding
    # An array typed on another mesh keeps that mesh in its type.
    other_mesh = (isinstance(current, jax.sharding.NamedSharding)
                  and current.mesh != mesh)
    if not other_mesh and all(
        types[axis] != jax.sharding.AxisType.Explicit for axis in named) and (
            current.is_equivalent_to(target, x.ndim)):
      return None
  except Exception:  # pylint: disable=broad-except
    pass  # Not comparable: moving it is always right.
  return target


def recorder(key, kernel, grid):
  """A function that files a per-shard call's entry and returns its jit.

  The partitioning code calls it with the call's arguments, the array
  positions, their specs, the mesh, the ``shard_map``-ed function and the
  outputs' structure, once the operands have been laid out (so that a
  layout that cannot be made has raised already).
  """

  def record(args, positions, in_specs, mesh, mapped, out_tree):
    fn = jax.jit(mapped)
    targets = tuple(_replay_target(args[i], spec, mesh)
                    for i, spec in zip(positions, in_specs))
    moves = any(t is not None for t in targets)
    _call_cache.entries.put(key, ReplayEntry(
        fn=fn, array_positions=tuple(positions), targets=targets,
        out_tree=out_tree, grid=grid,
        source=_call_cache.source_of(_kernel.kernel_info(kernel)),
        kernel=kernel, moves=moves,
        single=out_tree.num_leaves == 1 and out_tree.num_nodes == 1,
        direct=not moves and tuple(positions) == tuple(range(len(args)))))
    return fn

  return record
