"""A call's arguments: what each is, and which parameter it binds.

A tuple argument binds a tuple parameter, each leaf one operand named by its
parameter and path (``yz[1]``); arrays are numbered in flattened order with the
others, as ``input_output_aliases`` keys count them. A keyword naming a
non-``constexpr`` parameter is an operand (jax-triton 0.4's convention), moved
among the positional arguments before anything else sees the call. ``None``
binds any parameter as a compile-time ``None``, as in Triton's launcher, so
that ``if bias_ptr is not None:`` is decided when compiling.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from typing import Any, Sequence

import jax
import numpy as np

from jt_dist import _errors
from jt_dist._core import kernel as _kernel
from jt_dist._core import options as _options
from jt_dist._core import types as _types
from jt_dist._core import wrapper as _wrapper


def _set_by_layers(info, name: str) -> bool:
  """Whether an autotuner or heuristic may set constexpr ``name``."""
  return any(name in getattr(layer, "values", {})
             or any(name in getattr(c, "kwargs", {})
                    for c in getattr(layer, "configs", ()))
             for layer in info.layers)


def launch_option_params(kernel: Any, kwargs: dict[str, Any]) -> dict:
  """The launch options in ``kwargs`` that also name a kernel parameter.

  Triton's launcher binds such a keyword to the parameter and also takes it
  as the option (tutorial 02's ``num_stages: tl.constexpr``).
  """
  if not (both := [name for name in _options.NAMED if name in kwargs]):
    return {}
  try:
    params = _kernel.kernel_info(kernel).param_by_name
  except TypeError:
    return {}  # bind_call reports what the kernel is.
  return {name: kwargs[name] for name in both if name in params}


def merge_keywords(kernel: Any, args: Sequence[Any],
                   metaparams: dict[str, Any]):
  """``(kernel, args, metaparams)`` with keyword operands moved into args,
  with constexprs between them, up to the first parameter no keyword binds
  (usually an output's). An operand after it (an input after an output, as
  in PyTorch kernels) makes ``kernel`` a wrapper taking the keyword operands
  right after the args: each is then bound as its parameter's type, a
  scalar as a run-time value. Only a ``None`` stays by name."""
  try:
    info = _kernel.kernel_info(kernel)
  except TypeError:
    return kernel, args, metaparams  # bind_call reports what the kernel is.
  if not (names := [name for name in metaparams if name in info.param_by_name
                    and not info.param_by_name[name].is_constexpr]):
    return kernel, args, metaparams
  for name in names:
    if (position := info.param_names.index(name)) < len(args):
      raise _errors.KernelBindingError(
          f"triton_call: kernel {info.name!r}({', '.join(info.param_names)}):"
          f" metaparam {name}={_short(metaparams[name])} binds {name!r} (as a"
          f" keyword operand), which args[{position}] already binds: got"
          f" multiple values for argument {name!r}. Pass it once,"
          " positionally or by name.")
  merged, rest, left = _walk(info, args, metaparams, names)
  if any(rest[name] is not None for name in left):
    # An operand after an output: a wrapper takes the keyword operands
    # first, so that each is passed as its parameter's type.
    moved = sorted(names, key=info.param_names.index)
    order = (*info.param_names[:len(args)], *moved,
             *(n for n in info.param_names[len(args):] if n not in moved))
    kernel = _wrapper.reordered(kernel, order)
    merged, rest, left = _walk(_kernel.kernel_info(kernel), args, metaparams,
                               names)
  return kernel, merged, rest


def _walk(info, args, metaparams, names):
  """``(args, the rest, operands left by name)``."""
  args, rest, left = list(args), dict(metaparams), set(names)
  for param in info.params[len(args):]:
    if not left:
      break
    if param.name in left or (param.is_constexpr and param.name in rest):
      args.append(rest.pop(param.name))
      left.discard(param.name)
    elif (param.is_constexpr and param.has_default
          and not _set_by_layers(info, param.name)):
      args.append(param.default)
    else:
      break
  return tuple(args), rest, left


def _short(value: Any) -> str:
  if _types.is_scalar(value) or not hasattr(value, "shape"):
    return repr(value)
  return f"<array of shape {tuple(value.shape)}, dtype {value.dtype}>"


def canonical_numpy(args: Sequence[Any]) -> list[Any]:
  """``args`` with NumPy arrays in the dtypes ``jax.jit`` gives them: the
  call is bound for what the kernel receives."""
  def canonical(a):
    if type(a) is not np.ndarray:  # pylint: disable=unidiomatic-typecheck
      return a
    return a.astype(jax.dtypes.canonicalize_dtype(a.dtype), copy=False)

  return [jax.tree.map(canonical, a) if isinstance(a, tuple) else canonical(a)
          for a in args]


def classify_args(args: Sequence[Any]) -> tuple[list, list]:
  """``(kinds, arrays)``: each arg's ``(kind, payload)`` (an array's index
  among the arrays, a scalar's value, or a tuple's ``[(path, kind, payload)
  per leaf]``), and the array operands, tuples' leaves in order."""
  kinds, arrays = [], []
  for i, arg in enumerate(args):
    if is_tuple(arg) and arg:
      kinds.append(("tuple", [
          (path, *_classify(where(i, path), leaf, arrays,
                            in_tuple=True))
          for path, leaf in leaves_with_paths(arg)]))
    else:
      kinds.append(_classify(f"args[{i}]", arg, arrays))
  return kinds, arrays


