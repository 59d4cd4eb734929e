"""Binding a ``triton_call``'s arguments to its kernel's parameters.

The kernel's parameters are bound, in order, by the positional arguments,
then by one pointer per output (the outputs follow the inputs, as in
jax-triton), then by name from the metaparams, autotuning configs and
heuristics; parameters with defaults may stay unbound. Everything that can
be checked before tracing is checked here, so that mistakes surface at the
caller's line with the argument named, not deep inside lowering.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jt_dist._core import conventions as _conventions
from jt_dist import _errors
from jt_dist._core import grid as _grid
from jt_dist._core import kernel as _kernel
from jt_dist._core import options as _options
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import types as _types


@dataclasses.dataclass(frozen=True)
class Operand:
  """What binds one runtime (non-constexpr) kernel parameter."""

  name: str
  kind: str  # "array", "scalar" or "output".
  index: int  # Array index among array arguments, or output index.
  value: Any  # The scalar's value; None for pointers.
  type: str  # Triton's type name, e.g. "*fp32" or "i32".
  path: tuple[int, ...] = ()  # Where in a tuple parameter, e.g. (1, 0).

  @property
  def label(self) -> str:
    """The name for messages: ``yz[1]`` for a leaf of tuple parameter yz."""
    return _pytree_args.label(self.name, self.path)


@dataclasses.dataclass(frozen=True)
class Launch:
  """One config's launch: its constexprs, options, grid and zeroed outputs."""

  config: _kernel.Config
  grid: tuple[int, int, int]
  zeroed_outputs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CallSpec:
  """Everything a lowering needs to launch the kernel; hashable and static."""

  kernel: Any
  name: str
  operands: tuple[Operand, ...]
  out_shapes: tuple[tuple[tuple[int, ...], np.dtype], ...]
  launches: tuple[Launch, ...]
  input_output_aliases: tuple[tuple[int, int], ...]
  compute_capability: int | None
  enable_fp_fusion: bool
  debug: bool
  serialized_metadata: bytes
  custom_call_target_name: str | None
  vmap_method: str | None
  # A _batching.Batched when this is the batched form of a user's call.
  batch: Any = None
  # The call's ShardingRule: the lowering refuses it over several devices
  # with a message about partitioning rather than misplacement.
  sharding_rule: Any = None
  # On the CPU, an eager call's scalars may arrive as a runtime operand
  # after the arrays (jt_dist._cpu.scalars) rather than in ``operands``.
  runtime_scalars: bool = False
  # The call must run even when its outputs are unused (has_side_effect=).
  has_side_effect: bool = False
  # ``cost_estimate=`` as sorted (key, int) pairs; () when not given.
  cost_estimate: tuple[tuple[str, int], ...] = ()
  # How many trailing outputs are the new values of ``jax.Ref`` arguments:
  # each aliases its input and binds no kernel parameter of its own.
  ref_outputs: int = 0
  # Triton compiler options besides the named ones: sorted (name, value).
  backend_options: tuple[tuple[str, Any], ...] = ()

  @property
  def info(self) -> _kernel.KernelInfo:
    return _kernel.kernel_info(self.kernel)

  def __repr__(self) -> str:
    grids = sorted({launch.grid for launch in self.launches})
    batch = f", batch={self.batch.layout.sizes}" if self.batch else ""
    return (
        f"CallSpec(kernel={self.info.name}, name={self.name!r},"
        f" configs={len(self.launches)}, grids={grids}{batch})"
    )


@dataclasses.dataclass(frozen=True)
class CallOptions:
  """The keyword options of ``triton_call`` besides kernel, outputs, grid."""

  name: str = ""
  custom_call_target_name: str | None = None
  num_warps: int | None = None
  num_stages: int | None = None
  num_ctas: int = 1
  compute_capability: int | None = None
  enable_fp_fusion: bool = True
  input_output_aliases: Mapping[int, int] | None = None
  zeroed_outputs: Sequence[int] | Callable[..., Sequence[int]] = ()
  debug: bool = False
  serialized_metadata: bytes = b""
  vmap_method: str | None = None
  sharding_rule: Any = None
  has_side_effect: bool = False
  cost_estimate: Any = None
  # The array indices of the call's ``jax.Ref`` arguments (their values are
  # passed in their place); each gets an output aliased to it.
  ref_inputs: tuple[int, ...] = ()
  # Further Triton compiler options (``_backend_options.merge``'s extra).
  backend_options: Mapping[str, Any] | None = None
  # (position in args, _tensordesc.Info) of each host-side TMA descriptor,
  # whose array stands in args in its place.
  tensor_descriptors: tuple = ()


