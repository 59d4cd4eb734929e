"""The wrapper kernel that runs a batch of kernel calls in one launch.

The wrapper (made by ``jt_dist._core.wrapper.make_kernel``) takes the user
kernel's parameters, reads the batch index from a grid axis the user kernel
never reads, moves each batched pointer by that index times the operand's
batch stride (in 64-bit integers), and calls the user kernel inline. A tuple
parameter is rebuilt with its batched leaves moved (tuples are immutable in
Triton), scalars and unbatched leaves as they were.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
from typing import Any

from jt_dist import _compat
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import wrapper as _wrapper

# Functions whose axis argument names a grid axis.
_AXIS_READERS = ("program_id", "num_programs")
_ALL_AXES = frozenset((0, 1, 2))


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a batch lives in memory and on the grid.

  Attributes:
    sizes: the batch sizes, outermost vmap first.
    strides: ``(parameter name, element stride per level)`` for every
      pointer parameter batched at some level; a stride of 0 shares the
      operand across that level.
    axes: the grid axes holding the flat batch index, least significant
      first (two when the batch is split over y and z).
    counts: the grid size along each of ``axes``.
    tuples: ``(parameter name, leaf paths)`` of each tuple parameter; the
      strides name a tuple's leaves by label, e.g. ``yz[0]``.
  """

  sizes: tuple[int, ...]
  strides: tuple[tuple[str, tuple[int, ...]], ...]
  axes: tuple[int, ...]
  counts: tuple[int, ...]
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
  """The grid axes a kernel (or any ``@triton.jit`` callee) reads.

  An axis is read through ``tl.program_id(axis)`` or
  ``tl.num_programs(axis)``. An axis that is not a literal integer (a
  constexpr parameter, say) could be any axis, so all three count as read.
  Calls the scan cannot resolve to a function (a kernel passed as a
  constexpr, say) are not followed: the caller scans constexpr kernels.
  """
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
      # The callee's name: `tl.program_id` or a plain `program_id`.
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
  offsets = {}
  for name, strides in layout.strides:
    terms = [f"{p}i{level} * {stride}"
             for level, stride in enumerate(strides) if stride]
    if terms:
      offsets[name] = " + ".join(terms)
  # A tuple's leaves are labelled ``yz[0]``: the tuple is moved below.
  lines = [f"{name} += {offset}" for name, offset in offsets.items()
           if "[" not in name]
  for name, paths in layout.tuples:
    if any(_pytree_args.label(name, path) in offsets for path in paths):
      # Tuples are immutable: the wrapper rebuilds one with moved leaves.
      lines.append(f"{name} = {_tuple_expr(name, (), paths, offsets)}")
  return lines


def _tuple_expr(name, prefix, paths, offsets) -> str:
  """The source of the tuple at ``prefix`` with its pointers moved."""
  label = _pytree_args.label(name, prefix)
  if prefix in paths:
    return f"({label} + {offsets[label]})" if label in offsets else label
  depth = len(prefix)
  children = sorted({path[depth] for path in paths
                     if len(path) > depth and path[:depth] == prefix})
  items = [_tuple_expr(name, prefix + (k,), paths, offsets)
           for k in children]
  return "(" + "".join(f"{item}, " for item in items) + ")"


def wrapper_source(name: str, params, layout: Layout) -> str:
  """The source of the wrapper kernel: one ``def`` named ``name``.

  ``name`` is the user kernel's, so that errors and profiles name the
  user's kernel; ``params`` are the wrapper's ``(name, is_constexpr)``
  pairs, in the user kernel's order.
  """
  p = _prefix(params)
  # Annotations are evaluated where the function is defined, so a parameter
  # named `tl` cannot shadow this one; Triton's interpreter reads them as
  # text, and knows `tl.constexpr` by name.
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
  """The cached kernel running ``base_fn`` over ``layout``'s batch.

  ``base_fn`` is the user's kernel without its autotuning and heuristics
  layers, ``params`` the wrapper's ``(name, is_constexpr)`` pairs. The
  result (an ``InterpretedFunction`` for an interpreted ``base_fn``, so that
  it is interpreted on GPUs too) is the same object for the same arguments,
  so that Triton's and jt_dist's caches stay warm.
  """
  python_fn = _compat.jit_function_of(base_fn).fn
  source = wrapper_source(python_fn.__name__, params, layout)
  return _wrapper.make_kernel(base_fn, source, _prefix(params), "vmap wrapper")