def _classify(where: str, arg: Any, arrays, in_tuple=False):
  if arg is None and not in_tuple:
    return "none", None
  if _types.is_scalar(arg):
    if _types.scalar_type(arg) is None:
      raise ValueError(
          f"triton_call: {where} = {arg!r} does not fit in 64 bits, the"
          " widest integer a kernel parameter can take. Pass a value in"
          f" [{-(2**63)}, {2**64 - 1}], or split it across two parameters.")
    return "scalar", arg
  if _types.is_shape_dtype(arg):
    _types.refuse_symbolic(tuple(arg.shape), f"{where}'s shape")
    _types.pointer_dtype(arg.dtype, where, arg.shape)
    arrays.append(arg)
    return "array", len(arrays) - 1
  if in_tuple:
    raise TypeError(
        f"triton_call: {where} = {arg!r} of type {type(arg).__name__} is"
        " neither an array nor a bool/int/float scalar. A tuple operand holds"
        " arrays, scalars and tuples of them.")
  _types.refuse_symbolic(arg, where)
  raise TypeError(
      f"triton_call: {where} = {arg!r} of type {type(arg).__name__} is"
      " neither an array nor a bool/int/float scalar. Pass jax.Arrays"
      " for pointer parameters and Python scalars for value parameters.")


def binding_error(info, message: str) -> _errors.KernelBindingError:
  order = ", ".join(info.param_names)
  return _errors.KernelBindingError(
      f"triton_call: kernel {info.name!r}({order}): {message} Parameters are"
      " bound in order by the positional arguments, then one pointer per"
      " output in out_shape, then by name from the metaparams.")


def bind_positional(info, args, kinds, arrays, n_outputs, warn=True):
  """``(operands, constexprs)`` the args bind; ``n_outputs`` follow them."""
  params = info.params
  if (extra := len(args) + n_outputs - len(params)) > 0:
    raise binding_error(
        info,
        f"{len(args)} positional arguments and {n_outputs} outputs bind"
        f" {len(args) + n_outputs} parameters, but the kernel has only"
        f" {len(params)}: {extra} too many.")
  operands, constexprs = [], {}
  for i, ((kind, payload), param) in enumerate(zip(kinds, params)):
    if kind == "none" or param.is_constexpr:
      if kind == "array" or (
          kind == "tuple" and any(k == "array" for _, k, _ in payload)):
        what, takes = (("a tuple holding arrays", "compile-time values")
                       if kind == "tuple" else
                       ("an array", "a compile-time scalar"))
        raise binding_error(
            info, f"args[{i}] is {what} but binds {param.name!r}, a"
            f" tl.constexpr parameter, which takes {takes}.")
      constexprs[param.name] = args[i]
    else:
      leaves = payload if kind == "tuple" else [((), kind, payload)]
      for path, leaf_kind, value in leaves:
        if leaf_kind == "array":
          operands.append(_kernel.Operand(
              param.name, "array", value, None,
              _types.pointer_type(arrays[value].dtype), path))
          continue
        # A tuple's scalars are typed by their values alone.
        scalar_type = (_types.scalar_type(value) if path
                       else _scalar_type(info, i, param, value, warn))
        operands.append(_kernel.Operand(
            param.name, "scalar", -1,
            _types.python_scalar(value, scalar_type), scalar_type, path))
  return operands, constexprs


def _scalar_type(info, i, param, value, warn) -> str:
  """``value``'s type for ``param``: its annotation's, else the value's.
  A value must fit the type its parameter declares (``n: tl.int32``)."""
  if (bounds := _types.INT_RANGES.get(param.annotation)) is not None:
    if not isinstance(value, (int, np.integer, bool, np.bool_)):
      raise TypeError(
          f"triton_call: args[{i}] = {value!r} of type"
          f" {type(value).__name__} binds parameter {param.name!r} of kernel"
          f" {info.name!r}, declared {param.annotation}; pass an int (e.g."
          f" int({value!r})), or change the kernel's annotation.")
    low, high = bounds
    if not low <= int(value) <= high:
      raise ValueError(
          f"triton_call: args[{i}] = {int(value)} binds parameter"
          f" {param.name!r} of kernel {info.name!r}, declared"
          f" {param.annotation}, which holds {low} to {high}. Pass a value in"
          " that range, or declare the parameter wider (e.g. tl.int64).")
  if warn and isinstance(value, np.float32):
    warnings.warn(
        f"triton_call: args[{i}] = np.float32({float(value)!r}) binds"
        f" parameter {param.name!r} of kernel {info.name!r}; passing"
        " np.float32 scalars is deprecated (as in jax-triton 0.4). Pass a"
        f" Python float, float({float(value)!r}), which is passed as a"
        " float32 where float32 holds it.", DeprecationWarning, stacklevel=8)
  scalar_type = (_types.ANNOTATED_TYPES.get(param.annotation)
                 or _types.scalar_type(value))
  if scalar_type == "fp32" and _types.overflows_float32(value):
    raise ValueError(
        f"triton_call: args[{i}] = {float(value)!r} binds parameter"
        f" {param.name!r} of kernel {info.name!r}, declared"
        f" {param.annotation or 'fp32'}, and overflows a float32 (the"
        f" largest is {_types.FLOAT32_MAX!r}). Declare the parameter"
        f" `{param.name}: tl.float64` to pass a double, or scale the value.")
  return scalar_type