is_scalar = _types.is_scalar
pointer_type = _types.pointer_type


def _is_shape_dtype(x: Any) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype")


def flatten_out_shape(out_shape: Any, allow_empty: bool = False):
  """Flattens ``out_shape`` into (shape, dtype) pairs and its treedef.

  Args:
    out_shape: as given to the call.
    allow_empty: whether no outputs at all is legal (a call whose ``jax.Ref``
      arguments carry its results).
  """
  if out_shape is None:
    raise TypeError(
        "triton_call: `out_shape` (or `out_type`) is required: pass a"
        " jax.ShapeDtypeStruct, or any pytree of objects with .shape and"
        " .dtype, one per kernel output."
    )
  leaves, tree = jax.tree_util.tree_flatten_with_path(
      out_shape, is_leaf=_is_shape_dtype
  )
  if not leaves and not allow_empty:
    raise ValueError(
        f"triton_call: `out_shape` {out_shape!r} holds no outputs. A kernel"
        " call must produce at least one output, or mutate a jax.Ref"
        " argument (jax.new_ref(x)) in place."
    )
  flat = []
  for path, leaf in leaves:
    where = "out_shape" + jax.tree_util.keystr(path)
    if not _is_shape_dtype(leaf):
      raise TypeError(
          f"triton_call: {where} is {leaf!r} of type {type(leaf).__name__},"
          " which has no .shape and .dtype. Describe each output with"
          " jax.ShapeDtypeStruct(shape, dtype)."
      )
    dtype = _types.checked_dtype(leaf.dtype, where)
    if _types.pointer_type(dtype) is None:
      raise TypeError(
          f"triton_call: {where} has dtype {dtype.name}, which Triton kernels"
          f" cannot take. Supported dtypes: {', '.join(_types.SUPPORTED_DTYPES)}."
      )
    flat.append((_checked_shape(leaf.shape, where), dtype))
  return tuple(flat), tree


def _checked_shape(shape: Any, where: str) -> tuple[int, ...]:
  """``shape`` as a tuple of ints; an error for anything else.

  ``int(2.5)`` would silently make a smaller buffer than the kernel writes,
  and a negative size reaches XLA as an unreadable MLIR error.
  """
  try:
    dims = tuple(shape)
  except TypeError:
    raise TypeError(
        f"triton_call: {where} has shape {shape!r} of type"
        f" {type(shape).__name__}; a shape is a tuple of ints, e.g. (16,)."
    ) from None
  for axis, dim in enumerate(dims):
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, (bool, np.bool_)):
      raise TypeError(
          f"triton_call: {where} has shape {dims!r}, whose dimension {axis}"
          f" is {dim!r} of type {type(dim).__name__}; every dimension must be"
          " an int. Round it explicitly, e.g. with int(...) or triton.cdiv."
      )
    if dim < 0:
      raise ValueError(
          f"triton_call: {where} has shape {dims!r}, whose dimension {axis}"
          f" is {int(dim)}; dimensions must be at least 0."
      )
  return tuple(int(d) for d in dims)


def _classify_args(args: Sequence[Any]):
  """Splits positional args into ('array', index) and ('scalar', value)."""
  kinds = []
  n_arrays = 0
  for i, arg in enumerate(args):
    if _pytree_args.is_tuple(arg) and arg:
      leaves = []
      for path, leaf in _pytree_args.leaves_with_paths(arg):
        _pytree_args.check_leaf(i, path, leaf)
        kind, payload = _classify_args([leaf])[0][0]
        if kind == "array":
          payload = n_arrays
          n_arrays += 1
        leaves.append((path, kind, payload))
      kinds.append(("tuple", leaves))
    elif _types.is_scalar(arg):
      if _types.scalar_type(arg) is None:
        raise ValueError(
            f"triton_call: args[{i}] = {arg!r} does not fit in 64 bits, the"
            " widest integer a kernel parameter can take. Pass a value in"
            f" [{-(2**63)}, {2**64 - 1}], or split it across two parameters."
        )
      kinds.append(("scalar", arg))
    elif _is_shape_dtype(arg):
      dtype = _types.checked_dtype(arg.dtype, f"args[{i}]")
      if _types.pointer_type(dtype) is None:
        raise TypeError(
            f"triton_call: args[{i}] has shape {tuple(arg.shape)} and dtype"
            f" {dtype.name}, which Triton kernels cannot take. Supported:"
            f" {', '.join(_types.SUPPORTED_DTYPES)}."
            + _dtype_hint(dtype)
        )
      kinds.append(("array", n_arrays))
      n_arrays += 1
    else:
      raise TypeError(
          f"triton_call: args[{i}] = {arg!r} of type {type(arg).__name__} is"
          " neither an array nor a bool/int/float scalar. Pass jax.Arrays"
          " for pointer parameters and Python scalars for value parameters."
      )
  return kinds, n_arrays


