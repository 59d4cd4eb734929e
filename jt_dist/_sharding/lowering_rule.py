"""What every platform's lowering runs first (``checked``): the placement
check, so that XLA never silently replicates a kernel call, and one launch
per device inside a partially manual ``shard_map``."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist._backend import cache as _cache
from jt_dist._core import primitive as _primitive
from jt_dist._sharding import placement as _placement


def _manual_over_rest(ctx, args, spec, facts):
  """Lowers the call inside a shard_map manual over the remaining axes.

  The operands are replicated over them (the check passed): making them
  manual pins one launch per device, where XLA could partition a call it
  cannot see into (and CPU host callbacks need every axis manual).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    mesh = facts.mesh
  rest = frozenset(mesh.axis_names) - facts.manual_axes
  spec_none = jax.sharding.PartitionSpec()

  def body(*xs):
    return tuple(_primitive.triton_call_p.bind(*xs, spec=spec))

  inner = jax.shard_map(
      body, mesh=mesh, in_specs=(spec_none,) * len(args),
      out_specs=(spec_none,) * len(spec.out_shapes), axis_names=rest,
      check_vma=False)
  return mlir.lower_fun(inner, multiple_results=True)(ctx, *args)


def checked(rule: Callable[..., Any], choose: Callable[..., Any],
            platform: str) -> Callable[..., Any]:
  """``rule(ctx, *args, spec=spec)`` behind the placement check, for the
  one config ``choose(ctx, spec, platform)`` picks (``jt_dist._autotune``)."""
  @functools.wraps(rule)
  def lowering(ctx, *args, spec, **kwargs):
    _placement.check_lowering(ctx, spec)
    facts = _compat.lowering_axis_facts(ctx)
    if facts.kind == "spmd" and facts.manual_axes != frozenset(
        facts.mesh.axis_names):
      return _manual_over_rest(ctx, args, spec, facts)
    lowered = rule(ctx, *args, spec=choose(ctx, spec, platform), **kwargs)
    _cache.count("lowerings")  # Once per call lowered, never per run.
    return lowered

  return lowering