def check_metaparams(info, metaparams, positional_names):
  for key, value in metaparams.items():
    if key not in info.param_by_name:
      close = difflib.get_close_matches(key, info.param_names, n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise binding_error(
          info,
          f"metaparam {key}={value!r} names no parameter of the kernel.{hint}")
    if key in positional_names:
      raise binding_error(
          info, f"metaparam {key}={value!r} binds {key!r}, which the"
          " positional arguments or outputs already bind.")
    try:
      hash(value)
    except TypeError:
      raise TypeError(
          f"triton_call: metaparam {key}={value!r} is not hashable. Metaparams"
          " are compile-time constants: pass ints, floats, bools, strings or"
          " Triton dtypes.") from None


def check_bound(info, operands, n_args, names, constexprs=True) -> None:
  """Raises for parameters without a default (``constexprs``: constexpr ones
  too) that neither ``operands`` nor ``names`` bind, showing what binds the
  others: a forgotten argument usually shifts an output onto the next one."""
  bound = {*names, *(op.name for op in operands)}
  if not (missing := [p.name for p in info.params if not p.has_default
                      and (constexprs or not p.is_constexpr)
                      and p.name not in bound]):
    return
  outputs = {op.name: op.index for op in operands if op.kind == "output"}
  parts = []
  for i, param in enumerate(info.params):
    if i < n_args:
      parts.append(f"{param.name}=args[{i}]")
    elif param.name in outputs:
      parts.append(f"{param.name}=output {outputs[param.name]}")
    elif param.name in names:
      parts.append(f"{param.name}=by name")
  raise binding_error(info, f"parameters {missing} are not bound by anything"
                      f" (bound: {', '.join(parts)}).")


def is_tuple(arg: Any) -> bool:
  return type(arg) is tuple  # pylint: disable=unidiomatic-typecheck


def leaves_with_paths(arg: Any, path: tuple[int, ...] = ()):
  """``(path, leaf)`` of each leaf of a nested tuple, in order."""
  if not is_tuple(arg):
    return [(path, arg)]
  return [leaf for k, item in enumerate(arg)
          for leaf in leaves_with_paths(item, path + (k,))]


def where(i: int, path: tuple[int, ...]) -> str:
  return _kernel.label(f"args[{i}]", path)


def nest(items: Sequence[tuple[tuple[int, ...], Any]]) -> Any:
  """The nested tuple whose leaves at ``path`` are ``value``."""
  if len(items) == 1 and not items[0][0]:
    return items[0][1]
  groups: dict[int, list] = {}
  for path, value in items:
    groups.setdefault(path[0], []).append((path[1:], value))
  return tuple(nest(groups[k]) for k in sorted(groups))


@dataclasses.dataclass(frozen=True)
class FlatArgs:
  """A call's positional arguments with tuple operands spread into leaves;
  another argument (or an empty tuple, refused later) is one leaf."""

  leaves: tuple  # Every leaf, in order.
  # Per leaf, ``(argument index, path in its tuple)``.
  places: tuple[tuple[int, tuple[int, ...]], ...]
  n_args: int  # The number of positional arguments.

  @property
  def names(self) -> list[str]:
    """Each leaf as messages name it: ``args[1]``, ``args[1][0]``."""
    return [where(i, path) for i, path in self.places]

  def rebuild(self, leaves: Sequence[Any]) -> list[Any]:
    """The positional arguments with ``leaves`` in the leaves' places."""
    groups: list[list] = [[] for _ in range(self.n_args)]
    for (i, path), leaf in zip(self.places, leaves):
      groups[i].append((path, leaf))
    return [nest(items) for items in groups]


def flatten(args: Sequence[Any]) -> FlatArgs:
  leaves, places = [], []
  for i, arg in enumerate(args):
    items = [((), arg)] if _has_empty(arg) else leaves_with_paths(arg)
    for path, leaf in items:
      leaves.append(leaf)
      places.append((i, path))
  return FlatArgs(tuple(leaves), tuple(places), len(args))


def _has_empty(arg: Any) -> bool:
  """Whether a (nested) tuple is or holds an empty tuple."""
  return is_tuple(arg) and (not arg or any(_has_empty(a) for a in arg))
