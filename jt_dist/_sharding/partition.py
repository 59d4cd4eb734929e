"""A call with a ``ShardingRule``, run once per shard.

On explicit mesh axes (``run``) the specs are known at trace time: operands
that disagree with the plan are resharded and the kernel runs in a
``jax.shard_map`` (exportable). On automatic axes the layout is XLA's:
GPUs hand the call to ``custom_partitioning`` (``run_auto``); elsewhere it
is refused, since a host callback inside ``custom_partitioning`` crashes
the process (jax PR #23620).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, NamedTuple, Sequence

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._sharding import specs as _specs

logger = logging.getLogger("jt_dist")


class Layout(NamedTuple):
  """The mesh a call runs on and the current spec of each array operand."""

  mesh: Any
  specs: tuple[P, ...]
  auto: bool = False  # XLA lays the operands out: run_auto.


class Plan(NamedTuple):
  """The specs that follow from which mesh axes split which factor."""

  in_specs: tuple[P, ...]
  out_specs: tuple[P, ...]
  # Per output: ((op, axes), ...) to apply to the shard's partial result.
  reductions: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]


def _entries(spec: Any, rank: int) -> list[tuple[str, ...]]:
  """Each of ``rank`` dimensions' mesh axes under ``spec``."""
  entries = [_specs.entry_axes(e) for e in list(spec or ())[:rank]]
  return entries + [()] * (rank - len(entries))


def _split_axes(mesh) -> dict[str, int]:
  """The mesh axes a call could still be split over: those not manual."""
  manual = _specs.manual_axes(mesh)
  return {a: n for a, n in mesh.shape.items() if a not in manual}


def find_layout(args: Sequence[Any], rule, where: str) -> Layout | None:
  """The layout a call with ``rule`` is split over; None (a plain call)
  where no operand's mesh has an axis not already manual."""
  flat, positions = _specs.arrays_of(args)
  arrays = [(flat.names[k], flat.leaves[k]) for k in positions]
  meshes = [(i, _specs.mesh_of(x)) for i, x in arrays
            if _specs.mesh_of(x) is not None]
  mesh = meshes[0][1] if meshes else None
  for i, other in meshes[1:]:
    if (other.shape != mesh.shape or _compat.mesh_devices(other)
        != _compat.mesh_devices(mesh)):
      raise _errors.ShardingSpecError(
          f"{where}: {meshes[0][0]} lives on mesh {_describe(mesh)} but"
          f" {i} on mesh {_describe(other)}; one call runs on one"
          " mesh. Put every operand on the same mesh with jax.device_put(x,"
          " NamedSharding(mesh, spec)) or jax.sharding.reshard.")
  traced = any(isinstance(x, jax.core.Tracer) for _, x in arrays)
  if mesh is None and traced:
    ambient = jax.sharding.get_abstract_mesh()
    mesh = None if ambient.empty else ambient
  if mesh is None or not _split_axes(mesh):
    return None
  return Layout(mesh, tuple(_specs.infer_spec(x, mesh) for _, x in arrays),
                auto=traced and _auto_axes(mesh, rule, where))


def _describe(mesh) -> str:
  """A mesh's axes, and its devices' ids where it has devices."""
  ids = [d.id for d in _compat.mesh_devices(mesh)]
  return f"{dict(mesh.shape)}" + (f" over devices {ids}" if ids else "")


def _auto_axes(mesh, rule, where: str) -> bool:
  """Whether XLA lays the call out; refused where it cannot be handed over."""
  manual = _specs.manual_axes(mesh)
  types = dict(zip(mesh.axis_names, mesh.axis_types))
  auto = sorted(a for a, n in _split_axes(mesh).items()
                if n > 1 and _compat.is_auto_axis(types[a]))
  if not auto:
    return False
  platform = _compat.mesh_platform(mesh)
  if platform in ("cuda", "gpu", "rocm"):
    if not manual:
      return True
    why = (" inside a shard_map manual over"
           f" {sorted(manual)}, where jt_dist does not hand Triton calls to"
           " XLA's partitioner")
  else:
    why = (f" on {platform or 'an unknown platform'}, where jt_dist cannot"
           " hand them to XLA's partitioner: the kernel runs as a host"
           " callback there, and a host callback inside"
           " jax.experimental.custom_partitioning crashes the process (on"
           " GPUs such calls are partitioned by XLA)")
  raise _errors.AutoAxesError(
      f"{where}: the call with {rule!r} is traced over mesh axes {list(auto)}"
      f" of mesh {dict(mesh.shape)}, which are automatic (AxisType.Auto):"
      " their layout is XLA's choice, unknown when the call is traced,"
      f"{why}. Make the mesh axes explicit, e.g."
      f" jax.make_mesh({tuple(mesh.shape.values())}, {tuple(mesh.axis_names)},"
      " axis_types=(jax.sharding.AxisType.Explicit,) *"
      f" {len(mesh.axis_names)}), or call"
      " jt_dist.sharded_triton_call(..., mesh=mesh, sharding_rule=rule).")


