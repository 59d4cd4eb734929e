"""Binding a ``triton_call``'s arguments to its kernel's parameters, and
its launch grids.

Everything checkable before tracing is checked here, so that mistakes
surface at the caller's line.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Mapping

import jax
import numpy as np

from jt_dist import _errors
from jt_dist._core import arguments as _arguments
from jt_dist._core import kernel as _kernel
from jt_dist._core import options as _options
from jt_dist._core import outputs as _outputs
from jt_dist._core import pre_hooks as _pre_hooks
from jt_dist._core import types as _types

# The ``CallOptions`` fields a ``CallSpec`` carries as they are.
_SPEC_OPTIONS = (
    "name", "compute_capability", "enable_fp_fusion", "debug",
    "serialized_metadata", "custom_call_target_name", "vmap_method",
    "sharding_rule", "has_side_effect", "backend_options")
# CUDA's gridDim limits; ROCm's are at least as large.
MAX_GRID = (2**31 - 1, 65535, 65535)


def _check_complete(info, config, operands, n_args):
  """The config and the operands bind every parameter without a default once."""
  names = [k for k, _ in config.kwargs]
  if unknown := [k for k in names if k not in info.param_by_name]:
    raise _arguments.binding_error(
        info, f"autotuning config ({config.label}) sets {unknown}, which are"
        " not parameters of the kernel.")
  if twice := [name for name in dict.fromkeys(op.name for op in operands)
               if name in names]:
    raise _arguments.binding_error(
        info, f"{twice} are bound twice (config: {config.label}).")
  _arguments.check_bound(info, operands, n_args, names)


def _named_args(info, arrays, operands, out_shapes, constexprs):
  """Every parameter by name, arrays as ``jax.ShapeDtypeStruct``s; as in
  Triton's launcher, heuristics and the grid see defaults too."""
  shapes = {"array": [(a.shape, a.dtype) for a in arrays],
            "output": out_shapes}
  leaves: dict[str, list] = {}
  for op in operands:
    leaves.setdefault(op.name, []).append((op.path, jax.ShapeDtypeStruct(
        *shapes[op.kind][op.index]) if op.kind in shapes else op.value))
  named = {name: _arguments.nest(items) for name, items in leaves.items()}
  named.update(constexprs)
  return {**{p.name: p.default for p in info.params
             if p.has_default and p.name not in named}, **named}


def _launches(info, grid, options, constexprs, named, operands, aliases,
              n_args, n_outputs) -> list[_kernel.Launch]:
  """One ``Launch`` per config: each checked complete, with its grid."""
  configs = _kernel.expand_configs(
      info, constexprs, named, options.num_warps, options.num_stages,
      options.num_ctas)
  reset = _outputs.reset_to_zero(info, operands, aliases)
  launches = []
  for config in configs:
    _check_complete(info, config, operands, n_args)
    # A launch states every constexpr, defaults too (checked unbound above),
    # so that the grid, zeroed_outputs and the compiler see the same values.
    kwargs = dict(config.kwargs)
    kwargs.update((p.name, p.default) for p in info.params
                  if p.is_constexpr and p.has_default and p.name not in kwargs)
    config = dataclasses.replace(config, kwargs=tuple(kwargs.items()))
    where = f" (config: {config.label})" if info.layers else ""
    hooked, hook_zeroed = _pre_hooks.run(
        info, config, all_named := {**named, **kwargs}, operands, aliases)
    launches.append(_kernel.Launch(
        config=config,
        grid=evaluate_grid(grid, all_named, where),
        zeroed_outputs=tuple(sorted({*reset, *hook_zeroed, *_outputs.zeroed(
            options.zeroed_outputs, kwargs, n_outputs, where)})),
        operands=hooked))
  return launches


def evaluate_grid(grid: Any, named: Mapping[str, Any],
                  where: str) -> tuple[int, int, int]:
  """``grid`` (an int, up to 3 ints or a callable of ``named``) as x, y, z."""
  given = grid
  if callable(grid):
    grid = _errors.call_user(grid, "the grid callable", dict(named))
  if isinstance(grid, numbers.Integral):
    grid = (grid,)
  try:
    dims = tuple(grid)
  except TypeError:
    raise TypeError(
        f"triton_call: `grid` must be an int, a tuple of up to 3 ints or a"
        f" callable returning one; got {grid!r}{where}.") from None
  if len(dims) > 3 or not dims:
    raise ValueError(
        f"triton_call: `grid` must have 1 to 3 dimensions; got {dims!r} with"
        f" {len(dims)}{where}. Fold extra dimensions into one, and recover"
        " them in the kernel from tl.program_id with // and %.")
  for axis, (value, limit) in enumerate(zip(dims, MAX_GRID)):
    name = f"grid[{axis}] ({'xyz'[axis]})"
    _types.refuse_symbolic(value, name)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
      raise TypeError(
          f"triton_call: {name} must be an int; got {value!r} of type"
          f" {type(value).__name__} in grid {dims!r}{where}."
          + (" The grid callable must return ints." if callable(given) else ""))
    if value <= 0:
      raise ValueError(
          f"triton_call: {name} must be at least 1; got {int(value)} in grid"
          f" {dims!r}{where}. A grid computed with // can round down to 0:"
          " use triton.cdiv(n, BLOCK) instead.")
    if value > limit:
      raise ValueError(
          f"triton_call: {name} = {int(value)} exceeds the launch limit of"
          f" {limit} for that axis (grid {dims!r}{where}). Use larger blocks,"
          " or put the longest dimension on axis 0, whose limit is"
          f" {MAX_GRID[0]}.")
  return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def bind_call(args, kernel, out_shape, grid, options: _options.CallOptions,
              metaparams):
  """Checks a call; returns ``(array_args, its CallSpec, out_tree)``."""
  info = _kernel.kernel_info(kernel)
  out_shapes, out_tree, out_descriptors = _outputs.flatten(
      out_shape, allow_empty=bool(options.ref_inputs))
  kinds, arrays = _arguments.classify_args(args)
  operands, constexprs, aliases = _outputs.bind(
      info, args, kinds, arrays, out_shapes, metaparams,
      options.input_output_aliases)
  operands = _outputs.typed_descriptors(
      info, operands, kinds, options.tensor_descriptors, out_descriptors,
      aliases)
  constexprs.update(metaparams)
  named = _named_args(info, arrays, operands, out_shapes, constexprs)
  launches = _launches(info, grid, options, constexprs, named, operands,
                       aliases, len(args), len(out_shapes))
  refs = options.ref_inputs
  spec = _kernel.CallSpec(
      kernel=kernel,
      operands=tuple(operands),
      out_shapes=out_shapes + tuple((arrays[i].shape, np.dtype(arrays[i].dtype))
                                    for i in refs),
      launches=tuple(launches),
      input_output_aliases=aliases + tuple(
          (i, len(out_shapes) + k) for k, i in enumerate(refs)),
      cost_estimate=_options.cost_items(options.cost_estimate),
      ref_outputs=len(refs),
      **{name: getattr(options, name) for name in _SPEC_OPTIONS})
  return arrays, spec, out_tree


