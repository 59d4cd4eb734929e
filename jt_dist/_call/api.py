"""``triton_call``: the public entry point for one kernel call."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Mapping, Sequence

import jax

from jt_dist._call import backend_options as _backend_options
from jt_dist._vmap import batching as _batching
from jt_dist._cpu import unsupported as _unsupported
from jt_dist._core import binding as _binding
from jt_dist._call import dispatch as _dispatch
from jt_dist._call import entries as _entries
from jt_dist._call import lean as _lean
from jt_dist import _errors
from jt_dist._call import operands as _operands
from jt_dist._sharding import auto_axes as _auto_axes
from jt_dist._sharding import partition as _partition
from jt_dist._sharding import placement as _placement
from jt_dist._sharding import replay as _replay
from jt_dist._core import primitive as _primitive
from jt_dist._call import refs as _refs
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._sharding import rule as _rule
from jt_dist._sharding import shard_size as _shard_size
from jt_dist._call import tensordesc as _tensordesc


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, grid: Any,
                **kwargs: Any) -> Any:
  """Calls a ``@triton.jit`` kernel on ``jax.Array`` arguments.

  A drop-in for ``jax_triton.triton_call``, eager or under ``jax.jit``. The
  kernel's parameters are bound in order by ``args``, then by one pointer per
  leaf of ``out_shape`` (outputs follow inputs), then by name from
  ``metaparams``. On GPUs the kernel is compiled by Triton and launched by
  jaxlib's Triton custom call; on the CPU it runs through Triton's
  interpreter. An eager call is checked and bound once per signature
  (kernel, shapes, dtypes, shardings, scalar types, metaparams, grid and
  options); later calls with that signature go straight to a cached,
  compiled executable (``jt_dist.configure_cache(dispatch_entries=...)``
  bounds how many are kept).

  ``inspect.signature(triton_call)`` lists every keyword argument below;
  the function itself takes them through ``**kwargs``, so that the commonest
  eager call (no option given) pays for no defaults.

  Args:
    *args: the inputs: ``jax.Array``s (passed as pointers), ``jax.Ref``s
      (``jax.new_ref(x)``; passed as pointers and mutated in place: the
      kernel's writes land in the Ref, which no ``out_shape`` entry names),
      ``jt_dist.TensorDescriptor``s (host-side TMA descriptors), Python
      ``bool``/``int``/``float`` scalars (passed by value; a float as fp32
      where float32 holds it, else fp64; ``np.float32`` is deprecated), and
      (nested) tuples of arrays and scalars for tuple parameters.
      ``jt_dist.shard_size(i)`` stands for the size of array ``args[i]``.
    kernel: a ``@triton.jit`` function, optionally wrapped by
      ``@triton.autotune`` and/or ``@triton.heuristics``.
    out_shape: an object with ``.shape`` and ``.dtype`` (such as
      ``jax.ShapeDtypeStruct``), or any pytree of them; the outputs come back
      in the same structure.
    grid: an int, a tuple of up to three ints, or a callable that receives a
      dict of every metaparam and every scalar argument by kernel parameter
      name, and returns one of those.
    **kwargs: the options below, and the kernel's metaparams.

  Keyword Args:
    name: a name for the call, recorded in the custom call.
    custom_call_target_name: jaxlib's custom-call target on GPUs:
      ``"triton_kernel_call_ffi"`` or the legacy ``"triton_kernel_call"``.
      By default, on CUDA the legacy target (jax-triton 0.3's, the cheaper
      launch); the FFI target under ``jax.export``, with a
      ``cost_estimate``, and on ROCm.
    num_warps: warps per program; 4 by default. Ignored when autotuned.
    num_stages: software-pipelining stages; 3 by default.
    num_ctas: CTAs per cluster (Hopper and later); 1 by default. Above 1,
      a ValueError where the target has no clusters: CUDA before sm_90,
      and the CPU interpreter.
    compute_capability: the GPU to compile for: a CUDA compute capability,
      e.g. 90, or a ROCm arch, e.g. ``"gfx942"``; by default that of the
      devices the call is lowered for (cross-lowering on a host without
      the GPU must name it). Under
      ``jax.export`` it must be given, here or through
      ``jt_dist.export_options``.
    enable_fp_fusion: whether Triton may fuse multiplies and adds into FMAs.
    backend_options: more Triton compiler options for GPUs, by name (e.g.
      ``{"maxnreg": 128}``); values must be hashable. ``num_warps``,
      ``num_stages``, ``num_ctas``, ``debug`` and ``enable_fp_fusion`` may be
      given here instead of as arguments, but not both ways. The CPU
      interpreter ignores the rest.
    input_output_aliases: maps an input to the output that reuses its
      buffer, under jax-triton 0.3.1's convention (keys count the array
      arguments; every output, aliased or not, binds a pointer parameter) or
      0.4's (keys count the flattened non-constexpr operands, scalars
      included; an aliased input is its output's buffer and the output binds
      no parameter). The convention that binds the kernel's parameters is
      used; where both do, 0.4's, with a ``DeprecationWarning``.
    zeroed_outputs: indices into the flattened outputs to zero before each
      launch, or a callable of the metaparams returning them.
    debug: print Triton's intermediate representations when compiling (and
      turn on Triton's device-side asserts); forces a fresh compile. Set
      ``JT_DIST_DUMP_DIR`` to also write every IR and the launch metadata.
      Compiled kernels are cached in memory and on disk
      (``JT_DIST_CACHE_DIR``, default ``~/.cache/jt_dist``;
      ``JT_DIST_DISK_CACHE=0`` or ``jt_dist.configure_cache`` to turn off).
    serialized_metadata: opaque bytes recorded in the custom call.
    out_type: another name for ``out_shape``.
    vmap_method: how ``jax.vmap`` batches the call. ``None`` (the default)
      launches the kernel once over a grid extended by the batch, reading
      the batch index from a grid axis the kernel does not read, and falls
      back to one launch per batch element (logged at debug level) where
      the grid has no room. ``"grid"`` launches once or raises.
      ``"sequential"`` launches once per batch element.
    device: optionally, the device the call must run on: an index into
      ``jax.local_devices()`` or a ``jax.Device`` this process addresses
      (in a multi-process run, another process's device is refused).
      Committed inputs must already be
      there; uncommitted ones are moved there. By default the call runs
      where its inputs are.
    sharding_rule: a ``jt_dist.ShardingRule`` saying how the kernel's
      dimensions may be split. Under ``jax.jit`` over a mesh with explicit
      axes (or eagerly on sharded arrays) the call then runs once per
      device on its shard: operands that disagree with the rule are
      resharded, split contracted factors are reduced as the rule says,
      and the outputs come back sharded. On GPUs, automatic mesh axes go
      through XLA's partitioner (``custom_partitioning``). ``out_shape``
      stays global; ``jt_dist.shard_size`` and a callable grid see
      shard-local sizes. The rule's operands are the array arguments in
      order, a tuple operand's arrays one by one (flattened order).
    has_side_effect: whether the kernel does more than write its outputs
      (e.g. writes through a pointer it computes, or prints): the call then
      runs even when its outputs are unused; jax's and XLA's dead-code
      elimination keep it. By default an unused call is dropped.
    cost_estimate: a dict with ``flops``, ``bytes_accessed`` and/or
      ``transcendentals`` (non-negative ints, for the whole call), recorded
      on GPUs in the custom call's ``cost_estimate_json`` attribute, as
      jax-triton 0.4 does, for XLA's scheduler and cost analysis. On the
      CPU it is recorded the same way on jt_dist's own custom call, which
      XLA's CPU cost analysis does not read.
    metaparams: any other keyword: values for the kernel's remaining
      parameters, by name; usually its ``tl.constexpr`` parameters. A keyword naming a
      non-constexpr parameter is an operand, as if passed positionally in
      parameter order (jax-triton 0.4).

  Returns:
    The outputs, in the structure of ``out_shape``.

  Raises:
    TypeError: ``kernel`` is not a Triton kernel, an argument or output has
      an unsupported type or dtype, or ``out_shape`` is malformed.
    jt_dist.KernelBindingError: the arguments, outputs and metaparams do not
      bind every kernel parameter exactly once.
    ValueError: a bad grid, alias, zeroed output, or an oversized scalar;
      an option given both as an argument and in ``backend_options``;
      ``num_ctas > 1`` where there are no clusters (before sm_90, the CPU);
      a ``TensorDescriptor`` larger than its array.
    NotImplementedError: autotuning hooks, differentiation,
      ``vmap_method="grid"`` with no room on the grid for the batch, a Gluon
      kernel on the CPU, or a ``TensorDescriptor`` with ``sharding_rule``.
    jt_dist.DevicePlacementError: an input is sharded or replicated over
      several devices, inputs sit on different devices or not on ``device``,
      or the call is partitioned by XLA over several devices outside
      ``jax.shard_map``, with no ``sharding_rule``.
    jt_dist.ShardingSpecError: the shapes do not fit ``sharding_rule``.
    jt_dist.AutoAxesError: a call with ``sharding_rule`` is traced over
      automatic mesh axes on the CPU, or its shardings were given only to
      ``jax.jit``.
  """
  outs = _lean.hit(args, kernel, out_shape, grid, kwargs)
  if type(outs) is not _lean.Miss:  # pylint: disable=unidiomatic-typecheck
    return outs
  if _OPTION_NAMES.isdisjoint(kwargs):
    # No option given: every keyword is a metaparam (or a keyword operand).
    return _call(args, kernel, out_shape, grid, _dispatch.DEFAULT_OPTIONS,
                 kwargs, True, outs.key)
  return _with_options(*args, kernel=kernel, out_shape=out_shape, grid=grid,
                       **kwargs)


def _with_options(
    *args: Any,
    kernel: Any,
    out_shape: Any = None,
    grid: Any,
    name: str = "",
    custom_call_target_name: str | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    num_ctas: int | None = None,
    compute_capability: int | None = None,
    enable_fp_fusion: bool = True,
    backend_options: Mapping[str, Any] | None = None,
    input_output_aliases: Mapping[int, int] | None = None,
    zeroed_outputs: Sequence[int] | Callable[[dict], Sequence[int]] = (),
    debug: bool = False,
    serialized_metadata: bytes = b"",
    out_type: Any = None,
    vmap_method: str | None = None,
    device: Any = None,
    sharding_rule: Any = None,
    has_side_effect: bool = False,
    cost_estimate: Mapping[str, int] | None = None,
    **metaparams: Any,
) -> Any:
  """``triton_call`` with its options by name (the full signature).

  ``triton_call``'s own parameters take the commonest call through without
  filling in defaults; a call naming any option comes here.
  """
  if out_type is not None:
    out_shape = resolve_out_shape(out_shape, out_type)
  # In _dispatch.DEFAULT_OPTIONS' order.
  options = (name, custom_call_target_name, num_warps, num_stages, num_ctas,
             compute_capability, enable_fp_fusion, backend_options,
             input_output_aliases, zeroed_outputs, debug, serialized_metadata,
             vmap_method, device, sharding_rule, has_side_effect,
             cost_estimate)
  if _dispatch.all_defaults(options):
    # Options named at their defaults: as if none were named.
    return _default_options_call(args, kernel, out_shape, grid, metaparams)
  return _call(args, kernel, out_shape, grid, options, metaparams, False)


def _default_options_call(args, kernel, out_shape, grid, metaparams):
  """A call with every option at its default: the lean key first."""
  outs = _lean.hit(args, kernel, out_shape, grid, metaparams)
  if type(outs) is not _lean.Miss:  # pylint: disable=unidiomatic-typecheck
    return outs
  return _call(args, kernel, out_shape, grid, _dispatch.DEFAULT_OPTIONS,
               metaparams, True, outs.key)


def _call(args, kernel, out_shape, grid, options, metaparams, defaults,
          lean_key=None):
  """A call with no lean entry: its full key and entry, or a first call.

  ``options`` are in ``_dispatch.DEFAULT_OPTIONS``' order, ``defaults`` is
  ``_dispatch.all_defaults(options)``, and ``lean_key`` the call's
  ``jt_dist._call.lean`` key or None.
  """
  # A repeated call: its key, from the arguments as given, and its entry.
  outs = _dispatch.cached(args, kernel, out_shape, grid, options, metaparams,
                          defaults, lean_key)
  if outs is _dispatch.MISS:
    outs = _first_call(args, kernel, out_shape, grid, options, metaparams,
                       lean_key)
  return outs


# Every keyword of _with_options that is not a metaparam: a call naming none
# takes triton_call's own path, with every option at its default.
_OPTION_NAMES = frozenset(
    name for name, p in inspect.signature(_with_options).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
    and name not in ("kernel", "out_shape", "grid"))
triton_call.__signature__ = inspect.signature(_with_options)
_lean.configure(_OPTION_NAMES)


def _first_call(args, kernel, out_shape, grid, options, metaparams,
                lean_key=None):
  """A call with no entry: checks, binds and runs it, and files its entry.

  ``lean_key`` is the call's ``jt_dist._call.lean`` key, or None.
  """
  signature = _signature(args, kernel, out_shape, grid, options, metaparams)
  args, metaparams, descriptors, named = _prepare(args, kernel, options,
                                                  metaparams)
  device, rule = named.pop("device"), named.pop("sharding_rule")
  if _refs.has_refs(args):
    # Never the eager fast path: its entries take arrays, not Refs.
    return _refs.call(args, kernel, out_shape, grid, named, device, rule,
                      metaparams,
                      functools.partial(_single_device,
                                        descriptors=descriptors))
  if rule is not None:
    rule = _rule.check(rule, "triton_call")
    recorder = (None if signature is None
                else _replay.recorder(signature, kernel, grid))
    outs = _partitioned(args, kernel, out_shape, grid, rule, device,
                        {**named, **metaparams}, recorder)
    if outs is not _NOT_PARTITIONED:
      return outs
  return _single_device(args, kernel, out_shape, grid, named, device, rule,
                        metaparams, signature, descriptors=descriptors,
                        lean_key=lean_key)


def _signature(args, kernel, out_shape, grid, options, metaparams):
  """The call's cache key (as ``_dispatch.cached`` computes it), or None."""
  try:
    found = _dispatch.key(args, kernel, out_shape, grid,
                          _dispatch.options_key(options), metaparams,
                          options[_dispatch.RULE] is not None)
    if found is not None:
      hash(found[0])  # An unhashable part: no entry.
      return found[0]
  except Exception:  # pylint: disable=broad-except
    pass
  return None


def _prepare(args, kernel, options, metaparams):
  """Binds keyword operands, descriptors and backend options.

  Returns:
    ``(args, metaparams, descriptors, options)``: the positional operands
    (keyword operands merged in, descriptors replaced by their arrays),
    the remaining metaparams, the descriptors, and the options by name,
    ``backend_options`` merged into the named ones.
  """
  (name, custom_call_target_name, num_warps, num_stages, num_ctas,
   compute_capability, enable_fp_fusion, backend_options,
   input_output_aliases, zeroed_outputs, debug, serialized_metadata,
   vmap_method, device, sharding_rule, has_side_effect,
   cost_estimate) = options
  args, metaparams = _operands.merge_keywords(kernel, args, metaparams)
  args, descriptors = _tensordesc.split(args)
  if descriptors and sharding_rule is not None:
    raise NotImplementedError(
        f"triton_call: args[{descriptors[0][0]}] is a TensorDescriptor, and"
        " a call with sharding_rule= cannot split one: its shape and strides"
        " are those of the global array. Build it per shard instead, inside"
        " jax.shard_map: TensorDescriptor.from_array(local_x, block_shape).")
  merged = _backend_options.merge(
      backend_options, num_warps=num_warps, num_stages=num_stages,
      num_ctas=num_ctas, debug=debug, enable_fp_fusion=enable_fp_fusion)
  named = dict(
      name=name, custom_call_target_name=custom_call_target_name,
      num_warps=merged.num_warps, num_stages=merged.num_stages,
      num_ctas=1 if merged.num_ctas is None else merged.num_ctas,
      compute_capability=compute_capability,
      enable_fp_fusion=merged.enable_fp_fusion,
      input_output_aliases=input_output_aliases,
      zeroed_outputs=zeroed_outputs, debug=merged.debug,
      serialized_metadata=serialized_metadata, vmap_method=vmap_method,
      has_side_effect=has_side_effect, cost_estimate=cost_estimate,
      backend_options=dict(merged.extra), device=device,
      sharding_rule=sharding_rule)
  return args, metaparams, descriptors, named


def _single_device(args, kernel, out_shape, grid, options, device, rule,
                   metaparams, key, ref_inputs=(), descriptors=(),
                   lean_key=None):
  """Binds, places and launches a call on one device; records its entry.

  With ``ref_inputs`` (array indices of Refs' values), returns
  ``(outputs, new values of those arrays)`` instead, and records nothing.
  ``descriptors`` are the call's host-side TMA descriptors, whose arrays
  stand in ``args`` in their place.
  """
  given_args = args
  _unsupported.check_eager(kernel, args)
  args, metaparams = _shard_size.resolve(args, metaparams)
  args = _operands.canonical_numpy(args)
  if options["vmap_method"] not in _batching.VMAP_METHODS:
    raise ValueError(
        f"triton_call: vmap_method={options['vmap_method']!r} is not"
        " supported; pass None (the default: one launch over a batched grid"
        " where the grid has room, else one launch per element), 'grid' (one"
        " launch, or an error) or 'sequential' (one launch per element)."
    )
  call_options = _binding.CallOptions(**options, sharding_rule=rule,
                                      ref_inputs=tuple(ref_inputs),
                                      tensor_descriptors=descriptors)
  # A Ref argument is written even when every output is empty.
  empty = not ref_inputs and _all_outputs_empty(out_shape)
  seen = (_entries.GridRecorder(grid) if key is not None and callable(grid)
          else grid)
  arrays, spec, out_tree = _binding.bind_call(
      args, kernel, out_shape, _NO_LAUNCH_GRID if empty else seen,
      call_options, metaparams,
  )
  arrays, target = _place(arrays, args, spec, device)
  if empty:
    # Nothing to compute: launching would hand the kernel pointers to empty
    # buffers (and the grid usually rounds to 0 blocks).
    return jax.tree_util.tree_unflatten(out_tree, _empty_outputs(spec, arrays))
  if key is None:
    outs = _primitive.triton_call_p.bind(*arrays, spec=spec)
    if ref_inputs:
      n = len(outs) - spec.ref_outputs
      return jax.tree_util.tree_unflatten(out_tree, outs[:n]), outs[n:]
    return jax.tree_util.tree_unflatten(out_tree, outs)
  entry = _entries.make_entry(given_args, args, arrays, spec, out_tree, seen,
                              target, device, descriptors=bool(descriptors))
  _dispatch.entries.put(key, entry)
  _lean.register(lean_key, entry, len(given_args))
  return entry(given_args)


_NOT_PARTITIONED = object()


def _partitioned(args, kernel, out_shape, grid, rule, device, kwargs,
                 recorder=None):
  """Runs a call with a rule once per shard; ``_NOT_PARTITIONED`` if unsplit.

  The shapes are checked against the rule first, so that a rule that does
  not fit fails on one device as on many.
  """
  out_shapes, out_tree = _binding.flatten_out_shape(out_shape)
  _partition.factor_sizes(rule, args, out_shapes)
  layout = _partition.find_layout(args, rule, "triton_call")
  if layout is None:
    return _NOT_PARTITIONED
  if device is not None:
    raise _errors.DevicePlacementError(
        f"triton_call: device={device!r} asks for one device, but the call"
        f" with {rule!r} is split over mesh {dict(layout.mesh.shape)} (its"
        " operands are sharded there). Drop device=, or move the operands"
        " to that device with jax.device_put(x, device) first."
    )
  if layout.auto:
    return _auto_axes.run(args, triton_call, kernel, out_shapes, out_tree,
                          grid, rule, kwargs, "triton_call")
  return _partition.run(args, triton_call, kernel, out_shapes, out_tree,
                        grid, rule, layout, kwargs, "triton_call",
                        recorder=recorder)


# Bound in place of the user's grid when there is nothing to launch, so that
# every other binding check still runs.
_NO_LAUNCH_GRID = (1,)


def _empty_outputs(spec, arrays):
  """The outputs of a call with nothing to launch, beside its inputs."""
  outs = [jax.numpy.zeros(shape, dtype) for shape, dtype in spec.out_shapes]
  concrete = [a for a in arrays if not isinstance(a, jax.core.Tracer)]
  devices = concrete[0].devices() if concrete else set()
  if len(devices) == 1:
    outs = [jax.device_put(o, next(iter(devices))) for o in outs]
  return outs


def _all_outputs_empty(out_shape: Any) -> bool:
  """Whether every output has a dimension of 0 (and there is one at least)."""
  leaves = jax.tree_util.tree_leaves(out_shape)
  try:
    sizes = [math.prod(leaf.shape) for leaf in leaves]
  except (AttributeError, TypeError):
    return False  # bind_call reports malformed outputs.
  return bool(sizes) and all(size == 0 for size in sizes)


def resolve_out_shape(out_shape: Any, out_type: Any) -> Any:
  if out_shape is not None and out_type is not None:
    raise TypeError(
        "triton_call: got both out_shape= and out_type=, which are two names"
        " for the same argument. Pass only one."
    )
  return out_type if out_shape is None else out_shape


def _place(arrays, args, spec, device):
  """Runs the device-validation layer; moves uncommitted inputs to device.

  Returns:
    ``(arrays, target)``: the arrays, placed, and the device ``device=``
    resolved to (None without ``device=``, or under a trace).
  """
  name = spec.info.name
  if any(_pytree_args.is_tuple(a) for a in args):
    # Tuple operands: their leaves are checked like positional ones.
    args = [leaf for a in args for _, leaf in _pytree_args.leaves_with_paths(a)]
  if any(isinstance(a, jax.core.Tracer) for a in arrays):
    _placement.check_traced(args, name)
    return _placement.unify_varying_axes(arrays), None
  target = _placement.check_concrete(args, name, device)
  if device is None or target is None:
    return arrays, None
  return [
      jax.device_put(a, target)
      if not isinstance(a, jax.core.Tracer)
      and not getattr(a, "committed", False) else a
      for a in arrays
  ], target