def make_plan(rule, sizes: dict[str, int], layout: Layout) -> Plan:
  """Assigns mesh axes to factors first come first served, as XLA does:
  operands in order, dimensions left to right; a dimension's axes go to its
  factor unless it is whole, already has axes, or an axis is taken."""
  split = _split_axes(layout.mesh)
  factor_axes: dict[str, tuple[str, ...]] = {}
  used: set[str] = set()
  for factors, spec in zip(rule.operands, layout.specs):
    for factor, axes in zip(factors, _entries(spec, len(factors))):
      axes = tuple(a for a in axes if a in split)
      if (not axes or factor in rule.whole or factor in factor_axes
          or used & set(axes)
          or sizes[factor] % math.prod(split[a] for a in axes)):
        continue
      factor_axes[factor] = axes
      used.update(axes)
  in_specs, out_specs = (
      tuple(_specs.spec_of([factor_axes.get(f, ()) for f in factors])
            for factors in groups) for groups in (rule.operands, rule.outputs))
  reductions = tuple(
      tuple((op, factor_axes[f]) for f, op in rule.reductions
            if f not in out and f in factor_axes)
      for out in rule.outputs)
  return Plan(in_specs, out_specs, reductions)


def _describe_move(name, factors, current, target) -> list[str]:
  """What resharding one operand takes, dimension by dimension."""
  now = _entries(current, len(factors))
  then = _entries(target, len(factors))
  leaving = {a for n, t in zip(now, then) for a in n if a not in t}
  moves = []
  for dim, (factor, n, t) in enumerate(zip(factors, now, then)):
    gone = [a for a in n if a not in t]
    new = [a for a in t if a not in n]
    if gone:
      moves.append(f"{name} dimension {dim} (factor {factor!r}): all-gather"
                   f" over mesh axes {gone}")
    if new:
      how = ("all-to-all" if set(new) & leaving
             else "local slice, no communication")
      moves.append(f"{name} dimension {dim} (factor {factor!r}): split over"
                   f" mesh axes {new} ({how})")
  return moves


def _kernel_name(kernel) -> str:
  return getattr(kernel, "__name__", None) or getattr(
      getattr(kernel, "fn", None), "__name__", repr(kernel))


def factor_sizes(rule, args: Sequence[Any], out_shapes) -> dict[str, int]:
  """``rule``'s factor sizes from the call's arrays and ``out_shapes``."""
  flat, positions = _specs.arrays_of(args)
  return rule.factor_sizes(
      [(flat.names[k], tuple(flat.leaves[k].shape)) for k in positions],
      [shape for shape, _ in out_shapes])


def _log_plan(where, rule, kernel, names, layout, plan) -> None:
  """Names, at debug level, every collective the plan adds around the call."""
  if not logger.isEnabledFor(logging.DEBUG):
    return
  steps = [step for operand in zip(names, rule.operands, layout.specs,
                                   plan.in_specs)
           for step in _describe_move(*operand)]
  steps += [f"output {k}: all-reduce ({op}) over mesh axes {list(axes)}"
            for k, reductions in enumerate(plan.reductions)
            for op, axes in reductions]
  for step in steps:
    logger.debug("%s: kernel %s with %s: %s", where, _kernel_name(kernel),
                 rule, step)


def shard_body(args, call, kernel, grid, kwargs, out_shapes, out_tree,
               out_specs, mesh, reductions, ref_args=(), check=None):
  """The function one device runs: the kernel on its shard, then each
  output's ``reductions``; it returns the outputs' shards, flat, then the new
  values of the Refs made from ``ref_args``' values."""
  flat, positions = _specs.arrays_of(args)
  local_out = jax.tree_util.tree_unflatten(out_tree, [
      jax.ShapeDtypeStruct(_specs.local_shape(shape, spec, mesh), dtype)
      for (shape, dtype), spec in zip(out_shapes, out_specs)])

  def per_shard(*local_arrays):
    given = dict(zip(positions, local_arrays))
    local_args = flat.rebuild([given.get(k, x)
                               for k, x in enumerate(flat.leaves)])
    for i in ref_args:
      local_args[i] = jax.new_ref(local_args[i])
    outs = jax.tree_util.tree_leaves(
        call(*local_args, kernel=kernel, out_shape=local_out, grid=grid,
             **kwargs))
    for k, steps in enumerate(reductions):
      for op, axes in steps:
        outs[k] = _specs.COLLECTIVES[op](outs[k], axes)
    if check is not None:
      check(outs)
    return (*outs, *(local_args[i][...] for i in ref_args))

  return per_shard


