"""Partition specs: inference, and checks run at the caller's line."""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jt_dist import _errors
from jt_dist._core import arguments as _arguments
from jt_dist._core import types as _types


COLLECTIVES = {"sum": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def is_array(x: Any) -> bool:
  return not _types.is_scalar(x) and hasattr(x, "shape") and hasattr(x, "dtype")


def arrays_of(args: Sequence[Any]):
  """``arguments.flatten(args)`` and the positions of its array leaves
  (what in_specs and a rule's operands count)."""
  flat = _arguments.flatten(args)
  return flat, [k for k, a in enumerate(flat.leaves) if is_array(a)]


def sharding_of(x: Any):
  """``x``'s sharding: its type's for a tracer, its own otherwise."""
  owner = jax.typeof(x) if isinstance(x, jax.core.Tracer) else x
  return getattr(owner, "sharding", None)


def mesh_of(x: Any):
  """The mesh ``x`` is laid out on by a ``NamedSharding``, or None."""
  sharding = sharding_of(x)
  if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
    return sharding.mesh
  return None


def manual_axes(mesh) -> frozenset:
  """The mesh axes already manual (inside a caller's ``shard_map``)."""
  return frozenset(getattr(mesh, "manual_axes", ()) or ())


def resolve_mesh(mesh: Any, args: Sequence[Any]):
  """The mesh to run on: given, else the arguments', else the ambient one."""
  if mesh is not None:
    if not isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: mesh={mesh!r} of type"
          f" {type(mesh).__name__} is not a jax.sharding.Mesh. Make one with"
          " jax.make_mesh((n,), ('x',)), or leave mesh out to use the"
          " arguments' or the ambient mesh.")
    return mesh
  for x in args:
    if is_array(x) and mesh_of(x) is not None:
      return mesh_of(x)
  if not any(isinstance(x, jax.core.Tracer) for x in args):
    # Eagerly, jax.set_mesh's concrete mesh places the arguments (the
    # abstract one places nothing); get_mesh raises under jax.jit.
    try:
      concrete = jax.sharding.get_mesh()
    except (RuntimeError, ValueError):
      concrete = None
    if isinstance(concrete, jax.sharding.Mesh) and not concrete.empty:
      return concrete
  ambient = jax.sharding.get_abstract_mesh()
  if not ambient.empty:
    return ambient
  raise _errors.ShardingSpecError(
      "sharded_triton_call: no mesh to run on. Pass mesh=jax.make_mesh(...),"
      " put the inputs on a mesh with jax.device_put(x, NamedSharding(mesh,"
      " spec)), or set an ambient mesh with jax.set_mesh(mesh).")


def entry_axes(entry) -> tuple:
  """The mesh axes one spec entry splits its dimension over."""
  if entry is None or entry is P.UNCONSTRAINED:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


def spec_axes(spec: P) -> list:
  """Mesh axis names a spec uses, in order, with repeats."""
  return [a for entry in spec for a in entry_axes(entry)]


def trimmed(spec) -> P:
  """``spec`` without trailing Nones: P(None) reads as P()."""
  entries = list(spec or ())
  while entries and entries[-1] is None:
    entries.pop()
  return P(*entries)


def spec_of(groups: Sequence[Sequence[str]]) -> P:
  """The spec splitting each dimension over its group of mesh axes."""
  return trimmed([None if not g else g[0] if len(g) == 1 else tuple(g)
                  for g in groups])


def check_spec(where: str, shape: tuple, spec: Any, mesh) -> P:
  """One array's spec (None for P()), checked against its shape and mesh."""
  spec = P() if spec is None else spec
  if not isinstance(spec, P):
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: the spec of {where} is {spec!r} of type"
        f" {type(spec).__name__}; pass a jax.sharding.PartitionSpec.")
  sizes = dict(mesh.shape)
  axes = spec_axes(spec)
  if unknown := [a for a in axes if a not in sizes]:
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: the spec {spec} of {where} names mesh axes"
        f" {unknown}, but the mesh has axes {_sizes(sizes)}. Use the mesh's"
        " axis names.")
  if twice := sorted({a for a in axes if axes.count(a) > 1}):
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: the spec {spec} of {where} uses mesh axes"
        f" {twice} more than once; an axis can split at most one dimension.")
  if len(spec) > len(shape):
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: the spec {spec} of {where} has {len(spec)}"
        f" entries, but the array has shape {shape} (rank {len(shape)}). Give"
        " at most one entry per dimension.")
  for dim, entry in enumerate(spec):
    names = entry_axes(entry)
    total = math.prod(sizes[a] for a in names)
    if names and shape[dim] % total:
      named = _sizes({a: sizes[a] for a in names})
      raise _errors.ShardingSpecError(
          f"sharded_triton_call: {where} of shape {shape} has spec {spec},"
          f" which splits dimension {dim} (size {shape[dim]}) over mesh axes"
          f" {names} of total size {total} ({named}),"
          f" but {shape[dim]} is not divisible by {total}. Pad dimension"
          f" {dim} to a multiple of {total}, or split it over fewer axes.")
  return spec


def local_shape(shape: tuple, spec: P, mesh) -> tuple:
  """The shard-local shape of a global ``shape`` split by ``spec`` (``mesh``
  may be None when ``spec`` splits nothing)."""
  local = list(shape)
  for dim, entry in enumerate(spec):
    local[dim] //= math.prod(mesh.shape[a] for a in entry_axes(entry))
  return tuple(local)


