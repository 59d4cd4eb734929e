"""``jax.vmap`` of a ``triton_call``: one launch over a batched grid.

A Triton kernel does its own pointer arithmetic, so a batch cannot be handed
to it as a bigger array. Instead, the batch gets a grid axis of its own:
``_batch_kernel`` generates a wrapper kernel that offsets each batched
pointer by the batch index and calls the user's kernel inline. Batch
dimensions move to the front first; unbatched operands are shared (batch
stride 0); nested ``vmap``s fold into one flat batch index on the grid.

Where the grid cannot take the batch (the kernel reads every free axis, or
the batch exceeds the axis limits), the default method runs the batch one
element after another, as ``vmap_method="sequential"`` does, and says so on
the ``jt_dist`` logger at debug level; ``vmap_method="grid"`` raises instead.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import jax
from jax.interpreters import batching as _jax_batching

from jt_dist._vmap import grid_kernel as _batch_kernel
from jt_dist import _compat
from jt_dist._core import grid as _grid
from jt_dist._core import positional as _positional
from jt_dist._core import primitive as _primitive

logger = logging.getLogger("jt_dist")

@dataclasses.dataclass(frozen=True)
class Batched:
  """What makes a ``CallSpec`` the batched form of another."""

  base: Any  # The user's unbatched call, a _call_spec.CallSpec.
  layout: _batch_kernel.Layout  # Where the batch lives: memory and grid.


class _NoRoom(Exception):
  """The grid cannot take the batch; the message says why."""


def _batch(args, dims, *, spec):
  """The primitive's batching rule; every output is batched on axis 0.

  ``spec`` is already batched under nested vmaps.

  Raises:
    NotImplementedError: ``vmap_method="grid"`` and the grid cannot take
      the batch.
  """
  bind = _primitive.triton_call_p.bind
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  args = [a if d is None else jax.numpy.moveaxis(a, d, 0)
          for a, d in zip(args, dims)]
  batched = [d is not None for d in dims]
  # An empty batch launches nothing, whichever the method.
  if spec.vmap_method != "sequential" and size:
    try:
      outs = _on_grid(bind, args, batched, spec, size)
      return outs, [0] * len(outs)
    except _NoRoom as e:
      if spec.vmap_method == "grid":
        raise NotImplementedError(
            f"triton_call: vmap_method='grid' cannot batch kernel"
            f" {spec.info.name!r}: {e} Pass vmap_method=None to fall back to"
            " one launch per batch element when the grid has no room, or"
            " vmap_method='sequential'.") from None
      logger.debug("jt_dist: vmap of kernel %s runs one launch per batch"
                   " element: %s", spec.info.name, e)
  outs = _sequential(bind, args, batched, spec)
  return outs, [0] * len(outs)


def _sequential(bind, args, batched, spec):
  """One launch per batch element, through ``jax.lax.map``."""
  xs = tuple(a for a, m in zip(args, batched) if m)

  def one(slices):
    it = iter(slices)
    return bind(*[next(it) if m else a for a, m in zip(args, batched)],
                spec=spec)

  return jax.lax.map(one, xs)


def _on_grid(bind, args, batched, spec, size):
  """One launch of the wrapper kernel over the batched grid."""
  base = spec.batch.base if spec.batch else spec
  if _compat.is_gluon(base.info.fn):
    # The wrapper is a @triton.jit kernel, which cannot inline Gluon code.
    raise _NoRoom("it is a Gluon kernel, which the generated @triton.jit"
                  " wrapper that reads the batch index cannot call.")
  if any(map(_positional.is_descriptor, base.operands)):
    # The wrapper moves pointers by the batch index; a descriptor is not one.
    raise _NoRoom("it takes a TensorDescriptor, which the wrapper cannot"
                  " move to a batch element.")
  args, batched = list(args), list(batched)
  for i, _ in spec.input_output_aliases:
    # An aliased input becomes its output's buffer, which is batched.
    if not batched[i]:
      args[i] = jax.numpy.broadcast_to(args[i], (size, *args[i].shape))
      batched[i] = True
  sizes = (size, *(spec.batch.layout.sizes if spec.batch else ()))
  axes, counts = _placement(base, sizes)
  layout = _batch_kernel.Layout(
      sizes=sizes, strides=_strides(args, batched, spec, base),
      axes=axes, counts=counts, tuples=_tuple_leaves(base))
  params = _wrapper_params(base)
  wrapper = _batch_kernel.wrapper_kernel(base.info.fn, params, layout)
  new_spec = dataclasses.replace(
      base, kernel=wrapper, batch=Batched(base, layout),
      out_shapes=tuple(((size, *shape), dtype)
                       for shape, dtype in spec.out_shapes),
      launches=tuple(_batched_launch(base, launch, params, layout)
                     for launch in base.launches))
  return bind(*args, spec=new_spec)


def _strides(args, batched, spec, base):
  """Each pointer parameter's element stride per batch level."""
  old = dict(spec.batch.layout.strides) if spec.batch else {}
  depth = len(spec.batch.layout.sizes) if spec.batch else 0
  strides = []
  for op in base.operands:
    if op.kind == "array":
      new = math.prod(args[op.index].shape[1:]) if batched[op.index] else 0
    elif op.kind == "output":
      new = math.prod(spec.out_shapes[op.index][0])
    else:
      continue
    # A tuple's leaf is keyed by its label, e.g. yz[0].
    level_strides = (new, *old.get(op.label, (0,) * depth))
    if any(level_strides):
      strides.append((op.label, level_strides))
  return tuple(strides)


