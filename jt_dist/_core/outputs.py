"""Outputs of a kernel call: ``out_shape``, the parameters they bind,
aliases and zeroed outputs.

jax-triton 0.3.1 binds one pointer per output, aliased or not, to the
parameters after the args; alias keys count the array arguments. 0.4 binds
outputs to the non-``constexpr`` parameters no argument binds, alias keys
count the non-constexpr operands, and an aliased input *is* its output's
buffer (that output binds no parameter). Without aliases the two agree
wherever 0.3.1 binds; with aliases ``bind`` tries both: where both bind,
0.4's wins with a DeprecationWarning; where neither does, the error names
both readings.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import arguments as _arguments
from jt_dist._core import kernel as _kernel
from jt_dist._core import tensordesc as _tensordesc
from jt_dist._core import types as _types

_ERRORS = (_errors.KernelBindingError, ValueError)


def flatten_out_shape(out_shape: Any, allow_empty: bool = False):
  """``out_shape`` as (shape, dtype) pairs, and its treedef."""
  return flatten(out_shape, allow_empty)[:2]


def flatten(out_shape: Any, allow_empty: bool = False):
  """``(flatten_out_shape's pairs, treedef, {index: (where, descriptor)})``:
  one walk, a ``TensorDescriptor`` one leaf whose array is the output."""
  if out_shape is None:
    raise TypeError(
        "triton_call: `out_shape` (or `out_type`) is required: pass a"
        " jax.ShapeDtypeStruct, or any pytree of objects with .shape and"
        " .dtype, one per kernel output.")
  leaves, tree = jax.tree_util.tree_flatten_with_path(
      out_shape, is_leaf=lambda x: isinstance(
          x, _tensordesc.TensorDescriptor) or _types.is_shape_dtype(x))
  if not leaves and not allow_empty:
    raise ValueError(
        f"triton_call: `out_shape` {out_shape!r} holds no outputs. A kernel"
        " call must produce at least one output, or mutate a jax.Ref"
        " argument (jax.new_ref(x)) in place.")
  flat, found = [], {}
  for k, (path, leaf) in enumerate(leaves):
    where = "out_shape" + jax.tree_util.keystr(path)
    if isinstance(leaf, _tensordesc.TensorDescriptor):
      found[k] = (where, leaf)
      leaf = leaf.base  # Its array is the output.
    if not _types.is_shape_dtype(leaf):
      raise TypeError(
          f"triton_call: {where} is {leaf!r} of type {type(leaf).__name__},"
          " which has no .shape and .dtype. Describe each output with"
          " jax.ShapeDtypeStruct(shape, dtype).")
    dtype = _types.pointer_dtype(leaf.dtype, where)
    flat.append((_checked_shape(leaf.shape, where), dtype))
  return tuple(flat), tree, found


def typed_descriptors(info, operands, kinds, arg_descriptors,
                      out_descriptors, aliases):
  """``operands`` with each descriptor's array typed ``tensordesc<...>``, its
  ``Info`` as value (an argument's, by position; an output's, ``flatten``'s).
  An output's that no parameter takes (under 0.4's convention an aliased
  output binds none) is refused, as it would be lost."""
  found = {("array", kinds[i][1]): desc for i, desc in arg_descriptors}
  found.update({("output", k): _tensordesc.info(desc, where)
                for k, (where, desc) in out_descriptors.items()})
  bound = {op.index for op in operands if op.kind == "output"}
  if unbound := [k for k in out_descriptors if k not in bound]:
    k, where = unbound[0], out_descriptors[unbound[0]][0]
    source = next((i for i, o in aliases if o == k), None)
    raise _arguments.binding_error(
        info, f"out_shape declares output {k} ({where}) as a"
        f" TensorDescriptor, but output {k} binds no parameter: it is aliased"
        f" to array argument {source} (input_output_aliases), whose buffer it"
        f" is. Pass that input as the TensorDescriptor, and {where} as its"
        " jax.ShapeDtypeStruct.")
  return [dataclasses.replace(op, type=desc.triton_type, value=desc)
          if (desc := found.get((op.kind, op.index))) is not None else op
          for op in operands]


def without_arrays(out_shape: Any) -> Any:
  """``out_shape`` with each array leaf (``out_shape=x``) as its shape and
  dtype, so that a call kept for reuse holds no caller's array or tracer."""
  if type(out_shape) is jax.ShapeDtypeStruct:  # pylint: disable=unidiomatic-typecheck
    return out_shape
  return jax.tree_util.tree_map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
      if isinstance(leaf, (jax.Array, np.ndarray)) else leaf,
      out_shape, is_leaf=_types.is_shape_dtype)


