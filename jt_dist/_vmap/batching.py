"""``jax.vmap`` of a ``triton_call``: one launch over a batched grid.

The batch gets a grid axis the user kernel never reads: a wrapper kernel
reads the batch index there, moves each batched pointer by it times its
batch stride (in 64-bit integers), and calls the user kernel inline.
Nested ``vmap``s fold into one flat batch index. Where the grid has no room,
the default method runs one launch per element (logged at debug level);
``vmap_method="grid"`` raises.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import math
from typing import Any, NamedTuple

import jax
from jax.interpreters import batching as _jax_batching

from jt_dist import _compat
from jt_dist._core import binding as _binding
from jt_dist._core import kernel as _kernel
from jt_dist._core import primitive as _primitive
from jt_dist._core import wrapper as _wrapper

logger = logging.getLogger("jt_dist")

# Functions whose axis argument names a grid axis.
_AXIS_READERS = ("program_id", "num_programs")
_ALL_AXES = frozenset((0, 1, 2))


class Layout(NamedTuple):
  """Where a batch lives in memory and on the grid."""

  sizes: tuple[int, ...]  # The batch sizes, outermost vmap first.
  # (label, element stride per level) of each pointer batched at some
  # level (a tuple's leaves as ``yz[0]``); 0 shares it at a level.
  strides: tuple[tuple[str, tuple[int, ...]], ...]
  # The grid axes holding the flat batch index, least significant first.
  axes: tuple[int, ...]
  counts: tuple[int, ...]
  # (parameter name, leaf paths) of each tuple parameter.
  tuples: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...] = ()


def _resolve(node: ast.expr, scope: dict[str, Any]) -> Any:
  """The object a name or dotted name refers to in ``scope``, or None."""
  if isinstance(node, ast.Name):
    return scope.get(node.id)
  if isinstance(node, ast.Attribute):
    owner = _resolve(node.value, scope)
    return None if owner is None else getattr(owner, node.attr, None)
  return None


def used_grid_axes(kernel_fn: Any) -> frozenset[int]:
  """The grid axes a kernel (or a ``@triton.jit`` callee it names) reads;
  a non-literal axis could be any. The caller scans constexpr kernels."""
  # Keyed by the Python function: hashing a JITFunction computes its
  # cache_key, which fails for kernels calling interpreted helpers.
  return _used_axes(kernel_fn.fn)


@functools.lru_cache(maxsize=512)
def _used_axes(python_fn) -> frozenset[int]:
  used: set[int] = set()
  pending, seen = [python_fn], set()
  while pending:
    fn = _compat.jit_function_for(pending.pop())
    if fn.fn in seen:
      continue
    seen.add(fn.fn)
    scope = dict(fn.get_capture_scope())
    with _compat.LANGUAGE_LOCK:  # As kernel_info: one parse at a time.
      tree = fn.parse()
    for node in ast.walk(tree):
      if not isinstance(node, ast.Call):
        continue
      name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
      if name in _AXIS_READERS:
        axis = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "axis"), None)
        if not (isinstance(axis, ast.Constant) and axis.value in _ALL_AXES):
          return _ALL_AXES
        used.add(axis.value)
      callee = _resolve(node.func, scope)
      # Under TRITON_INTERPRET=1 helpers are InterpretedFunctions.
      if _compat.is_triton_function(callee):
        pending.append(callee.fn)
  return frozenset(used)


def _batch_index_lines(layout: Layout, p: str) -> list[str]:
  """Source lines computing the per-level batch indices ``{p}i0``, ..."""
  lines = [f"{p}b = {p}tl.program_id({layout.axes[0]}).to({p}tl.int64)"]
  if len(layout.axes) == 2:
    lines.append(f"{p}b += {p}tl.program_id({layout.axes[1]}).to({p}tl.int64)"
                 f" * {layout.counts[0]}")
  rest = f"{p}b"
  for level in range(len(layout.sizes) - 1, 0, -1):
    lines.append(f"{p}i{level} = {rest} % {layout.sizes[level]}")
    lines.append(f"{p}r{level} = {rest} // {layout.sizes[level]}")
    rest = f"{p}r{level}"
  lines.append(f"{p}i0 = {rest}")
  return lines


def _offset_lines(layout: Layout, p: str) -> list[str]:
  # Each entry has a nonzero stride (see _strides).
  offsets = {name: " + ".join(f"{p}i{level} * {stride}"
                              for level, stride in enumerate(strides) if stride)
             for name, strides in layout.strides}
  lines = [f"{name} += {offset}" for name, offset in offsets.items()
           if "[" not in name]
  for name, paths in layout.tuples:
    if any(_kernel.label(name, path) in offsets for path in paths):
      # Tuples are immutable: the wrapper rebuilds one with moved leaves.
      lines.append(f"{name} = {_tuple_expr(name, (), paths, offsets)}")
  return lines


def _tuple_expr(name, prefix, paths, offsets) -> str:
  """The source of the tuple at ``prefix`` with its pointers moved."""
  label = _kernel.label(name, prefix)
  if prefix in paths:
    return f"({label} + {offsets[label]})" if label in offsets else label
  depth = len(prefix)
  children = sorted({path[depth] for path in paths
                     if len(path) > depth and path[:depth] == prefix})
  items = [_tuple_expr(name, prefix + (k,), paths, offsets)
           for k in children]
  return "(" + "".join(f"{item}, " for item in items) + ")"


def wrapper_source(name: str, params, layout: Layout) -> str:
  """The wrapper's source; ``params`` are its ``(name, is_constexpr)``."""
  p = _prefix(params)
  # Annotations are evaluated at definition, so a parameter named `tl`
  # cannot shadow it; Triton's interpreter knows `tl.constexpr` by name.
  signature = ", ".join(
      f"{n}: tl.constexpr" if constexpr else n for n, constexpr in params)
  body = _batch_index_lines(layout, p) + _offset_lines(layout, p)
  call = _wrapper.call_line(p, [n for n, _ in params])
  total = math.prod(layout.sizes)
  if math.prod(layout.counts) > total:
    # A batch split over two axes may overshoot: the spare programs idle.
    body += [f"if {p}b < {total}:", f"    {call}"]
  else:
    body.append(call)
  return f"def {name}({signature}):\n" + "".join(
      f"    {line}\n" for line in body)


