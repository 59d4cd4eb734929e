"""``triton_call``: the drop-in front door over ``kernel_call``."""

from __future__ import annotations

import inspect
import itertools
import operator
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jt_dist import _errors
from jt_dist._call import kernel_call as _kernel_call
from jt_dist._call import memo as _memo
from jt_dist._core import arguments as _arguments
from jt_dist._core import exact as _exact
from jt_dist._core import placeholders as _placeholders
from jt_dist._core import tensordesc as _tensordesc
from jt_dist._sharding import refs as _refs

OPERAND = _kernel_call.OPERAND
_memo_get = _memo.triton_calls.get
_SHAPE_DTYPE = jax.ShapeDtypeStruct
_SCALARS = frozenset((int, bool, float))
# A memo entry saying: key this call's scalars by their values.
_BY_VALUE = object()
# Argument types passed at call time; grows by the classes of concrete
# jax.Arrays (jaxlib's ArrayImpl) as they are met.
_OPERAND_TYPES = {np.ndarray, _tensordesc.TensorDescriptor,
                  _placeholders.RuntimeScalar}


class _FirstValues:
  """A memo entry under a call's scalar types: ``key``, of its first values.

  Those are compiled in (a value repeated every call costs no buffer);
  other values make the call take its scalars at run time from then on.
  """

  __slots__ = ("key",)

  def __init__(self, key):
    self.key = key


class _Fixed:
  """A plain key's memo entry where scalars are compiled in: the calls are
  filed under ``(entry, values(args))``, the values at ``positions`` (one
  value, or a tuple of several: an entry has one count)."""

  __slots__ = ("positions", "values")

  def __init__(self, positions):
    self.positions = positions
    self.values = operator.itemgetter(*positions)


