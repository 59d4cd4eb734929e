"""One kernel call on the operands at hand: bind, check placement, launch.

The whole meaning of ``triton_call`` with no cache in front, run on tracers
(under ``jax.jit``), on shards, or on concrete arrays at top level.
"""

from __future__ import annotations

import math
from typing import Any

import jax

from jt_dist import _errors
from jt_dist._core import arguments as _arguments
from jt_dist._core import binding as _binding
from jt_dist._core import options as _options
from jt_dist._core import outputs as _outputs
from jt_dist._core import placeholders as _placeholders
from jt_dist._core import primitive as _primitive
from jt_dist._core import tensordesc as _tensordesc
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import placement as _placement
from jt_dist._sharding import refs as _refs
from jt_dist._sharding import rule as _rule


def call(args, kernel, out_shape, grid, options: _options.CallOptions,
         metaparams: dict, device: Any = None, layout: Any = None) -> Any:
  """Runs one ``triton_call`` on ``args``, tracers or concrete arrays;
  ``layout``: a rule's layout found before tracing (tracers show only
  explicit mesh axes)."""
  kernel, args, metaparams = _arguments.merge_keywords(kernel, args,
                                                     metaparams)
  if options.sharding_rule is not None:
    _tensordesc.refuse_split("triton_call", "a call with sharding_rule=",
                             args, out_shape)
  args, descriptors = _tensordesc.split(args)
  options = options.with_descriptors(descriptors)
  if _refs.has_refs(args):
    _refs.check(args, options.input_output_aliases, options.sharding_rule,
                "triton_call")
    return _refs.with_values(args, lambda values, refs: single_device(
        values, kernel, out_shape, grid, options.with_refs(refs), metaparams,
        device))
  if options.sharding_rule is not None:
    outs = _partitioned(args, kernel, out_shape, grid, options, metaparams,
                        device, layout)
    if outs is not None:
      return outs
  return single_device(args, kernel, out_shape, grid, options, metaparams,
                       device)[0]


def find_layout(args, options):
  """The layout a rule's call on concrete ``args`` is split over, or None."""
  if options.sharding_rule is None or _refs.has_refs(args):
    return None
  rule = _rule.check(options.sharding_rule, "triton_call")
  return _partition.find_layout(args, rule, "triton_call")


def shard_call(*args, kernel, out_shape, grid, **kwargs) -> Any:
  """``call`` with ``triton_call``'s keywords: the body a shard runs."""
  return call(args, kernel, out_shape, grid, *options_from_keywords(kernel, kwargs))


def options_from_keywords(kernel, kwargs: dict):
  """Splits ``triton_call``'s keywords into its options and metaparams; a
  launch option that names a parameter of ``kernel`` is both, as in
  Triton's launcher."""
  named = {k: kwargs[k] for k in _options.OPTION_NAMES if k in kwargs}
  metaparams = {k: v for k, v in kwargs.items()
                if k not in _options.OPTION_NAMES}
  metaparams.update(_arguments.launch_option_params(kernel, kwargs))
  return _options.make_options(**named), metaparams


def check_binding(args, kernel, out_shape, grid, options, metaparams):
  """Binds without launching, to explain operands jax.jit refused: returns
  ``bind_call``'s ``(array_args, spec, out_tree)``."""
  kernel, args, metaparams = _arguments.merge_keywords(kernel, args,
                                                     metaparams)
  args, descriptors = _tensordesc.split(args)
  kernel, args, metaparams = _resolved(kernel, args, metaparams)
  return _binding.bind_call(args, kernel, out_shape, grid,
                            options.with_descriptors(descriptors), metaparams)


def _resolved(kernel, args, metaparams):
  """``shard_size``s and runtime scalars resolved, NumPy made canonical."""
  args, metaparams = _placeholders.resolve_sizes(args, metaparams)
  kernel, args = _placeholders.bind_runtime_scalars(kernel, args, metaparams)
  return kernel, _arguments.canonical_numpy(args), metaparams


def single_device(args, kernel, out_shape, grid, options, metaparams,
                  device=None):
  """Launches on one device; returns (outputs, the Refs' new values)."""
  kernel, args, metaparams = _resolved(kernel, args, metaparams)
  # A Ref argument is written even when every output is empty.
  empty = not options.ref_inputs and _all_outputs_empty(out_shape)
  # With nothing to launch, grid (1,) lets every other binding check run.
  arrays, spec, out_tree = _binding.bind_call(
      args, kernel, out_shape, (1,) if empty else grid, options, metaparams)
  arrays = _place(arrays, args, spec, device)
  if empty:
    # Nothing to compute: launching would hand the kernel pointers to empty
    # buffers (and the grid usually rounds to 0 blocks).
    outs = [jax.numpy.zeros(shape, dtype) for shape, dtype in spec.out_shapes]
    return jax.tree_util.tree_unflatten(out_tree, outs), ()
  outs = _primitive.triton_call_p.bind(*arrays, spec=spec)
  n = len(outs) - spec.ref_outputs
  return jax.tree_util.tree_unflatten(out_tree, outs[:n]), tuple(outs[n:])


def _partitioned(args, kernel, out_shape, grid, options, metaparams, device,
                 layout=None):
  """Runs a call with a rule once per shard; None if unsplit. Shapes are
  checked first: a rule that does not fit fails on one device as on many."""
  rule = _rule.check(options.sharding_rule, "triton_call")
  out_shapes, out_tree = _outputs.flatten_out_shape(out_shape)
  _partition.factor_sizes(rule, args, out_shapes)
  layout = layout or _partition.find_layout(args, rule, "triton_call")
  if layout is None:
    return None
  if device is not None:
    raise _errors.DevicePlacementError(
        f"triton_call: device={device!r} asks for one device, but the call"
        f" with {rule!r} is split over mesh {dict(layout.mesh.shape)} (its"
        " operands are sharded there). Drop device=, or move the operands"
        " to that device with jax.device_put(x, device) first.")
  kwargs = {**options.keywords(), **metaparams}
  if layout.auto:
    return _partition.run_auto(args, shard_call, kernel, out_shapes,
                               out_tree, grid, rule, kwargs, "triton_call")
  return _partition.run(args, shard_call, kernel, out_shapes, out_tree,
                        grid, rule, layout, kwargs, "triton_call")


def _all_outputs_empty(out_shape: Any) -> bool:
  """Whether there are outputs and every one is empty."""
  leaves = jax.tree_util.tree_leaves(out_shape)
  try:
    sizes = [math.prod(leaf.shape) for leaf in leaves]
  except (AttributeError, TypeError):
    return False  # bind_call reports malformed outputs.
  return bool(sizes) and all(size == 0 for size in sizes)


def _place(arrays, args, spec, device):
  """Checks placement; moves uncommitted inputs to ``device``."""
  name = spec.info.name
  if any(_arguments.is_tuple(a) for a in args):
    # Tuple operands: their leaves are checked like positional ones.
    args = [leaf for a in args for _, leaf in _arguments.leaves_with_paths(a)]
  if any(isinstance(a, jax.core.Tracer) for a in arrays):
    _placement.check_traced(args, name)
    return _placement.unify_varying_axes(arrays)
  target = _placement.check_concrete(args, name, device)
  if device is None or target is None:
    return arrays
  return [a if getattr(a, "committed", False) else jax.device_put(a, target)
          for a in arrays]
