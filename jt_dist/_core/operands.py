"""Kernel operands passed as keyword arguments (jax-triton 0.4's convention).

A keyword naming a non-``constexpr`` parameter is an operand; it is moved
into the positional arguments before anything else sees the call.
"""

from __future__ import annotations

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
  both = [name for name in _options.NAMED if name in kwargs]
  if not both:
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
  names = [name for name in metaparams if name in info.param_by_name
           and not info.param_by_name[name].is_constexpr]
  if not names:
    return kernel, args, metaparams
  for name in names:
    position = info.param_names.index(name)
    if position < len(args):
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
    if param.name in left:
      args.append(rest.pop(param.name))
      left.discard(param.name)
    elif param.is_constexpr and param.name in rest:
      args.append(rest.pop(param.name))
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
    dtype = jax.dtypes.canonicalize_dtype(a.dtype)
    return a if dtype == a.dtype else a.astype(dtype)

  return [jax.tree.map(canonical, a) if isinstance(a, tuple) else canonical(a)
          for a in args]