def _typed_descriptors(operands, kinds, descriptors):
  """Array operands standing for TMA descriptors, typed as descriptors.

  A descriptor's operand keeps kind "array" (its array is the buffer
  passed), with Triton's ``tensordesc<...>`` type and its ``Info`` as value.
  """
  if not descriptors:
    return operands
  by_index = {kinds[i][1]: desc for i, desc in descriptors}
  return [dataclasses.replace(op, type=by_index[op.index].triton_type,
                              value=by_index[op.index])
          if op.kind == "array" and op.index in by_index else op
          for op in operands]


def is_descriptor(op: Operand) -> bool:
  """Whether ``op`` is a host-side TMA descriptor's array operand."""
  return op.kind == "array" and op.type.startswith("tensordesc")


def _dtype_hint(dtype: np.dtype) -> str:
  if dtype.kind == "c":
    return (
        " Pass the real and imaginary parts as two arrays (jnp.real(x),"
        " jnp.imag(x)), or view them as pairs of reals with"
        " jax.lax.bitcast_convert_type."
    )
  return ""


def binding_error(info, message: str) -> _errors.KernelBindingError:
  order = ", ".join(info.param_names)
  return _errors.KernelBindingError(
      f"triton_call: kernel {info.name!r}({order}): {message} Parameters are"
      " bound in order by the positional arguments, then one pointer per"
      " output in out_shape, then by name from the metaparams."
  )


def bind_positional(info, args, kinds, n_outputs, warn=True):
  """Binds positional args and outputs; returns operands and constexprs.

  ``warn``: whether to warn of deprecated scalars (a call read under both
  aliasing conventions warns once).
  """
  params = info.params
  if len(args) + n_outputs > len(params):
    extra = len(args) + n_outputs - len(params)
    raise binding_error(
        info,
        f"{len(args)} positional arguments and {n_outputs} outputs bind"
        f" {len(args) + n_outputs} parameters, but the kernel has only"
        f" {len(params)}: {extra} too many.",
    )
  operands, constexprs = [], {}
  for i, ((kind, payload), param) in enumerate(zip(kinds, params)):
    if kind == "tuple":
      if param.is_constexpr and any(k == "array" for _, k, _ in payload):
        raise binding_error(
            info, f"args[{i}] is a tuple holding arrays but binds"
            f" {param.name!r}, a tl.constexpr parameter, which takes"
            " compile-time values.")
      if param.is_constexpr:
        constexprs[param.name] = args[i]
      else:
        operands.extend(_tuple_operands(param, args[i], payload))
      continue
    if param.is_constexpr:
      if kind == "array":
        raise binding_error(
            info,
            f"args[{i}] is an array but binds {param.name!r}, a tl.constexpr"
            " parameter, which takes a compile-time scalar.",
        )
      constexprs[param.name] = payload
      continue
    if kind == "array":
      dtype = np.dtype(args[i].dtype)
      operands.append(
          Operand(param.name, "array", payload, None, _types.pointer_type(dtype))
      )
    else:
      _check_declared_scalar(info, i, param, payload)
      scalar_type = _scalar_type(info, i, param, payload, warn)
      operands.append(
          Operand(param.name, "scalar", -1,
                  _types.python_scalar(payload, scalar_type), scalar_type)
      )
  return operands, constexprs


def _tuple_operands(param, arg, leaves):
  """One operand per leaf of the tuple ``arg`` that binds ``param``."""
  values = dict(_pytree_args.leaves_with_paths(arg))
  operands = []
  for path, kind, payload in leaves:
    if kind == "array":
      operands.append(Operand(
          param.name, "array", payload, None,
          _types.pointer_type(values[path].dtype), path))
    else:
      scalar_type = _types.scalar_type(payload)
      operands.append(Operand(
          param.name, "scalar", -1,
          _types.python_scalar(payload, scalar_type), scalar_type, path))
  return operands