def run(args: Sequence[Any], call: Callable[..., Any], kernel: Any,
        out_shapes, out_tree, grid: Any, rule, layout: Layout, kwargs: dict,
        where: str) -> Any:
  """Runs ``call`` (``local_call.shard_call``) once per shard of
  ``layout.mesh``, split by ``rule``; ``out_shapes`` are global."""
  flat, positions = _specs.arrays_of(args)
  plan = make_plan(rule, factor_sizes(rule, args, out_shapes), layout)
  _log_plan(where, rule, kernel, [flat.names[k] for k in positions], layout,
            plan)
  # XLA adds the collectives that lay the operands out as the plan wants.
  placed = [_specs.place(flat.leaves[k], target, layout.mesh)
            for k, target in zip(positions, plan.in_specs)]
  per_shard = shard_body(args, call, kernel, grid, kwargs, out_shapes,
                         out_tree, plan.out_specs, layout.mesh,
                         plan.reductions)
  mapped = jax.shard_map(
      per_shard, mesh=layout.mesh, in_specs=plan.in_specs,
      out_specs=plan.out_specs, check_vma=True,
      axis_names=frozenset(_split_axes(layout.mesh)))
  try:
    outs = mapped(*placed)
  except ValueError as e:
    # jax.shard_map's words when it is batched by jax.vmap over a dimension
    # that is itself sharded over the mesh axes the split needs.
    if "jax.shard_map requires axis_names" not in str(e):
      raise
    raise NotImplementedError(
        f"{where}: kernel {_kernel_name(kernel)!r} with sharding_rule {rule}"
        f" cannot be split over mesh {dict(layout.mesh.shape)}: under"
        " jax.vmap, the batch dimension is sharded over mesh axes that the"
        " split needs too. Give the rule the batch as a factor of its own"
        " (e.g. \"b i, b i -> b i\" for an add) and call it on the batched"
        " arrays without jax.vmap, or make the batch dimension replicated"
        " before jax.vmap (jax.sharding.reshard(x, P(None, ...)))."
    ) from e
  return jax.tree_util.tree_unflatten(out_tree, list(outs))


def run_auto(args: Sequence[Any], call: Callable[..., Any], kernel: Any,
             out_shapes, out_tree, grid: Any, rule, kwargs: dict,
             where: str) -> Any:
  """``run`` through ``custom_partitioning``: the partitioner's layout."""
  flat, positions = _specs.arrays_of(args)
  sizes = factor_sizes(rule, args, out_shapes)
  n = len(out_shapes)
  # The op's types, and the call where nothing is split.
  whole_call = shard_body(args, call, kernel, grid, kwargs, out_shapes,
                          out_tree, [P()] * n, None, [()] * n)

  def plan_for(mesh, arg_shapes):
    # The specs the partitioner chose (replicated where it chose none).
    layout = Layout(mesh, tuple(_specs.infer_spec(s, mesh)
                                for s in arg_shapes))
    return layout, make_plan(rule, sizes, layout)

  def infer(mesh, arg_shapes, result_shape):
    del result_shape
    return tuple(NamedSharding(mesh, s)
                 for s in plan_for(mesh, arg_shapes)[1].out_specs)

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    layout, plan = plan_for(mesh, arg_shapes)
    _log_plan(where, rule, kernel, [flat.names[k] for k in positions],
              layout, plan)
    body = shard_body(args, call, kernel, grid, kwargs, out_shapes,
                      out_tree, plan.out_specs, mesh, plan.reductions)
    return (mesh, body,
            tuple(NamedSharding(mesh, s) for s in plan.out_specs),
            tuple(NamedSharding(mesh, s) for s in plan.in_specs))

  op = custom_partitioning(whole_call)
  # Shardy propagates shardings through the op by the rule.
  op.def_partition(partition, infer_sharding_from_operands=infer,
                   sharding_rule=rule.rule,
                   reduction_factors=tuple(f for f, _ in rule.reductions),
                   need_replication_factors=tuple(rule.whole))
  outs = op(*[flat.leaves[k] for k in positions])
  return jax.tree_util.tree_unflatten(out_tree, list(outs))
