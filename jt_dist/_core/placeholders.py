"""Placeholders for scalar arguments: a ``shard_size`` is an array's size
where the kernel runs, resolved before binding; a ``runtime_scalar`` is a
value the static spec cannot hold (a traced one), passed as a 0-d array that
a wrapper kernel loads and passes on to the parameter.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jt_dist import _errors
from jt_dist._core import kernel as _kernel
from jt_dist._core import types as _types
from jt_dist._core import wrapper as _wrapper


@dataclasses.dataclass(frozen=True)
class ShardSize:
  """Stands for the size of a positional array argument, where the kernel runs.

  Inside ``sharded_triton_call`` (or any ``shard_map``) the argument is the
  shard, so the value is shard-local; in a plain ``triton_call`` it is the
  array's own size. Create it with ``jt_dist.shard_size``.
  """

  arg_index: int
  axis: int | None = None

  def resolve(self, args: Sequence[Any], where: str) -> int:
    """The size this placeholder stands for, given the call's arguments."""
    if not 0 <= self.arg_index < len(args):
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}], but the call"
          f" has {len(args)} positional arguments (indices 0 to"
          f" {len(args) - 1}). Use the index of an array argument.")
    target = args[self.arg_index]
    if type(target) is tuple:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}], a tuple"
          " operand, which has no size of its own. Point it at an array"
          " argument: pass the array whose size you need as a positional"
          " argument of its own, or give the size as a plain int.")
    if _types.is_scalar(target) or not hasattr(target, "shape"):
      raise ValueError(
          f"{where} = {self!r} points at args[{self.arg_index}] = {target!r},"
          " a scalar, which has no size. Point it at an array argument.")
    shape = tuple(target.shape)
    if self.axis is None:
      return math.prod(shape)
    if not -len(shape) <= self.axis < len(shape):
      raise ValueError(
          f"{where} = {self!r}: args[{self.arg_index}] has shape {shape}"
          f" (rank {len(shape)}), so axis={self.axis} is out of range.")
    return shape[self.axis]


def shard_size(arg_index: int, axis: int | None = None) -> ShardSize:
  """A placeholder for the shard-local size of a positional array argument.

  Pass it as a positional scalar argument or as a metaparam of
  ``triton_call`` or ``sharded_triton_call``. It is resolved where the kernel
  runs, so the kernel and a grid callable both see the local value.

  Args:
    arg_index: the index of the array among the call's positional arguments.
    axis: a dimension of that array, or None for its total element count.

  Returns:
    The placeholder.

  Raises:
    TypeError: ``arg_index`` or ``axis`` is not an int.
  """
  for name, value in (("arg_index", arg_index), ("axis", axis)):
    if value is not None and (not isinstance(value, int)
                              or isinstance(value, bool)):
      raise TypeError(
          f"shard_size: {name}={value!r} of type {type(value).__name__} must"
          " be an int.")
  if arg_index is None:
    raise TypeError("shard_size: arg_index is required (an int).")
  return ShardSize(arg_index, axis)


def resolve_sizes(args: Sequence[Any], metaparams: Mapping[str, Any]):
  """Args (a list) and metaparams with each ``ShardSize`` (tuple leaves of
  args too) resolved."""
  new_args = [_resolved(a, args, f"triton_call: args[{i}]")
              for i, a in enumerate(args)]
  return new_args, {k: v.resolve(args, f"triton_call: metaparam {k}")
                    if isinstance(v, ShardSize) else v
                    for k, v in metaparams.items()}


def _resolved(arg: Any, args: Sequence[Any], where: str) -> Any:
  if type(arg) is tuple:  # pylint: disable=unidiomatic-typecheck
    return tuple(_resolved(a, args, f"{where}[{k}]")
                 for k, a in enumerate(arg))
  return arg.resolve(args, where) if isinstance(arg, ShardSize) else arg


