"""Registers the primitive's lowering for each platform with JAX.

Every platform's rule first runs the device-validation layer's lowering-time
check, so no platform can silently let XLA replicate a kernel call.
"""

from __future__ import annotations

import functools

import jax
from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist._autotune import choose as _choose
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist._cpu import lowering as _interpret
from jt_dist._sharding import placement as _placement
from jt_dist._core import primitive as _primitive


def _manual_over_rest(ctx, args, spec, facts):
  """Lowers the call inside a shard_map manual over the remaining axes.

  Inside a partially manual shard_map, the remaining mesh axes have passed
  the placement check: every operand is replicated over them. Making them
  manual too pins one kernel launch per device on its own copy, instead of
  leaving XLA free to partition a call it cannot see into (and host
  callbacks, used on the CPU, need every axis manual).
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


def _checked(rule, platform: str):
  @functools.wraps(rule)
  def lowering(ctx, *args, spec, **kwargs):
    _placement.check_lowering(ctx, spec)
    facts = _compat.lowering_axis_facts(ctx)
    if facts.kind == "spmd" and facts.manual_axes != frozenset(
        facts.mesh.axis_names):
      return _manual_over_rest(ctx, args, spec, facts)
    # An autotuned call is lowered with one config, chosen once for every
    # shard and every process (or left to jaxlib on request).
    spec = _choose.for_lowering(ctx, spec, platform)
    return rule(ctx, *args, spec=spec, **kwargs)

  return lowering


mlir.register_lowering(
    _primitive.triton_call_p, _checked(_interpret.cpu_lowering, "cpu"),
    platform="cpu"
)


def _gpu_rule(platform: str):
  compiled = functools.partial(_gpu_lowering.gpu_lowering, platform=platform)

  def rule(ctx, *args, spec):
    # A kernel made under TRITON_INTERPRET=1 asks to be interpreted: honour
    # that on GPUs too (through a host callback) rather than compiling it.
    if isinstance(spec.info.fn, _compat.InterpretedFunction):
      return _interpret.cpu_lowering(ctx, *args, spec=spec)
    return compiled(ctx, *args, spec=spec)

  return rule


for _platform in ("cuda", "rocm"):
  mlir.register_lowering(
      _primitive.triton_call_p, _checked(_gpu_rule(_platform), _platform),
      platform=_platform,
  )
# The GPU target is read from the devices the call is lowered for, which
# JAX names in the lowering context only for primitives that ask for them.
_compat.mark_requires_devices(_primitive.triton_call_p)