def _sizes(sizes: dict) -> str:
  return ", ".join(f"{name}={size}" for name, size in sizes.items())


def infer_spec(x: Any, mesh) -> P:
  """The spec of ``x``'s sharding on ``mesh``; replicated when it has none."""
  own = mesh_of(x)
  if own is None or tuple(own.axis_names) != tuple(mesh.axis_names):
    return P()
  return sharding_of(x).spec


def in_specs_for(in_specs: Any, args: Sequence[Any], mesh) -> list[P]:
  """One checked spec per array leaf, given (a prefix of ``args``, as
  ``jax.shard_map``'s are) or inferred."""
  flat, arrays = arrays_of(args)
  specs = ([infer_spec(flat.leaves[k], mesh) for k in arrays]
           if in_specs is None else _given_specs(in_specs, args))
  return [check_spec(flat.names[k], tuple(flat.leaves[k].shape), spec, mesh)
          for k, spec in zip(arrays, specs)]


def _given_specs(in_specs: Any, args: Sequence[Any]) -> list:
  """The given in_specs spread over the array leaves, in order."""
  if not isinstance(in_specs, (P, list, tuple)):
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: in_specs={in_specs!r} of type"
        f" {type(in_specs).__name__} must be a PartitionSpec, or a tuple"
        " of them with one per array argument.")
  entries = [in_specs] if isinstance(in_specs, P) else list(in_specs)
  takers = [i for i, a in enumerate(args) if any(
      is_array(leaf) for _, leaf in _arguments.leaves_with_paths(a))]
  if len(entries) != len(takers):
    tuples = [i for i in takers if _arguments.is_tuple(args[i])]
    note = (f"; tuple operands args{tuples} take one entry each, a"
            " PartitionSpec for all their arrays or a tuple with one entry"
            " per element" if tuples else "")
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: got {len(entries)} in_specs, but the call has"
        f" {len(takers)} array arguments (args{takers}); scalars take"
        f" no spec{note}. Pass one PartitionSpec per array argument, in"
        " order, or leave in_specs out to take them from the arguments'"
        " shardings.")
  return [spec for i, entry in zip(takers, entries)
          for spec in _leaf_specs(args[i], entry, f"args[{i}]")]


def _leaf_specs(arg: Any, entry: Any, where: str) -> list:
  """The specs of ``arg``'s array leaves from its in_specs entry."""
  if not _arguments.is_tuple(arg):
    if is_array(arg):
      return [entry]
    if entry is None or (isinstance(entry, P) and not spec_axes(entry)):
      return []
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: in_specs gives {where} = {arg!r}, a scalar,"
        f" the spec {entry!r}; a scalar is passed whole to every shard."
        " Put None in its place.")
  if entry is None or isinstance(entry, P):
    return [entry for _, leaf in _arguments.leaves_with_paths(arg)
            if is_array(leaf)]
  if not isinstance(entry, (tuple, list)) or len(entry) != len(arg):
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: the in_specs entry {entry!r} of {where}, a"
        f" tuple of {len(arg)} elements, must be one PartitionSpec for all"
        f" its arrays, or a tuple of {len(arg)} entries, one per element (a"
        " PartitionSpec, None for a scalar, or a tuple for a nested tuple).")
  return [spec for k, (item, sub) in enumerate(zip(arg, entry))
          for spec in _leaf_specs(item, sub, f"{where}[{k}]")]


def place(x: Any, spec: P, mesh):
  """Lays ``x`` out as ``NamedSharding(mesh, spec)``, as ``shard_map``
  wants, unless it is so already (or, on a one-device mesh, sits on that
  device). On another mesh object, even of the same layout, it is moved: a
  program has one mesh, and a move to an equivalent layout copies nothing."""
  current = sharding_of(x)
  if isinstance(x, jax.core.Tracer) or not isinstance(mesh, jax.sharding.Mesh):
    # In a trace (a constant too, on its abstract mesh): XLA adds the
    # collective; without explicit axes shard_map's in_specs lay it out.
    if mesh.explicit_axes and trimmed(
        getattr(current, "spec", None)) != trimmed(spec):
      return jax.sharding.reshard(x, NamedSharding(mesh, spec))
    return x
  target = NamedSharding(mesh, spec)
  if isinstance(current, NamedSharding):
    if current.mesh == mesh and trimmed(current.spec) == trimmed(spec):
      return x
  elif current is not None and current.is_equivalent_to(target, x.ndim):
    return x
  if (isinstance(x, jax.Array) and getattr(x, "committed", False)
      and not target.is_fully_addressable):
    # A committed array of one process cannot be spread over a global mesh.
    devices = sorted(x.sharding.device_set, key=lambda d: d.id)
    processes = sorted({d.process_index for d in mesh.devices.flat})
    raise _errors.ShardingSpecError(
        f"sharded_triton_call: an array argument of shape {tuple(x.shape)}"
        f" and dtype {x.dtype}{_errors.process_note()} is committed to"
        f" {', '.join(str(d) for d in devices[:4])}, devices of this process,"
        f" but spec {spec} lays it over a mesh of {mesh.size} devices in"
        f" processes {processes}; JAX cannot move one process's array onto"
        " devices other processes own. Pass the same NumPy array in every"
        " process (or an uncommitted jnp array), or build the global array"
        " with jax.make_array_from_process_local_data(NamedSharding(mesh,"
        " spec), local_data).")
  return jax.device_put(x, target)
