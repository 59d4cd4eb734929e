"""What a sharded call whose specs do not fit says, with a fix that runs:
``out_specs`` only where each input's shard maps onto the output's."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import jax
from jax.sharding import PartitionSpec as P

from jt_dist._sharding import specs as _specs


class Operand(NamedTuple):
  """An array argument of the call, as messages describe it."""

  where: str  # e.g. "args[0]"
  shape: tuple
  spec: P


class Outputs(NamedTuple):
  """What the varying check needs to know of the outputs, one entry each."""

  names: tuple[str, ...]  # Pytree paths, e.g. "out_shape[1]".
  shapes: tuple[tuple, ...]  # Global shapes.
  specs: tuple[P, ...]
  given: bool  # Whether the user passed out_specs.
  out_tree: Any
  reduced: tuple[tuple[str, tuple[str, ...]] | None, ...]  # out_reduce.


def output_names(out_tree) -> tuple[str, ...]:
  """Each output's pytree path within ``out_shape``, in flattened order."""
  skeleton = jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))
  paths = jax.tree_util.tree_flatten_with_path(skeleton)[0]
  return tuple("out_shape" + jax.tree_util.keystr(p) for p, _ in paths)


def spec_text(spec: P) -> str:
  """A spec as the user writes it: P('x', None)."""
  return "P(" + ", ".join(repr(e) for e in spec) + ")"


def unsplit_inputs(names, shapes, specs, tuples: bool, k: int, out_shape,
                   spec, out_tree, alone, mesh) -> str:
  """An output split over axes ``alone`` that no inferred input spec
  names: ``names``, ``shapes``, ``specs`` are the array leaves'."""
  inferred = ", ".join(f"{n} {spec_text(_specs.trimmed(s))}"
                       for n, s in zip(names, specs))
  local = _specs.local_shape(out_shape, spec, mesh)
  suggestion = "pass in_specs (one PartitionSpec per array argument)"
  if not tuples:
    entries = [spec_text(spec if tuple(s) == tuple(out_shape) else P())
               for s in shapes]
    comma = "," if len(entries) == 1 else ""
    suggestion = f"pass in_specs=({', '.join(entries)}{comma})"
  return (
      f"sharded_triton_call: out_specs split output {k}"
      f" ({output_names(out_tree)[k]}, global shape {tuple(out_shape)}) over"
      f" mesh axes {alone} (its entry is {spec_text(spec)}), but no array"
      " argument is split over them: in_specs were left out, so each"
      " argument's spec comes from its sharding on mesh"
      f" {dict(mesh.shape)}: {inferred} (an array with no sharding there,"
      " such as a NumPy array or an array on one device, is replicated). The"
      f" shards along {alone} would get the same inputs and each write its"
      f" output into a shard of shape {local}, which a kernel sized by its"
      " inputs overruns. To split the inputs as the output is split,"
      f" {suggestion}; if every shard is meant to compute the same slice,"
      " give the replicated in_specs explicitly.")


def varying(k: int, axes: list, missing: list, outputs: Outputs,
            operands: Sequence[Operand], mesh) -> str:
  """Output ``k`` varies over mesh ``axes``; its spec lacks ``missing``."""
  name, shape, spec = outputs.names[k], outputs.shapes[k], outputs.specs[k]
  sources = [o for o in operands if set(_specs.spec_axes(o.spec)) & set(axes)]
  why = (", since inputs are split over them ("
         + ", ".join(f"{o.where} with spec {spec_text(o.spec)}"
                     for o in sources) + ")" if sources else "")
  how = (f"its out_specs entry is {spec_text(spec)}" if outputs.given else
         "out_specs was left out, so it is P() (replicated)")
  head = (
      f"sharded_triton_call: output {k} ({name}, global shape {shape}) varies"
      f" over mesh axes {axes} of mesh {dict(mesh.shape)}{why}, but {how},"
      f" which does not name {missing}.")
  needed = _needed_spec(shape, axes, operands, mesh)
  if needed is not None and not _fits(needed, shape, sources, axes):
    return f"{head} {_split_alike(shape, needed, sources, operands)}"
  slice_fix = (
      f"name mesh axes {axes} in its out_specs entry, on the dimensions"
      " of the output they split" if needed is None
      else f"pass {_suggest_specs(outputs, k, needed)}")
  return (f"{head} If each shard computes its own slice of the output,"
          f" {slice_fix}. {_reduce_fix(outputs, k, missing)}")