def _scalar_type(info, i, param, value, warn=True) -> str:
  """The type the scalar ``value`` of ``param`` is passed as.

  The parameter's annotation decides where it names a type jaxlib can carry,
  else the value does (``_types.scalar_type``: a float is fp32 where float32
  holds it, else fp64). A float32 must not overflow.
  """
  if warn and isinstance(value, np.float32):
    warnings.warn(
        f"triton_call: args[{i}] = np.float32({float(value)!r}) binds"
        f" parameter {param.name!r} of kernel {info.name!r}; passing"
        " np.float32 scalars is deprecated (as in jax-triton 0.4). Pass a"
        f" Python float, float({float(value)!r}), which is passed as a"
        " float32 where float32 holds it.", DeprecationWarning, stacklevel=8)
  scalar_type = (_types.annotated_scalar_type(param.annotation)
                 or _types.scalar_type(value))
  if scalar_type == "fp32" and _types.overflows_float32(value):
    raise ValueError(
        f"triton_call: args[{i}] = {float(value)!r} binds parameter"
        f" {param.name!r} of kernel {info.name!r}, declared"
        f" {param.annotation or 'fp32'}, and overflows a float32 (the"
        f" largest is {_types.FLOAT32_MAX!r}). Declare the parameter"
        f" `{param.name}: tl.float64` to pass a double, or scale the value.")
  return scalar_type


def _check_declared_scalar(info, i, param, value) -> None:
  """A scalar must fit the type its parameter declares (``n: tl.int32``)."""
  bounds = _types.declared_int_range(param.annotation)
  if bounds is None:
    return
  if not isinstance(value, (int, np.integer, bool, np.bool_)):
    raise TypeError(
        f"triton_call: args[{i}] = {value!r} of type {type(value).__name__}"
        f" binds parameter {param.name!r} of kernel {info.name!r}, declared"
        f" {param.annotation}; pass an int (e.g. int({value!r})), or change"
        " the kernel's annotation."
    )
  low, high = bounds
  if not low <= int(value) <= high:
    raise ValueError(
        f"triton_call: args[{i}] = {int(value)} binds parameter"
        f" {param.name!r} of kernel {info.name!r}, declared"
        f" {param.annotation}, which holds {low} to {high}. Pass a value in"
        " that range, or declare the parameter wider (e.g. tl.int64)."
    )


def bind_outputs(info, n_args, out_shapes):
  operands = []
  for k, (_, dtype) in enumerate(out_shapes):
    param = info.params[n_args + k]
    if param.is_constexpr:
      raise binding_error(
          info,
          f"output {k} binds {param.name!r}, a tl.constexpr parameter. Pass"
          " fewer outputs, or pass the inputs that come before it.",
      )
    operands.append(
        Operand(param.name, "output", k, None, _types.pointer_type(dtype))
    )
  return operands


