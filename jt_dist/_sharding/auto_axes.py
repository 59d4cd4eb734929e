"""Calls with a ``ShardingRule`` over automatic mesh axes, on GPUs.

On ``AxisType.Auto`` axes the layout is XLA's choice, made after tracing.
The call is therefore handed to XLA's partitioner through
``jax.experimental.custom_partitioning``: an outer op that Shardy propagates
shardings through by the rule (reductions as reduction factors, whole
factors as need-replication factors), and, once the partitioner has chosen
the operands' shardings, a per-device body (``partition.shard_body``) built
from them with the same plan as on explicit axes.

Only for GPUs: on the CPU the kernel is a host callback, and a host callback
inside a ``custom_partitioning`` partition crashes the process (jax PR
#23620), so CPU calls are refused before they get here. A program holding a
``custom_partitioning`` op cannot be exported with ``jax.export``; use
explicit axes for that.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jt_dist._core import pytree_args as _pytree_args
from jt_dist._sharding import partition as _partition


def run(args: Sequence[Any], call: Callable[..., Any], kernel: Any,
        out_shapes, out_tree, grid: Any, rule, kwargs: dict,
        where: str) -> Any:
  """``partition.run`` through ``custom_partitioning``, without a layout.

  The layout is the partitioner's, known only when it calls back.
  """
  flat = _pytree_args.flatten(args)
  positions = _partition.array_positions(args)
  names = [flat.names[k] for k in positions]
  sizes = _partition.factor_sizes(rule, args, out_shapes)
  global_out = jax.tree_util.tree_unflatten(
      out_tree, [jax.ShapeDtypeStruct(s, d) for s, d in out_shapes])

  def whole_call(*arrays):
    # Traced once with global shapes for the op's types, and run as is
    # where nothing is split (one device).
    full = _partition.with_arrays(flat, positions, arrays)
    return tuple(jax.tree_util.tree_leaves(
        call(*full, kernel=kernel, out_shape=global_out, grid=grid,
             **kwargs)))

  def plan_for(mesh, arg_shapes):
    # The specs the partitioner chose (replicated where it chose none).
    layout = _partition.Layout(mesh, tuple(
        s.sharding.spec if isinstance(getattr(s, "sharding", None),
                                      NamedSharding) else P()
        for s in arg_shapes))
    return layout, _partition.make_plan(rule, sizes, layout)

  def infer(mesh, arg_shapes, result_shape):
    del result_shape
    _, plan = plan_for(mesh, arg_shapes)
    return tuple(NamedSharding(mesh, s) for s in plan.out_specs)

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    layout, plan = plan_for(mesh, arg_shapes)
    _partition.log_plan(where, rule, kernel, names, layout, plan)
    body = _partition.shard_body(args, call, kernel, out_shapes, out_tree,
                                 grid, kwargs, plan, mesh)
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