def triton_call(*args: Any, kernel: Any, out_shape: Any = None, grid: Any,
                **kwargs: Any) -> Any:
  """Calls a ``@triton.jit`` kernel on ``jax.Array`` arguments.

  A drop-in for ``jax_triton.triton_call``, eager or under ``jax.jit``. The
  kernel's parameters are bound in order by ``args``, then by one pointer per
  leaf of ``out_shape`` (outputs follow inputs), then by name from
  ``metaparams``. On GPUs the kernel is compiled by Triton and launched by
  jaxlib's Triton custom call; on the CPU it runs through Triton's
  interpreter. Each call is ``jt_dist.kernel_call(kernel, ...)(*arrays)``:
  the call's static parts (kernel, outputs, grid, options, metaparams and
  the scalars passed by value) find the jitted function made for them
  before, and jax's dispatch does the rest
  (``jt_dist.configure_cache(dispatch_entries=...)`` bounds how many are
  kept). A hot loop can hold the ``kernel_call`` itself.

  ``inspect.signature(triton_call)`` lists every keyword argument below.

  Args:
    *args: the inputs: ``jax.Array``s (passed as pointers), ``jax.Ref``s
      (``jax.new_ref(x)``; passed as pointers and mutated in place: the
      kernel's writes land in the Ref, which no ``out_shape`` entry names),
      ``jt_dist.TensorDescriptor``s (host-side TMA descriptors), Python
      ``bool``/``int``/``float`` scalars (passed by value; a float as fp32
      where float32 holds it, else fp64; ``np.float32`` is deprecated),
      ``None`` (a compile-time constant of whatever parameter it binds, as
      in jax-triton 0.4.1, for ``if bias_ptr is not None:``; by keyword
      too), and (nested) tuples of arrays and scalars for tuple parameters.
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
      parameter order (jax-triton 0.4). A launch option above (such as
      ``num_stages``) that names a kernel parameter also binds it, as in
      Triton's launcher.

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
  plain = None
  # The commonest call, keyed without a Python loop: one ShapeDtypeStruct
  # out and a grid tuple; the types of the arguments, metaparams and grid,
  # and the metaparams' values. Only calls whose arguments are concrete
  # arrays and Python scalars are filed under it (_first_call), so the
  # key's types say which arguments are arrays: a lookup needs no checks.
  if type(out_shape) is _SHAPE_DTYPE and type(grid) is tuple:  # pylint: disable=unidiomatic-typecheck
    try:
      plain = (id(kernel), out_shape.shape, out_shape.dtype,
               out_shape.weak_type, out_shape.sharding, grid,
               tuple(map(type, (*args, *kwargs.values(), *grid))),
               *kwargs.items())
      call = _memo_get(plain)
      if type(call) is _Fixed:  # pylint: disable=unidiomatic-typecheck
        call = _memo_get((call, call.values(args)))
      # Scalars that come at run time must still be of the call's types.
      if call is not None and call.slots and not call.takes_at_run_time(
          args):
        call = None
    except TypeError:
      plain = call = None  # An unhashable metaparam or grid value.
    # The memo holds the call, and so the kernel: its id is unique. And
    # its source is the call's (call.fresh(), inline).
    if call is not None and getattr(
        call.triton_fn, "src", None) is call.triton_src:
      if call.direct:
        # A plain key's arrays are concrete: jax's dispatch alone.
        try:
          if call.leading is not None:
            return call._jitted(*args[call.leading])  # pylint: disable=protected-access
          return call._jitted(*itertools.compress(args, call.passed))  # pylint: disable=protected-access
        except Exception as e:  # pylint: disable=broad-except
          _kernel_call.raise_failure(e, args, call)
      return call(*itertools.compress(args, call.passed))
  # A scalar's value may come at run time: keyed by its type.
  runtime = not callable(grid)
  type_key = None
  try:
    key = (id(kernel), _memo.out_key(out_shape), _memo.grid_key(grid),
           _exact.dict_key(kwargs), _template(args, runtime))
    call = _memo.triton_calls.get(key)
    if call is None:
      by_value = (*key[:-1], _template(args, False))
      if by_value != key:
        # The first values of these types: compiled in, until others come.
        type_key, key, runtime = key, by_value, False
        call = _memo.triton_calls.get(key)
    elif call is _BY_VALUE or type(call) is _FirstValues:  # pylint: disable=unidiomatic-typecheck
      by_value = (*key[:-1], _template(args, False))
      if call is _BY_VALUE or call.key == by_value:
        # Something static reads the values, or they are the first ones.
        key, runtime = by_value, False
        call = _memo.triton_calls.get(key)
      else:
        call = None  # Other values: from now on they come at run time.
  except (TypeError, AttributeError):
    # An unhashable part (an array by keyword, a closure), or a malformed
    # out_shape that binding reports in full.
    key = call = None
  if call is None or not call.made_for(kernel):
    try:
      return _first_call(args, kernel, out_shape, grid, kwargs, key, runtime,
                         plain, type_key)
    except _errors.KernelBindingError as e:
      explained = _kernel_call.explain_binding(e, args, kernel, out_shape,
                                               grid, kwargs)
      if explained is e:
        raise
      raise explained from None
  return call(*itertools.compress(args, call.passed))


def _plain_types(args, kwargs, grid) -> bool:
  """Whether a call's plain key tells apart all it is keyed by: concrete
  arrays and Python scalars, metaparams and grid values of ``exact.PLAIN``
  types."""
  return (all(type(a) in _SCALARS or type(a) is np.ndarray  # pylint: disable=unidiomatic-typecheck
              or isinstance(a, jax.Array)
              and not isinstance(a, jax.core.Tracer) for a in args)
          and _exact.PLAIN.issuperset(map(type, (*kwargs.values(), *grid))))


def _is_operand(arg: Any) -> bool:
  kind = type(arg)
  if kind in _OPERAND_TYPES:
    return True
  if isinstance(arg, jax.Array):
    if not isinstance(arg, jax.core.Tracer):
      _OPERAND_TYPES.add(kind)
    return True
  if kind is tuple:
    return bool(arg) and all(_is_operand(a) for a in arg)
  return _refs.has_refs((arg,))


def _template(args: Sequence[Any], runtime: bool) -> tuple:
  """Per argument: ``OPERAND``, the exact key of a fixed value, or for a
  scalar that may come at run time (``runtime``) its and Triton's type.

  Raises TypeError for a tuple mixing arrays and scalars (made afresh).
  """
  template = []
  for a in args:
    kind = type(a)
    if kind in _OPERAND_TYPES or _is_operand(a):
      template.append(OPERAND)
    elif runtime and (dtype := _kernel_call.runtime_dtype(a)) is not None:
      template.append((kind, dtype))
    else:
      template.append(_exact.key(a))
  return tuple(template)


def _first_call(args, kernel, out_shape, grid, kwargs, key, runtime, plain,
                type_key=None):
  """A call with no memo entry under ``key``.

  Keyword operands are moved among the positional ones and the call made
  again in that form, which the memo keys. The call is filed under ``plain`` too where
  that key holds all the call is keyed by and tells its floats apart (run
  time, or no zero or NaN compiled in); ``type_key`` is the key of the
  scalars' types, whose first values these are.
  """
  merged_kernel, merged, metaparams = _arguments.merge_keywords(
      kernel, args, kwargs)
  if len(merged) != len(args):
    # Keyword operands, now positional: keyed and bound as if so passed, so
    # that their scalars follow the positional ones' rule.
    out = triton_call(*merged, kernel=merged_kernel, out_shape=out_shape,
                      grid=grid, **metaparams)
    if (key is not None and merged_kernel is kernel
        and type(out_shape) is _SHAPE_DTYPE and type(grid) is tuple  # pylint: disable=unidiomatic-typecheck
        and all(map(_is_operand, args))):
      _file_keyword_scalars(key, len(args), kernel, merged, out_shape, grid,
                            metaparams)
    return out
  statics = tuple(OPERAND if _is_operand(a) else a for a in merged)
  call = _kernel_call.make(merged_kernel, out_shape, grid, metaparams,
                           statics, runtime)
  # Called before it is filed: a call that fails is made again, and its
  # binding error explained, each time.
  out = call(*[a for a, passed in zip(args, call.passed) if passed])
  scalars = [i for i, a in enumerate(args) if not _is_operand(a)]
  if type_key is not None:
    _memo.triton_calls.put(type_key, _FirstValues(key))
  if (plain is not None and _plain_types(args, kwargs, grid)
      and _file_plain(plain, call, args, scalars)
      and not any(call.passed[i] for i in scalars)):
    key = None  # The plain key holds each scalar's value, as key would.
  if key is not None:
    by_type = [i for i, a in enumerate(args)
               if runtime and not _is_operand(a)
               and _kernel_call.runtime_dtype(a) is not None]
    if all(call.passed[i] for i in by_type):
      _memo.triton_calls.put(key, call)
    else:
      # Keyed by the scalars' types, the call needs their values: the key
      # says so, and the call is kept under its values.
      _memo.triton_calls.put(key, _BY_VALUE)
      _memo.triton_calls.put((*key[:-1], _template(args, False)), call)
  return out


def _file_keyword_scalars(key, n_args, kernel, merged, out_shape, grid,
                          metaparams) -> None:
  """Files under ``key`` (which holds the keywords' exact values) the call
  made for the positional form ``merged`` of a call of arrays and keyword
  scalars, where it compiles those in: a repeated call then binds nothing."""
  inner = (id(kernel), out_shape.shape, out_shape.dtype, out_shape.weak_type,
           out_shape.sharding, grid,
           tuple(map(type, (*merged, *metaparams.values(), *grid))),
           *metaparams.items())
  try:
    call = _memo_get(inner)
    if type(call) is _Fixed:  # pylint: disable=unidiomatic-typecheck
      call = _memo_get((call, call.values(merged)))
  except TypeError:
    return  # An unhashable metaparam.
  if (type(call) is _kernel_call.KernelCall and call.made_for(kernel)  # pylint: disable=unidiomatic-typecheck
      and not any(call.passed[n_args:])):
    _memo.triton_calls.put(key, call)


def _file_plain(plain, call, args, scalars) -> bool:
  """Files ``call`` under ``plain``, with the values of the scalars compiled
  in where there are any: filed? Equal floats are the same kernel argument
  but for zeros' signs, and a NaN equals nothing: such a value is not."""
  fixed = tuple(i for i in scalars if not call.passed[i])
  if not fixed:
    _memo.triton_calls.put(plain, call)
    return True
  if any(type(args[i]) is float and not 0.0 != args[i] == args[i]  # pylint: disable=unidiomatic-typecheck
         for i in fixed):
    return False
  entry = _memo.triton_calls.get(plain)
  if type(entry) is _kernel_call.KernelCall and entry.fresh():  # pylint: disable=unidiomatic-typecheck
    # A call that takes these types' values at run time keeps the key
    # (a per-step scalar); this one, for a value it cannot take (a float
    # float32 does not hold), is found by the general key.
    return False
  if type(entry) is not _Fixed or entry.positions != fixed:  # pylint: disable=unidiomatic-typecheck
    entry = _Fixed(fixed)
    _memo.triton_calls.put(plain, entry)
  _memo.triton_calls.put((entry, entry.values(args)), call)
  return True


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
  """``triton_call``'s full signature, for ``inspect.signature``."""
  raise NotImplementedError  # Never called: it only lends its signature.


triton_call.__signature__ = inspect.signature(_with_options)