def _tuple_leaves(base):
  """``(parameter, every leaf's path)`` of each tuple parameter.

  The wrapper rebuilds a tuple whose pointers it moves, scalars included.
  """
  paths: dict[str, list] = {}
  for op in base.operands:
    if op.path:
      paths.setdefault(op.name, []).append(op.path)
  return tuple((name, tuple(p)) for name, p in paths.items())


def _placement(base, sizes):
  """The grid axes and counts holding a flat batch of ``prod(sizes)``."""
  total = math.prod(sizes)
  used = _read_axes(base)
  grids = sorted({launch.grid for launch in base.launches})
  free = [a for a in range(3)
          if a not in used and all(g[a] == 1 for g in grids)]
  if not free:
    raise _NoRoom(
        f"the kernel reads grid axes {sorted(used)} (through tl.program_id"
        f" or tl.num_programs) and its grid {grids[0]} leaves no other axis"
        " free for the batch.")
  first = free[0]
  if total <= _grid.MAX_GRID[first]:
    return (first,), (total,)
  if len(free) > 1:
    high = -(-total // _grid.MAX_GRID[first])
    if high <= _grid.MAX_GRID[free[1]]:
      return (first, free[1]), (-(-total // high), high)
  limits = " x ".join(str(_grid.MAX_GRID[a]) for a in free)
  names = "/".join("xyz"[a] for a in free)
  raise _NoRoom(
      f"the batch of {total} ({' x '.join(map(str, sizes))}) exceeds the"
      f" {limits} programs the free grid axes ({names}) can launch.")


def _read_axes(base):
  """The grid axes the kernel, or a kernel it is given as a constexpr, reads."""
  kernels = [base.info.fn]
  for launch in base.launches:
    kernels += [v for _, v in launch.config.kwargs
                if _compat.is_triton_function(v)]
  return frozenset().union(*map(_batch_kernel.used_grid_axes, kernels))


def _wrapper_params(base):
  """The wrapper's parameters: the user kernel's that the call binds."""
  bound = {op.name for op in base.operands}.union(
      *(dict(launch.config.kwargs) for launch in base.launches))
  return tuple((p.name, p.is_constexpr) for p in base.info.params
               if p.name in bound)


def _batched_launch(base, launch, params, layout):
  """``launch`` with the batch on its grid, binding every wrapper parameter."""
  grid = list(launch.grid)
  for axis, count in zip(layout.axes, layout.counts):
    grid[axis] = count
  kwargs = dict(launch.config.kwargs)
  operands = {op.name for op in base.operands}
  for name, _ in params:
    # A parameter some configs leave to its default gets it explicitly.
    if name not in operands and name not in kwargs:
      kwargs[name] = base.info.param_by_name[name].default
  config = dataclasses.replace(launch.config, kwargs=tuple(kwargs.items()))
  return dataclasses.replace(launch, config=config, grid=tuple(grid))


_jax_batching.primitive_batchers[_primitive.triton_call_p] = _batch
