"""Which parameter each output binds: jax-triton 0.3.1's or 0.4's convention.

jax-triton 0.3.1 binds the outputs, one pointer each, to the parameters
right after the positional arguments; ``input_output_aliases`` keys count
the array arguments only, and an aliased output still has its own pointer
parameter (pointing at the input's buffer).

jax-triton 0.4 binds the outputs to the non-``constexpr`` parameters no
argument binds, in order; an aliased input *is* its output's buffer, and its
output binds no parameter; ``input_output_aliases`` keys count the
non-``constexpr`` operands, scalars included, in parameter order.
``zeroed_outputs`` indexes the flattened outputs in both.

Without aliases the two agree wherever 0.3.1 binds at all, and 0.4's reading
also binds outputs past parameters given by name. With aliases, a call is
read both ways and the reading that binds the kernel's parameter list is
chosen; where both do, 0.4's is, with a ``DeprecationWarning`` naming the
fix; where neither does, the error names both readings.
"""

from __future__ import annotations

import warnings

from jt_dist import _errors
from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import call_spec as _call_spec
from jt_dist._core import outputs as _outputs
from jt_dist._core import positional as _positional
from jt_dist._core import types as _types

_ERRORS = (_errors.KernelBindingError, ValueError)


def bind(info, args, kinds, out_shapes, metaparams, aliases):
  """Binds operands and outputs to parameters under the fitting convention.

  ``args`` has the keyword operands merged in, ``kinds`` is
  ``positional.classify_args(args)``. Returns ``(operands, constexprs,
  aliases)``: the operands in parameter order, the constexprs bound
  positionally, and the aliases as ``(array index, output index)`` pairs.
  """
  try:
    old = _bind_031(info, args, kinds, out_shapes, metaparams, aliases)
  except _ERRORS as e:
    old_error = e
  else:
    if not aliases:
      return old
    old_error = None
  try:
    new = _bind_04(info, args, kinds, out_shapes, metaparams, aliases)
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


def _bind_031(info, args, kinds, out_shapes, metaparams, aliases):
  operands, constexprs = _positional.bind_positional(
      info, args, kinds, len(out_shapes))
  operands += _outputs.bind_outputs(info, len(args), out_shapes)
  return _checked(info, args, operands, constexprs, out_shapes, metaparams,
                  aliases)


def _bind_04(info, args, kinds, out_shapes, metaparams, aliases):
  # The 0.3.1 reading has warned of deprecated scalars already.
  operands, constexprs = _positional.bind_positional(info, args, kinds, 0,
                                                  warn=False)
  pairs = _translate(info, operands, aliases or {}, len(out_shapes))
  aliased = {o for _, o in pairs}
  bound = {op.name for op in operands} | set(constexprs) | set(metaparams)
  free = [p for p in info.params[len(args):]
          if not p.is_constexpr and p.name not in bound]
  unaliased = [k for k in range(len(out_shapes)) if k not in aliased]
  if len(unaliased) > len(free):
    raise _positional.binding_error(
        info,
        f"{len(unaliased)} outputs not aliased to an input bind parameters"
        f" no argument binds, but only {len(free)} are left:"
        f" {[p.name for p in free]}.")
  for k, param in zip(unaliased, free):
    operands.append(_call_spec.Operand(
        param.name, "output", k, None,
        _types.pointer_type(out_shapes[k][1])))
  operands.sort(key=lambda op: info.param_names.index(op.name))
  return _checked(info, args, operands, constexprs, out_shapes, metaparams,
                  dict(pairs))


def _checked(info, args, operands, constexprs, out_shapes, metaparams,
             aliases):
  """``bind``'s result for one reading, once its binding is checked whole.

  Both readings end here, so that a call is judged by the same checks
  whichever convention binds it; ``aliases`` count array arguments.
  """
  bound = [op.name for op in operands] + list(constexprs)
  _positional.check_metaparams(info, metaparams, bound)
  # Every non-constexpr parameter without a default must be bound.
  bound = {*bound, *metaparams}
  missing = [p.name for p in info.params if not p.is_constexpr
             and not p.has_default and p.name not in bound]
  _positional.check_bound(info, missing, operands, len(args), metaparams)
  arrays = _pytree_args.array_leaves(args)
  return operands, constexprs, _outputs.check_aliases(
      aliases, [(a.shape, a.dtype) for a in arrays], out_shapes)


def _translate(info, operands, aliases, n_outputs):
  """0.4's alias keys (non-constexpr operands) as array argument indices."""
  pairs = []
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
    _outputs.check_output_index(f"input_output_aliases[{key}] = {out}", out,
                                n_outputs)
    pairs.append((op.index, out))
  return pairs

