"""Outputs of a kernel call: ``out_shape``, aliases and zeroed outputs.

Each output binds one pointer parameter after the inputs (unless an aliased
input is its buffer, under jax-triton 0.4's convention); these checks run
before tracing, so that mistakes surface at the caller's line.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import call_spec as _call_spec
from jt_dist._core import positional as _positional
from jt_dist._core import types as _types


def flatten_out_shape(out_shape: Any, allow_empty: bool = False):
  """Flattens ``out_shape`` into (shape, dtype) pairs and its treedef.

  ``allow_empty``: whether no outputs at all is legal (a call whose
  ``jax.Ref`` arguments carry its results).
  """
  if out_shape is None:
    raise TypeError(
        "triton_call: `out_shape` (or `out_type`) is required: pass a"
        " jax.ShapeDtypeStruct, or any pytree of objects with .shape and"
        " .dtype, one per kernel output."
    )
  leaves, tree = jax.tree_util.tree_flatten_with_path(
      out_shape, is_leaf=_types.is_shape_dtype)
  if not leaves and not allow_empty:
    raise ValueError(
        f"triton_call: `out_shape` {out_shape!r} holds no outputs. A kernel"
        " call must produce at least one output, or mutate a jax.Ref"
        " argument (jax.new_ref(x)) in place."
    )
  flat = []
  for path, leaf in leaves:
    where = "out_shape" + jax.tree_util.keystr(path)
    if not _types.is_shape_dtype(leaf):
      raise TypeError(
          f"triton_call: {where} is {leaf!r} of type {type(leaf).__name__},"
          " which has no .shape and .dtype. Describe each output with"
          " jax.ShapeDtypeStruct(shape, dtype)."
      )
    dtype = _types.pointer_dtype(leaf.dtype, where)
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


def bind_outputs(info, n_args, out_shapes):
  operands = []
  for k, (_, dtype) in enumerate(out_shapes):
    param = info.params[n_args + k]
    if param.is_constexpr:
      raise _positional.binding_error(
          info,
          f"output {k} binds {param.name!r}, a tl.constexpr parameter. Pass"
          " fewer outputs, or pass the inputs that come before it.",
      )
    operands.append(
        _call_spec.Operand(param.name, "output", k, None, _types.pointer_type(dtype))
    )
  return operands


def zeroed(zeroed_outputs, kwargs, n_outputs, where):
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
  return [check_output_index(f"zeroed_outputs entry {index!r}", index,
                             n_outputs, where) for index in zeroed]


def check_output_index(what: str, index: Any, n_outputs: int,
                       where: str = "") -> int:
  """``index`` as an int naming one of the call's outputs, else ValueError.

  ``what`` is the entry that gives it (``"zeroed_outputs entry 3"``);
  ``where`` is appended to the message (the autotuning config).
  """
  if not isinstance(index, (int, np.integer)) or not 0 <= index < n_outputs:
    raise ValueError(
        f"triton_call: {what} is not an output index; the call has"
        f" {n_outputs} outputs, indices 0 to {n_outputs - 1}{where}."
    )
  return int(index)


def reset_to_zero(info, operands, aliases) -> tuple[int, ...]:
  """The outputs an autotuner's ``reset_to_zero`` names, as output indices.

  Triton zeroes them between benchmark runs, for kernels that accumulate
  into their outputs; in JAX an output is a fresh buffer at every call, so
  jt_dist zeroes them before every launch (see ``zeroed_outputs``).
  """
  names = [name for layer in info.layers
           if isinstance(layer, _compat.Autotuner)
           for name in (getattr(layer, "reset_to_zero", None) or ())]
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
    check_output_index(f"input_output_aliases[{i}] = {o}", o, n_out)
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