def _checked_shape(shape: Any, where: str) -> tuple[int, ...]:
  """``shape`` as a tuple of ints, checked: ``int(2.5)`` would silently make
  a smaller buffer, and a negative size an unreadable MLIR error."""
  try:
    dims = tuple(shape)
  except TypeError:
    raise TypeError(
        f"triton_call: {where} has shape {shape!r} of type"
        f" {type(shape).__name__}; a shape is a tuple of ints, e.g. (16,)."
    ) from None
  _types.refuse_symbolic(dims, f"{where}'s shape {dims!r}")
  for axis, dim in enumerate(dims):
    if (not isinstance(dim, (int, np.integer))
        or isinstance(dim, (bool, np.bool_))):
      raise TypeError(
          f"triton_call: {where} has shape {dims!r}, whose dimension {axis}"
          f" is {dim!r} of type {type(dim).__name__}; every dimension must be"
          " an int. Round it explicitly, e.g. with int(...) or triton.cdiv.")
    if dim < 0:
      raise ValueError(
          f"triton_call: {where} has shape {dims!r}, whose dimension {axis}"
          f" is {int(dim)}; dimensions must be at least 0.")
  return tuple(int(d) for d in dims)


def _output(name, k, out_shapes):
  return _kernel.Operand(name, "output", k, None,
                         _types.pointer_type(out_shapes[k][1]))


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
  """``index`` as an int naming an output; ``what`` gives it in messages."""
  if not isinstance(index, (int, np.integer)) or not 0 <= index < n_outputs:
    raise ValueError(
        f"triton_call: {what} is not an output index; the call has"
        f" {n_outputs} outputs, indices 0 to {n_outputs - 1}{where}.")
  return int(index)


def reset_to_zero(info, operands, aliases) -> tuple[int, ...]:
  """The outputs an autotuner's ``reset_to_zero`` names, as indices (zeroed
  before every launch: each output is a fresh buffer)."""
  names = [name for layer in info.layers
           if isinstance(layer, _compat.Autotuner)
           for name in (getattr(layer, "reset_to_zero", None) or ())]
  by_name = {op.name: op for op in operands}
  aliased = dict(aliases)
  outputs = []
  for name in names:
    if (op := by_name.get(name)) is not None and op.kind == "output":
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


def _check_aliases(aliases, arrays, out_shapes):
  """``aliases`` as sorted (array index, output index) pairs."""
  n_in, n_out = len(arrays), len(out_shapes)
  result = []
  for i, o in dict(aliases or {}).items():
    if not 0 <= i < n_in:
      raise ValueError(
          f"triton_call: input_output_aliases key {i} is not an array"
          f" argument index; the call has {n_in} array arguments, indices 0"
          f" to {n_in - 1} (scalars are not counted).")
    check_output_index(f"input_output_aliases[{i}] = {o}", o, n_out)
    shape, dtype = tuple(arrays[i].shape), np.dtype(arrays[i].dtype)
    if (shape, dtype) != out_shapes[o]:
      raise ValueError(
          f"triton_call: input_output_aliases[{i}] = {o} aliases array"
          f" argument {i} with shape {shape} and dtype"
          f" {dtype.name} to output {o} with shape"
          f" {out_shapes[o][0]} and dtype {out_shapes[o][1].name}. Aliased"
          " buffers must agree in shape and dtype.")
    result.append((int(i), int(o)))
  if len({o for _, o in result}) != len(result):
    raise ValueError(
        f"triton_call: input_output_aliases {dict(aliases)!r} maps two"
        " inputs to one output; each output can alias at most one input.")
  return tuple(sorted(result))


def bind(info, args, kinds, arrays, out_shapes, metaparams, aliases):
  """``(operands in parameter order, positional constexprs, aliases as
  (array index, output index) pairs)`` under the fitting convention."""
  old = old_error = None
  try:
    old = _bind_031(info, args, kinds, arrays, out_shapes, metaparams, aliases)
  except _ERRORS as e:
    old_error = e
  if old_error is None and not aliases:
    return old
  try:
    new = _bind_04(info, args, kinds, arrays, out_shapes, metaparams, aliases)
  except _ERRORS as e:
    if old_error is None:
      return old
    if not aliases:
      raise old_error
    raise type(old_error)(
        f"{old_error} Read with jax-triton 0.4's convention instead (an"
        " aliased input is its output's buffer and its output binds no"
        " parameter; input_output_aliases keys count the non-constexpr"
        f" operands, scalars included), the call fails too: {e}") from None
  if old_error is None:
    _warn_ambiguous(info, old, new, aliases)
  return new