def _fits(spec: P, shape: tuple, sources: Sequence[Operand],
          axes: list) -> bool:
  """Whether each input's dimensions split over ``axes`` meet an output
  dimension of the same size split over the same of them."""
  def split(entry):
    return tuple(a for a in _specs.entry_axes(entry) if a in axes)

  out = [split(e) for e in spec] + [()] * (len(shape) - len(spec))
  for o in sources:
    for d, entry in enumerate(o.spec):
      if split(entry) and not any(size == o.shape[d] and e == split(entry)
                                  for size, e in zip(shape, out)):
        return False
  return True


def _split_alike(shape, needed: P, sources, operands) -> str:
  """The advice for inputs split differently over one output dimension."""
  given = ", ".join(f"{o.where} {spec_text(o.spec)}" for o in sources)
  text = (f"The inputs are split differently ({given}), so each shard"
          " would pair parts of them that do not match, and neither"
          " out_specs nor out_reduce can make that right. Split them alike")
  if any(tuple(o.shape) != tuple(shape) for o in operands):
    return f"{text} (in_specs), then name the axes they split in out_specs."
  specs = ", ".join([spec_text(needed)] * len(operands))
  return (f"{text}: pass in_specs=({specs}{',' * (len(operands) == 1)}) and"
          f" out_specs={spec_text(needed)}.")


def _reduce_fix(outputs: Outputs, k: int, missing: list) -> str:
  """The sentence suggesting ``out_reduce`` for output ``k``."""
  op, axes = outputs.reduced[k] or ("sum", ())
  axes = (*axes, *missing)
  pair = (op, axes[0] if len(axes) == 1 else axes)
  if len(outputs.names) == 1:
    fix = f"pass out_reduce={pair!r}"
  else:
    fix = (f"give {outputs.names[k]} the pair {pair!r} in out_reduce (a"
           " pytree matching out_shape, None for outputs not reduced)")
  if outputs.reduced[k]:
    return (f"If each shard's result is partial over {missing} too, reduce"
            f" over them as well: {fix}.")
  return (f"If each shard computes a partial result (a sum, maximum or"
          f" minimum over its part of the inputs), {fix} (or 'max' / 'min').")


def _needed_spec(shape: tuple, axes: list, operands: Sequence[Operand],
                 mesh) -> P | None:
  """A spec naming ``axes`` on the output's dimensions, or None: an
  operand's of the same shape and axes, else each axis on the one output
  dimension whose size matches one it splits in an operand."""
  for o in operands:
    if tuple(o.shape) == tuple(shape) and (
        set(_specs.spec_axes(o.spec)) == set(axes)):
      return o.spec
  entries: list[list] = [[] for _ in shape]
  for axis in axes:
    sizes = {o.shape[d] for o in operands for d, entry in enumerate(o.spec)
             if axis in _specs.entry_axes(entry)}
    dims = [d for d, size in enumerate(shape) if size in sizes]
    if len(dims) != 1:
      return None
    entries[dims[0]].append(axis)
  if any(shape[d] % math.prod(mesh.shape[a] for a in e)
         for d, e in enumerate(entries)):
    return None
  return _specs.spec_of(entries)


class _Shown(str):
  """A text whose repr is itself, to show a pytree of specs."""

  __repr__ = str.__str__


def _suggest_specs(outputs: Outputs, k: int, spec: P) -> str:
  """``out_specs=...`` with ``spec`` for output ``k``, the others unchanged."""
  if len(outputs.names) == 1:
    return f"out_specs={spec_text(spec)}"
  leaves = [_Shown(spec_text(spec if j == k else s))
            for j, s in enumerate(outputs.specs)]
  return f"out_specs={jax.tree_util.tree_unflatten(outputs.out_tree, leaves)!r}"
