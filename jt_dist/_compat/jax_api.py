"""JAX facts that lowerings, a primitive's rules and calls at run time need,
across JAX releases."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
# Private; read per eager call by at_top_level, so imported once here.
from jax._src import core as _jax_core  # pylint: disable=g-bad-import-order


def output_avals(in_avals, out_shapes):
  """Abstract values of a kernel call's outputs: an input aval ``update``d,
  since inside ``shard_map`` they carry the mesh and varying axes, recorded
  differently per JAX release."""
  template = next((a for a in in_avals if not getattr(getattr(
      getattr(a, "sharding", None), "mesh", None), "empty", True)), None)
  if template is None:
    return [jax.core.ShapedArray(shape, dtype) for shape, dtype in out_shapes]
  sharding = jax.sharding.NamedSharding(template.sharding.mesh,
                                        jax.sharding.PartitionSpec())
  return [template.update(shape=shape, dtype=dtype, weak_type=False,
                          sharding=sharding) for shape, dtype in out_shapes]


class AxisFacts(NamedTuple):
  """The devices a call is lowered for; ``kind``: "sharding" (jit), "spmd"
  (shard_map), "replica" (pmap) or "none"."""

  kind: str
  num_devices: int
  devices: tuple
  manual_axes: frozenset
  auto_axis_sizes: dict
  mesh: Any = None


def lowering_axis_facts(ctx) -> AxisFacts:
  """The lowering context's axis context, read by attributes only."""
  # Its classes are private to JAX and were renamed between releases.
  axis_ctx = ctx.module_context.axis_context
  if hasattr(axis_ctx, "manual_axes") and hasattr(axis_ctx, "mesh"):
    mesh = axis_ctx.mesh
    manual = frozenset(axis_ctx.manual_axes)
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
    auto = {name: size for name, size in mesh.shape.items()
            if name not in manual and is_auto_axis(types.get(name))}
    return AxisFacts("spmd", mesh.size, mesh_devices(mesh), manual, auto,
                     mesh)
  if hasattr(axis_ctx, "num_devices"):
    devices = tuple(getattr(axis_ctx, "device_assignment", None) or ())
    return AxisFacts("sharding", axis_ctx.num_devices, devices, frozenset(), {})
  if hasattr(axis_ctx, "axis_env"):
    return AxisFacts("replica", 1, (), frozenset(), {})
  return AxisFacts("none", 1, (), frozenset(), {})


def lowering_for_export(ctx) -> bool:
  """Whether the lowering is ``jax.export``'s, whose module is serialised."""
  return bool(ctx.module_context.lowering_parameters.for_export)


def mesh_devices(mesh: Any) -> tuple:
  """A mesh's devices, flattened; () for None, an empty or abstract mesh."""
  try:
    devices = mesh.devices
  except (AttributeError, ValueError):  # AbstractMesh raises ValueError.
    return ()
  return tuple(devices.flat) if getattr(devices, "size", 0) else ()


def mesh_platform(mesh: Any) -> str | None:
  """The platform of a mesh's (or an AbstractMesh's) devices, or None."""
  if devices := mesh_devices(mesh):
    return devices[0].platform
  return getattr(getattr(mesh, "abstract_device", None), "platform", None)


def is_auto_axis(axis_type) -> bool:
  """Whether a mesh axis type is ``AxisType.Auto`` (XLA chooses layouts)."""
  # Meshes made before axis types existed behave as Auto.
  return axis_type is None or getattr(axis_type, "name", "") == "Auto"


def mark_requires_devices(primitive) -> None:
  """Asks JAX to name the devices in ``primitive``'s lowering context (a
  private registry, no public one: jax 0.10.2 and 0.12)."""
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  dispatch.prim_requires_devices_during_lowering.add(primitive)


def varying_axes(aval) -> frozenset:
  """The manual mesh axes a value varies over inside ``shard_map``
  (``aval.mat.varying``: private, jax 0.10.2 and 0.12; a Ref has none)."""
  return frozenset(getattr(getattr(aval, "mat", None), "varying", None) or ())


def register_dce_rule(primitive, keep: Callable[[Any], bool]) -> None:
  """Drops an equation with no used output unless ``keep(eqn)``. ``dce_rules``
  take ``(used_outputs, eqn)`` on jax 0.10, and ``(used_outputs,
  live_inputs, eqn)`` on 0.12."""
  from jax.interpreters import partial_eval  # pylint: disable=g-import-not-at-top

  def rule(used_outputs, *rest):
    eqn = rest[-1]
    if not any(used_outputs) and not keep(eqn):
      return [False] * len(eqn.invars), None
    return [True] * len(eqn.invars), eqn

  partial_eval.dce_rules[primitive] = rule


@functools.cache
def kernel_side_effect() -> Any:
  """The (unordered) effect of a ``has_side_effect=True`` call, which keeps
  it in every enclosing jaxpr. ``jax._src.effects``: private (0.10.2, 0.12)."""
  from jax._src import effects  # pylint: disable=g-import-not-at-top
  from jax.extend import core as jex_core  # pylint: disable=g-import-not-at-top

  class KernelSideEffect(jex_core.Effect):
    """A Triton kernel call that does more than write its outputs."""

    def __repr__(self) -> str:
      return "TritonKernelSideEffect"

  for registry in (effects.lowerable_effects,
                   effects.control_flow_allowed_effects,
                   effects.custom_derivatives_allowed_effects,
                   effects.remat_allowed_effects):
    registry.add_type(KernelSideEffect)
  return KernelSideEffect()


def jit_cache_context(default: Any = None) -> Any:
  """A context in JAX's tracing and lowering cache keys (jax 0.6+)."""
  return jax.make_user_context(default_value=default)


def platform_version(device: Any) -> str:
  """The runtime a device's backend reports (e.g. its CUDA version)."""
  return str(getattr(getattr(device, "client", None), "platform_version",
                     "unknown"))


def primitive_impl(primitive) -> Callable[..., Any]:
  """jax's eager implementation of primitives (private in every release)."""
  from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  return functools.partial(dispatch.apply_primitive, primitive)


def at_top_level() -> bool:
  """Whether no trace is under way (private in every release)."""
  return _jax_core.trace_state_clean()


def is_ref_view(x: Any) -> bool:
  """Whether ``x`` is a view of a Ref (``ref.at[...]``), known by its
  private class's name and ``ref`` (jax 0.10.2 and 0.12)."""
  return (type(x).__name__ == "TransformedRef"
          and isinstance(getattr(x, "ref", None), jax.Ref))


def distributed_client():
  """jax.distributed's coordination client (a private module), or None:
  its key-value store passes values between processes without collectives."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def host_buffer_callback():
  """``jax.experimental.buffer_callback.buffer_callback`` (in every jax): it
  passes the host buffers as they are; ``jax.pure_callback`` copies big ones
  (102,400+ bytes, jaxlib 0.10) on the devices' thread pool, which a
  collective after the callback can deadlock (XLA then aborts)."""
  from jax.experimental import buffer_callback  # pylint: disable=g-import-not-at-top
  return buffer_callback.buffer_callback