def _warn_ambiguous(info, old, new, aliases) -> None:
  old_outputs = [op.name for op in old[0] if op.kind == "output"]
  new_outputs = [op.name for op in new[0] if op.kind == "output"]
  unbound = [n for n in old_outputs if n not in new_outputs]
  warnings.warn(
      f"triton_call: kernel {info.name!r}({', '.join(info.param_names)}) with"
      f" input_output_aliases={dict(aliases)!r} binds under jax-triton"
      " 0.3.1's convention (every output binds a parameter:"
      f" {old_outputs}) and under 0.4's (an aliased input is its output's"
      f" buffer: outputs bind {new_outputs}). jt_dist follows 0.4, leaving"
      f" {unbound} to their defaults. To keep 0.4's reading and silence this,"
      f" pass {', '.join(f'{n}=...' for n in unbound)} by name; for 0.3.1's,"
      " remove the defaults of those parameters.",
      DeprecationWarning, stacklevel=6)


def _bind_031(info, args, kinds, arrays, out_shapes, metaparams, aliases):
  operands, constexprs = _arguments.bind_positional(
      info, args, kinds, arrays, len(out_shapes))
  # Output k binds the k-th parameter after the args that no keyword binds
  # (a constexpr given by name may sit between two outputs).
  free = [p for p in info.params[len(args):] if p.name not in metaparams]
  for k in range(len(out_shapes)):
    param = free[k] if k < len(free) else info.params[len(args) + k]
    if param.is_constexpr:
      raise _arguments.binding_error(
          info, f"output {k} binds {param.name!r}, a tl.constexpr parameter."
          " Pass fewer outputs, or pass the inputs that come before it.")
    if param.name in metaparams:
      raise _arguments.binding_error(
          info, f"output {k} binds {param.name!r}, which metaparam"
          f" {param.name}= binds too. Pass fewer outputs, or drop the"
          " metaparam.")
    operands.append(_output(param.name, k, out_shapes))
  return _checked(info, len(args), arrays, operands, constexprs, out_shapes,
                  metaparams, aliases)


def _bind_04(info, args, kinds, arrays, out_shapes, metaparams, aliases):
  # The 0.3.1 reading has warned of deprecated scalars already.
  operands, constexprs = _arguments.bind_positional(info, args, kinds,
                                                    arrays, 0, warn=False)
  pairs = _translate(operands, aliases or {}, len(out_shapes))
  bound = {op.name for op in operands} | set(constexprs) | set(metaparams)
  free = [p for p in info.params[len(args):]
          if not p.is_constexpr and p.name not in bound]
  unaliased = [k for k in range(len(out_shapes)) if k not in pairs.values()]
  if len(unaliased) > len(free):
    raise _arguments.binding_error(
        info,
        f"{len(unaliased)} outputs not aliased to an input bind parameters"
        f" no argument binds, but only {len(free)} are left:"
        f" {[p.name for p in free]}.")
  operands += [_output(p.name, k, out_shapes) for k, p in zip(unaliased, free)]
  operands.sort(key=lambda op: info.param_names.index(op.name))
  return _checked(info, len(args), arrays, operands, constexprs, out_shapes,
                  metaparams, pairs)


def _checked(info, n_args, arrays, operands, constexprs, out_shapes,
             metaparams, aliases):
  """``bind``'s result for one reading, checked; ``aliases`` count arrays."""
  _arguments.check_metaparams(
      info, metaparams, [op.name for op in operands] + list(constexprs))
  _arguments.check_bound(info, operands, n_args, [*constexprs, *metaparams],
                         constexprs=False)
  return operands, constexprs, _check_aliases(aliases, arrays, out_shapes)


def _translate(operands, aliases, n_outputs):
  """0.4's alias keys (non-constexpr operands) as array argument indices:
  ``{array index: output index}``."""
  pairs = {}
  for key, out in dict(aliases).items():
    if not 0 <= key < len(operands):
      raise ValueError(
          f"triton_call: input_output_aliases key {key} is not an operand"
          f" index; under jax-triton 0.4's convention keys count the"
          f" {len(operands)} non-constexpr operands"
          f" {[op.label for op in operands]}, scalars included.")
    op = operands[key]
    if op.kind != "array":
      raise ValueError(
          f"triton_call: input_output_aliases key {key} is operand"
          f" {op.label!r}, a scalar; only an array can alias an output."
          " (Under jax-triton 0.4's convention keys count the non-constexpr"
          f" operands {[o.label for o in operands]}, scalars included.)")
    check_output_index(f"input_output_aliases[{key}] = {out}", out, n_outputs)
    pairs[op.index] = out
  return pairs