def _prefix(params) -> str:
  # Internal names must not shadow (or be shadowed by) a parameter.
  return _wrapper.prefix([n for n, _ in params], "_jt_vmap_")


@functools.lru_cache(maxsize=256)
def wrapper_kernel(base_fn: Any, params: tuple[tuple[str, bool], ...],
                   layout: Layout) -> Any:
  """The kernel running ``base_fn`` (without its layers) over the batch."""
  python_fn = _compat.jit_function_of(base_fn).fn
  source = wrapper_source(python_fn.__name__, params, layout)
  return _wrapper.make_kernel(base_fn, source, _prefix(params), "vmap wrapper")


class Batched(NamedTuple):
  """What makes a ``CallSpec`` the batched form of another."""

  base: Any  # The user's unbatched call, a _kernel.CallSpec.
  layout: Layout  # Where the batch lives: memory and grid.


class _NoRoom(Exception):
  """The grid cannot take the batch; the message says why."""


def _batch(args, dims, *, spec):
  """The batching rule; ``spec`` is already batched under nested vmaps."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  args = [a if d is None else jax.numpy.moveaxis(a, d, 0)
          for a, d in zip(args, dims)]
  batched = [d is not None for d in dims]
  # An empty batch launches nothing, whichever the method.
  if spec.vmap_method != "sequential" and size:
    try:
      outs = _on_grid(args, batched, spec, size)
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

  def one(slices):  # One launch per batch element, through jax.lax.map.
    it = iter(slices)
    return _primitive.triton_call_p.bind(
        *[next(it) if m else a for a, m in zip(args, batched)], spec=spec)

  outs = jax.lax.map(one, tuple(a for a, m in zip(args, batched) if m))
  return outs, [0] * len(outs)


def _on_grid(args, batched, spec, size):
  """One launch of the wrapper kernel over the batched grid."""
  base = spec.batch.base if spec.batch else spec
  if _compat.is_gluon(base.info.fn):
    raise _NoRoom("it is a Gluon kernel, which the generated @triton.jit"
                  " wrapper that reads the batch index cannot call.")
  if any(op.type.startswith("tensordesc") for op in base.operands):
    raise _NoRoom("it takes a TensorDescriptor, which the wrapper cannot"
                  " move to a batch element.")
  args, batched = list(args), list(batched)
  for i, _ in spec.input_output_aliases:
    # An aliased input becomes its output's buffer, which is batched.
    if not batched[i]:
      args[i] = jax.numpy.broadcast_to(args[i], (size, *args[i].shape))
      batched[i] = True
  sizes = (size, *(spec.batch.layout.sizes if spec.batch else ()))
  paths: dict[str, list] = {}  # Every leaf's path, per tuple parameter.
  for op in base.operands:
    if op.path:
      paths.setdefault(op.name, []).append(op.path)
  layout = Layout(sizes, _strides(args, batched, spec, base),
                  *_placement(base, sizes),
                  tuple((name, tuple(p)) for name, p in paths.items()))
  params = _wrapper_params(base)
  wrapper = wrapper_kernel(base.info.fn, params, layout)
  new_spec = dataclasses.replace(
      base, kernel=wrapper, batch=Batched(base, layout),
      out_shapes=tuple(((size, *shape), dtype)
                       for shape, dtype in spec.out_shapes),
      launches=tuple(_batched_launch(base, launch, params, layout)
                     for launch in base.launches))
  return _primitive.triton_call_p.bind(*args, spec=new_spec)


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
    level_strides = (new, *old.get(op.label, (0,) * depth))
    if any(level_strides):
      strides.append((op.label, level_strides))
  return tuple(strides)


def _placement(base, sizes):
  """The grid axes and counts holding a flat batch of ``prod(sizes)``."""
  total = math.prod(sizes)
  # The axes the kernel, or a kernel it is given as a constexpr, reads.
  kernels = [base.info.fn] + [
      v for launch in base.launches for _, v in launch.config.kwargs
      if _compat.is_triton_function(v)]
  used = frozenset().union(*map(used_grid_axes, kernels))
  grids = sorted({launch.grid for launch in base.launches})
  free = [a for a in range(3)
          if a not in used and all(g[a] == 1 for g in grids)]
  if not free:
    raise _NoRoom(
        f"the kernel reads grid axes {sorted(used)} (through tl.program_id"
        f" or tl.num_programs) and its grid {grids[0]} leaves no other axis"
        " free for the batch.")
  first = free[0]
  if total <= _binding.MAX_GRID[first]:
    return (first,), (total,)
  if len(free) > 1:
    high = -(-total // _binding.MAX_GRID[first])
    if high <= _binding.MAX_GRID[free[1]]:
      return (first, free[1]), (-(-total // high), high)
  limits = " x ".join(str(_binding.MAX_GRID[a]) for a in free)
  names = "/".join("xyz"[a] for a in free)
  raise _NoRoom(
      f"the batch of {total} ({' x '.join(map(str, sizes))}) exceeds the"
      f" {limits} programs the free grid axes ({names}) can launch.")


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
