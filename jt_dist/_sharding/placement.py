"""The device-validation layer: where a call's inputs live.

A kernel sees raw pointers into one device's memory, so a call is checked
eagerly (its arrays on one device), at trace time (none sharded over an
explicit axis outside a ``shard_map`` manual over it) and at lowering (XLA
would gather the inputs and run the whole kernel on each device): every
platform's lowering rule runs behind ``checked``.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, Sequence

import jax
from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._backend import cache as _cache
from jt_dist._core import primitive as _primitive
from jt_dist._sharding import specs as _specs

_FIX_SHARDED = (
    " To run the kernel once per shard, declare how it splits with"
    " triton_call(..., sharding_rule=jt_dist.ShardingRule('i k, k j -> i j',"
    " reductions={'k': 'sum'})) (on a mesh with explicit axes), call"
    " jt_dist.sharded_triton_call(..., in_specs=..., out_specs=...) or wrap"
    " the call in jax.shard_map; to run it on one device, move the inputs"
    " there first with jax.device_put(x, device).")


def _describe_array(where: str, x: Any) -> str:
  dtype = getattr(x.dtype, "name", x.dtype)
  return f"{where} (shape {tuple(x.shape)}, dtype {dtype})"


def _device_list(devices) -> str:
  if not devices:
    return ""
  ordered = sorted(devices, key=lambda d: d.id)
  shown = ", ".join(str(d) for d in ordered[:4])
  more = f", ... ({len(ordered)} in all)" if len(ordered) > 4 else ""
  return f" [{shown}{more}]"


def _resolve_device(device: Any):
  """``device=`` as one of this process's devices (an index counts
  ``jax.local_devices()``), or None."""
  if device is None:
    return None
  local = jax.local_devices()
  if isinstance(device, jax.Device):
    if device.process_index != jax.process_index():
      raise _errors.DevicePlacementError(
          f"triton_call: device={device} belongs to process"
          f" {device.process_index}{_errors.process_note()}; a process can"
          " only launch kernels on the devices it addresses"
          f"{_device_list(local)}. Pass one of jax.local_devices() or its"
          " index, or run the call over every process's devices with"
          " jt_dist.sharded_triton_call.")
    try:
      addressable = device in jax.local_devices(backend=device.platform)
    except RuntimeError:  # A platform this process has no backend for.
      addressable = False
    if not addressable:
      raise _errors.DevicePlacementError(
          f"triton_call: device={device!r} (platform {device.platform}) is"
          " not one of the devices this process launches on"
          f"{_device_list(local)}; a kernel can only run on a device"
          " jax.local_devices() lists. Pass one of those, or its index.")
    return device
  if isinstance(device, numbers.Integral) and not isinstance(device, bool):
    device = int(device)
    if 0 <= device < len(local):
      return local[device]
    hint, every = "", jax.devices()
    if jax.process_count() > 1 and 0 <= device < len(every):
      hint = (f" jax.devices()[{device}] is {every[device]} of process"
              f" {every[device].process_index}: device= counts this"
              " process's devices (jax.local_devices()), and another"
              " process's device cannot run this call.")
    raise _errors.DevicePlacementError(
        f"triton_call: device={device} is not a local device index"
        f"{_errors.process_note()}; this process addresses {len(local)}"
        f" {local[0].platform} devices, indices 0 to {len(local) - 1}"
        f"{_device_list(local)}.{hint}")
  raise TypeError(
      f"triton_call: device={device!r} of type {type(device).__name__} must"
      " be a device index (int) or a jax.Device.")


def check_concrete(args: Sequence[Any], kernel_name: str, device: Any = None):
  """Checks where concrete arrays live; returns ``device``, else the
  committed arrays' device, else None."""
  wanted = _resolve_device(device)
  found = None  # (position, array, device) of the first committed array.
  for i, x in enumerate(args):
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
      continue
    device_set = x.sharding.device_set
    if len(device_set) > 1:
      raise _errors.DevicePlacementError(
          f"triton_call: {_describe_array(f'args[{i}]', x)} of kernel"
          f" {kernel_name!r}{_errors.process_note()} spans"
          f" {len(device_set)} devices"
          f"{_device_list(device_set)} with sharding {x.sharding}; a Triton"
          f" kernel reads one device's memory.{_FIX_SHARDED}")
    if not getattr(x, "committed", True):
      continue
    (dev,) = device_set
    if wanted is not None and dev != wanted:
      raise _errors.DevicePlacementError(
          f"triton_call: {_describe_array(f'args[{i}]', x)} of kernel"
          f" {kernel_name!r}{_errors.process_note()} is on {dev}, but"
          f" device={device!r} asks for"
          f" {wanted}. Move it with jax.device_put(x, {wanted}), or drop"
          " device= to run where the inputs are.")
    if found is None:
      found = (i, x, dev)
    elif dev != found[2]:
      j, y, other = found
      raise _errors.DevicePlacementError(
          f"triton_call: the array arguments of kernel {kernel_name!r}"
          f"{_errors.process_note()} sit on different devices:"
          f" {_describe_array(f'args[{j}]', y)} is on {other} and"
          f" {_describe_array(f'args[{i}]', x)} is on {dev}."
          f" Move them to one device with jax.device_put(x, {other}) before"
          " the call, or shard them over a mesh and call"
          " jt_dist.sharded_triton_call.")
  return wanted or (found and found[2])