# A scalar's dtype by its ``_types.scalar_type``; else int64.
SCALAR_DTYPES = {"i1": np.dtype(np.bool_), "i32": np.dtype(np.int32),
                 "fp32": np.dtype(np.float32), "fp64": np.dtype(np.float64)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(eq=False, repr=False, slots=True)
class RuntimeScalar:
  """A value for a scalar parameter, passed at run time.

  Made by ``jt_dist.runtime_scalar``. A pytree whose one leaf is the value,
  so that ``jax.jit``, ``jax.vmap`` and ``jax.shard_map`` trace it.

  Attributes:
    value: a 0-d array (traced or not), or a Python or NumPy scalar.
    dtype: the NumPy dtype the kernel receives it as.
    divisibility: what the compiler may assume the value is a multiple of
      (1, or 16 for an int known to be one).
  """

  value: Any
  dtype: np.dtype = dataclasses.field(metadata={"static": True})
  divisibility: int = dataclasses.field(default=1, metadata={"static": True})

  def __post_init__(self):
    self.dtype = np.dtype(self.dtype)

  def __repr__(self) -> str:
    return f"jt_dist.runtime_scalar({self.value!r}, dtype={self.dtype.name})"


def runtime_scalar(x: Any, dtype: Any = None) -> RuntimeScalar:
  """Passes ``x`` to a kernel's scalar parameter by value, at run time.

  A Python scalar bound to a scalar parameter is compiled into the call;
  a 0-d array binds a pointer parameter, as in jax-triton. Wrapped by
  ``runtime_scalar``, either reaches a scalar parameter as a value known
  only when the kernel runs: inside ``jax.jit`` a seed computed from a step
  counter, or a new learning rate at every eager step, compiles nothing.
  Positionally or by keyword, in any call form::

      @jax.jit
      def step(x, step_count):
        seed = jt_dist.runtime_scalar(step_count * 7919)
        return jt_dist.triton_call(x, seed, x.size, kernel=dropout_kernel,
                                   out_shape=x, grid=(8,), BLOCK=128)

  The kernel reads the parameter as any scalar (``tl.rand(seed, offsets)``,
  ``x * scale``). It gets the value through a generated wrapper kernel that
  loads it from a one-element buffer; on GPUs Triton inlines the kernel
  into the wrapper, so only that one load is added. Under ``jax.vmap`` each
  batch element gets its own value.

  Args:
    x: a 0-d array (a ``jax.Array``, a tracer, a NumPy array), or a Python
      or NumPy scalar.
    dtype: the dtype the kernel receives: by default ``x``'s own, and for a
      Python scalar the one ``jax.numpy.asarray`` gives it (int32, float32
      or bool without ``jax_enable_x64``).

  Returns:
    A ``RuntimeScalar`` to pass where the value would go.

  Raises:
    ValueError: ``x`` is an array with elements other than one, or a
      Python int or float that its dtype cannot hold.
    TypeError: ``x`` is neither an array nor a scalar, or its dtype is one
      a kernel cannot take.
  """
  if isinstance(x, RuntimeScalar):
    return x if dtype is None else RuntimeScalar(x.value, dtype)
  if _types.is_shape_dtype(x):
    if tuple(x.shape) != ():
      raise ValueError(
          f"jt_dist.runtime_scalar: got an array of shape {tuple(x.shape)};"
          " it takes one value: a 0-d array or a scalar. Pass x[i] or"
          " x.reshape(()) for a one-element array.")
    chosen = x.dtype if dtype is None else dtype
  elif _types.is_scalar(x):
    # As jax.numpy.asarray types it, widened where the value needs it.
    chosen = dtype if dtype is not None else SCALAR_DTYPES.get(
        _types.scalar_type(x), np.int64)
  else:
    raise TypeError(
        f"jt_dist.runtime_scalar: got {x!r} of type {type(x).__name__}; it"
        " takes a 0-d array or a bool, int or float scalar.")
  chosen = np.dtype(jax.dtypes.canonicalize_dtype(chosen))
  _types.pointer_dtype(chosen, "jt_dist.runtime_scalar's value")
  if _types.is_scalar(x) and not isinstance(x, (bool, np.bool_)):
    _check_fits(x, chosen)
  return RuntimeScalar(x, chosen)


def _check_fits(x, dtype: np.dtype) -> None:
  if dtype.kind in "iu":
    info = np.iinfo(dtype)
    if not isinstance(x, (int, np.integer)) or not info.min <= x <= info.max:
      raise ValueError(
          f"jt_dist.runtime_scalar: {x!r} does not fit {dtype.name}"
          f" ({info.min} to {info.max}). Pass an int in that range, or a"
          " wider dtype= (64-bit types need jax_enable_x64).")
  elif dtype == np.float32 and _types.overflows_float32(x):
    raise ValueError(
        f"jt_dist.runtime_scalar: {x!r} overflows a float32. Scale the"
        " value, or pass dtype=jnp.float64 (with jax_enable_x64).")


def is_runtime_scalar(x: Any) -> bool:
  return type(x) is RuntimeScalar  # pylint: disable=unidiomatic-typecheck


def bind_runtime_scalars(kernel: Any, args: Sequence[Any],
                         metaparams: dict[str, Any]):
  """``(kernel, args)`` with runtime scalars as 0-d arrays the kernel loads."""
  for name, value in metaparams.items():
    if is_runtime_scalar(value):
      raise _errors.KernelBindingError(
          f"triton_call: metaparam {name}={value!r} binds {name!r}, a"
          " tl.constexpr parameter (or a name no parameter has), whose value"
          " the compiler needs. Pass the value itself, or drop tl.constexpr"
          " from the parameter to take it at run time.")
  positions = [i for i, a in enumerate(args) if is_runtime_scalar(a)]
  if not positions:
    return kernel, args
  info = _kernel.kernel_info(kernel)
  args, loaded = list(args), []
  for i in positions:
    if i >= len(info.params):  # Binding reports the extra arguments.
      args[i] = args[i].value
      continue
    param = info.params[i]
    if param.is_constexpr:
      raise _errors.KernelBindingError(
          f"triton_call: kernel {info.name!r}: args[{i}] = {args[i]!r} binds"
          f" {param.name!r}, a tl.constexpr parameter, whose value the"
          " compiler needs. Pass the value itself, or drop tl.constexpr from"
          " the parameter to take it at run time.")
    loaded.append((param.name, args[i].divisibility))
    args[i] = jax.numpy.asarray(args[i].value, args[i].dtype)
  kernel = _wrapper.reordered(kernel, info.param_names, tuple(loaded))
  return kernel, tuple(args)