def check_metaparams(info, metaparams, positional_names):
  for key, value in metaparams.items():
    if key not in info.param_by_name:
      close = difflib.get_close_matches(key, info.param_names, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise binding_error(
          info, f"metaparam {key}={value!r} names no parameter of the kernel.{hint}"
      )
    if key in positional_names:
      raise binding_error(
          info,
          f"metaparam {key}={value!r} binds {key!r}, which the positional"
          " arguments or outputs already bind.",
      )
    try:
      hash(value)
    except TypeError:
      raise TypeError(
          f"triton_call: metaparam {key}={value!r} is not hashable. Metaparams"
          " are compile-time constants: pass ints, floats, bools, strings or"
          " Triton dtypes."
      ) from None


def describe_bound(info, operands, n_args, names):
  """What binds each bound parameter, e.g. "n=output 0, BLOCK=by name".

  Shown with a missing parameter: a forgotten argument usually shifts an
  output onto the parameter it should have bound, and this makes it visible.
  """
  outputs = {op.name: op.index for op in operands if op.kind == "output"}
  parts = []
  for i, param in enumerate(info.params):
    if i < n_args:
      parts.append(f"{param.name}=args[{i}]")
    elif param.name in outputs:
      parts.append(f"{param.name}=output {outputs[param.name]}")
    elif param.name in names:
      parts.append(f"{param.name}=by name")
  return ", ".join(parts)


def _check_complete(info, positional_names, config, operands, n_args):
  names = [k for k, _ in config.kwargs]
  bound = describe_bound(info, operands, n_args, names)
  missing, twice = _kernel.missing_and_extra(info, positional_names, names)
  unknown = [k for k, _ in config.kwargs if k not in info.param_by_name]
  if unknown:
    raise binding_error(
        info, f"autotuning config ({config.label}) sets {unknown}, which are"
        " not parameters of the kernel.")
  if twice:
    raise binding_error(
        info, f"{twice} are bound twice (config: {config.label}).")
  if missing:
    raise binding_error(
        info,
        f"parameters {missing} are not bound by anything (bound: {bound}).",
    )


def _named_args(arrays, operands, out_shapes, constexprs):
  """Every bound parameter by name, arrays as shape/dtype structs."""
  leaves: dict[str, list] = {}
  for op in operands:
    if op.kind == "array":
      arg = arrays[op.index]
      value = jax.ShapeDtypeStruct(arg.shape, arg.dtype)
    elif op.kind == "output":
      shape, dtype = out_shapes[op.index]
      value = jax.ShapeDtypeStruct(shape, dtype)
    else:
      value = op.value
    leaves.setdefault(op.name, []).append((op.path, value))
  named = {name: _pytree_args.nest(items) for name, items in leaves.items()}
  named.update(constexprs)
  return named


def _zeroed(zeroed_outputs, kwargs, n_outputs, where):
  zeroed = (_errors.call_user(zeroed_outputs, "the zeroed_outputs callable",
                              dict(kwargs))
            if callable(zeroed_outputs) else zeroed_outputs)
  try:
    zeroed = list(zeroed)
  except TypeError:
    raise TypeError(
        f"triton_call: zeroed_outputs is {zeroed!r} of type"
        f" {type(zeroed).__name__}; pass a sequence of output indices such"
        f" as [0], or a callable of the metaparams returning one{where}."
    ) from None
  result = []
  for index in zeroed:
    if not isinstance(index, (int, np.integer)) or not 0 <= index < n_outputs:
      raise ValueError(
          f"triton_call: zeroed_outputs entry {index!r} is not an output"
          f" index; the call has {n_outputs} outputs, indices 0 to"
          f" {n_outputs - 1}{where}."
      )
    result.append(int(index))
  return tuple(sorted(set(result)))


def _reset_to_zero(info, operands, aliases) -> tuple[int, ...]:
  """The outputs an autotuner's ``reset_to_zero`` names, as output indices."""
  names = _kernel.reset_to_zero_names(info)
  by_name = {op.name: op for op in operands}
  aliased = dict(aliases)
  outputs = []
  for name in names:
    op = by_name.get(name)
    if op is not None and op.kind == "output":
      outputs.append(op.index)
    elif op is not None and op.kind == "array" and op.index in aliased:
      outputs.append(aliased[op.index])
    else:
      what = ("not a pointer parameter bound by this call" if op is None
              or op.kind == "scalar" else
              f"input array {op.index}, which no output aliases")
      raise ValueError(
          f"triton_call: kernel {info.name!r} is autotuned with"
          f" reset_to_zero={names!r}, and {name!r} is {what}. jt_dist zeroes"
          " outputs, and inputs aliased to an output through"
          " input_output_aliases, before every launch; an input JAX owns"
          " cannot be zeroed in place. Alias it to an output or drop it"
          " from reset_to_zero.")
  return tuple(outputs)


def check_aliases(aliases, array_shapes, out_shapes):
  if not aliases:
    return ()
  n_in, n_out = len(array_shapes), len(out_shapes)
  result = []
  for i, o in dict(aliases).items():
    if not 0 <= i < n_in:
      raise ValueError(
          f"triton_call: input_output_aliases key {i} is not an array"
          f" argument index; the call has {n_in} array arguments, indices 0"
          f" to {n_in - 1} (scalars are not counted)."
      )
    if not 0 <= o < n_out:
      raise ValueError(
          f"triton_call: input_output_aliases[{i}] = {o} is not an output"
          f" index; the call has {n_out} outputs, indices 0 to {n_out - 1}."
      )
    if tuple(array_shapes[i][0]) != out_shapes[o][0] or np.dtype(
        array_shapes[i][1]) != out_shapes[o][1]:
      raise ValueError(
          f"triton_call: input_output_aliases[{i}] = {o} aliases array"
          f" argument {i} with shape {tuple(array_shapes[i][0])} and dtype"
          f" {np.dtype(array_shapes[i][1]).name} to output {o} with shape"
          f" {out_shapes[o][0]} and dtype {out_shapes[o][1].name}. Aliased"
          " buffers must agree in shape and dtype."
      )
    result.append((int(i), int(o)))
  if len({o for _, o in result}) != len(result):
    raise ValueError(
        f"triton_call: input_output_aliases {dict(aliases)!r} maps two"
        " inputs to one output; each output can alias at most one input."
    )
  return tuple(sorted(result))


def _with_constexpr_defaults(info, config):
  """Adds the defaults of constexpr parameters the config leaves unbound.

  A launch then states every constexpr it is compiled with, so that the grid,
  zeroed_outputs and the compiler all see the same values.
  """
  bound = {k for k, _ in config.kwargs}
  extra = tuple((p.name, p.default) for p in info.params
                if p.is_constexpr and p.has_default and p.name not in bound)
  if not extra:
    return config
  return dataclasses.replace(config, kwargs=config.kwargs + extra)


def bind_call(args, kernel, out_shape, grid, options: CallOptions, metaparams):
  """Checks a call and builds its static ``CallSpec``.

  Returns:
    ``(array_args, spec, out_tree)``.
  """
  info = _kernel.kernel_info(kernel)
  _options.check(options)
  out_shapes, out_tree = flatten_out_shape(
      out_shape, allow_empty=bool(options.ref_inputs))
  kinds, _ = _classify_args(args)
  operands, constexprs, aliases = _conventions.bind(
      info, args, kinds, out_shapes, metaparams, options.input_output_aliases)
  operands = _typed_descriptors(operands, kinds, options.tensor_descriptors)
  constexprs.update(metaparams)
  runtime_names = list(dict.fromkeys(op.name for op in operands))
  arrays = _pytree_args.array_leaves(args)
  named = _named_args(arrays, operands, out_shapes, constexprs)
  # Triton's launcher shows heuristics and the grid every parameter,
  # unbound ones with defaults included; explicit values take precedence.
  defaults = {p.name: p.default for p in info.params
              if p.has_default and p.name not in named}
  named = {**defaults, **named}
  configs = _kernel.expand_configs(
      info, constexprs, named, options.num_warps, options.num_stages,
      options.num_ctas)
  reset = _reset_to_zero(info, operands, aliases)
  launches = []
  for config in configs:
    _check_complete(info, runtime_names, config, operands, len(args))
    config = _with_constexpr_defaults(info, config)
    where = f" (config: {config.label})" if info.layers else ""
    kwargs = dict(config.kwargs)
    grid_named = {**named, **kwargs}
    launches.append(Launch(
        config=config,
        grid=_grid.evaluate_grid(grid, grid_named, where),
        zeroed_outputs=tuple(sorted(set(reset + _zeroed(
            options.zeroed_outputs, kwargs, len(out_shapes), where)))),
    ))
  refs = options.ref_inputs
  spec = CallSpec(
      kernel=kernel,
      name=options.name,
      operands=tuple(operands),
      out_shapes=out_shapes + tuple((arrays[i].shape, np.dtype(arrays[i].dtype))
                                    for i in refs),
      launches=tuple(launches),
      input_output_aliases=aliases + tuple(
          (i, len(out_shapes) + k) for k, i in enumerate(refs)),
      compute_capability=options.compute_capability,
      enable_fp_fusion=options.enable_fp_fusion,
      debug=options.debug,
      serialized_metadata=options.serialized_metadata,
      custom_call_target_name=options.custom_call_target_name,
      vmap_method=options.vmap_method,
      sharding_rule=options.sharding_rule,
      has_side_effect=options.has_side_effect,
      cost_estimate=_options.cost_items(options.cost_estimate),
      ref_outputs=len(refs),
      backend_options=tuple(sorted((options.backend_options or {}).items())),
  )
  return arrays, spec, out_tree


def with_scalar_values(spec: CallSpec, values: Sequence[Any]) -> CallSpec:
  """``spec`` with its scalar operands' values replaced, in order."""
  it = iter(values)
  operands = tuple(
      dataclasses.replace(op, value=_types.python_scalar(next(it)))
      if op.kind == "scalar" else op for op in spec.operands)
  return dataclasses.replace(spec, operands=operands)