def check_traced(args: Sequence[Any], kernel_name: str) -> None:
  """Refuses a traced array sharded over an axis not manual here: the
  kernel would see it all-gathered, or a shard it does not know is one."""
  for i, x in enumerate(args):
    mesh = _specs.mesh_of(x) if isinstance(x, jax.core.Tracer) else None
    if mesh is None:
      continue
    manual = _specs.manual_axes(mesh)
    sharding = _specs.sharding_of(x)
    if axes := frozenset(_specs.spec_axes(sharding.spec)) - manual:
      sizes = ", ".join(f"{a}={mesh.shape[a]}" for a in sorted(axes))
      where = ("inside a shard_map manual over only"
               f" {sorted(manual)}" if manual else "outside shard_map")
      raise _errors.DevicePlacementError(
          f"triton_call: {_describe_array(f'args[{i}]', x)} of kernel"
          f" {kernel_name!r} is sharded over mesh axes {sorted(axes)}"
          f" ({sizes}; its spec is {sharding.spec}) {where}, so XLA would"
          f" have to gather it for the kernel.{_FIX_SHARDED}")


def _check_lowering(facts, spec) -> None:
  """Lowering-time check that XLA will not partition the kernel call."""
  name = spec.info.name
  arrays = [op.name for op in spec.operands if op.kind == "array"]
  over_devices = facts.kind == "sharding" and facts.num_devices > 1
  split = ({a: n for a, n in facts.auto_axis_sizes.items() if n > 1}
           if facts.kind == "spmd" else {})
  if spec.sharding_rule is not None and (over_devices or split):
    axes = (f"{facts.num_devices} devices{_device_list(facts.devices)}"
            if over_devices else "automatic mesh axes " + ", ".join(
                f"{a}={n}" for a, n in sorted(facts.auto_axis_sizes.items())))
    raise _errors.AutoAxesError(
        f"triton_call: kernel {name!r} with {spec.sharding_rule!r}"
        f" is lowered under jax.jit for {axes}, but its operands' types named"
        " no mesh when it was traced (the shardings were given only to"
        " jax.jit), so it could not be split per shard. Use a mesh with"
        " explicit axes, jax.make_mesh(shape, names,"
        " axis_types=(jax.sharding.AxisType.Explicit,) * len(names)), and"
        " jax.device_put the inputs onto it; or, on GPUs, trace under"
        " jax.set_mesh(mesh) so that XLA partitions the call over automatic"
        " axes (on the CPU, automatic axes are refused: the kernel is a host"
        " callback, and one inside custom_partitioning crashes the process);"
        " or call jt_dist.sharded_triton_call(..., mesh=mesh,"
        " sharding_rule=rule).")
  if over_devices:
    raise _errors.DevicePlacementError(
        f"triton_call: kernel {name!r} is lowered under jax.jit for"
        f" {facts.num_devices} devices{_device_list(facts.devices)} without"
        f" a shard_map around it. Its inputs ({', '.join(arrays)}) are laid"
        " out over several devices, and XLA cannot partition a Triton"
        " kernel: it would all-gather them and run the whole kernel on every"
        f" device.{_FIX_SHARDED}")
  if split:
    sizes = ", ".join(f"{a}={n}" for a, n in sorted(split.items()))
    raise _errors.DevicePlacementError(
        f"triton_call: kernel {name!r} runs inside a shard_map that is"
        f" manual over {sorted(facts.manual_axes)} only; mesh axes"
        f" {sorted(split)} ({sizes}) stay automatic, so XLA could still"
        " split each shard over them and would all-gather it for the"
        " kernel. Make the shard_map manual over every mesh axis of size"
        " > 1 (leave out axis_names=, or list those axes in it).")


def unify_varying_axes(arrays: Sequence[Any]) -> list[Any]:
  """Makes every traced input vary over the union of the inputs' manual
  axes (free at run time), as the outputs do, so ``check_vma`` passes."""
  varying = [_compat.varying_axes(jax.typeof(x)) for x in arrays]
  union = frozenset().union(*varying)
  return [jax.lax.pcast(x, tuple(sorted(union - axes)), to="varying")
          if union - axes else x for x, axes in zip(arrays, varying)]


def _manual_over_rest(ctx, args, spec, facts):
  """Lowers the call in a shard_map manual over the remaining axes, over
  which the operands are replicated: one launch per device, where XLA could
  partition a call it cannot see into (and CPU host callbacks need it)."""
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
    facts = _compat.lowering_axis_facts(ctx)
    _check_lowering(facts, spec)
    if facts.kind == "spmd" and facts.manual_axes != frozenset(
        facts.mesh.axis_names):
      return _manual_over_rest(ctx, args, spec, facts)
    lowered = rule(ctx, *args, spec=choose(ctx, spec, platform), **kwargs)
    _cache.count("lowerings")  # Once per call lowered, never per run.
    return lowered

  return lowering
