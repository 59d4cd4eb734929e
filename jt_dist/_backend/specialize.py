"""How one launch binds a kernel's parameters at compile time.

As Triton's own launcher specialises a call: integer scalars equal to 1
become constexprs, and pointers (16-byte aligned, which jaxlib checks) and
integers divisible by 16 carry the divisibility attribute. The GPU compile
and the CPU path's check against Triton's code generator both start here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jt_dist import _compat
from jt_dist._core import arguments as _arguments

_INT_TYPES = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


class Specialization(NamedTuple):
  """How one launch binds the kernel's parameters at compile time
  (``attrs``: the divisibility by ``(index, *tuple path)``)."""

  signature: dict[str, str]
  constexprs: dict[str, Any]
  attrs: dict[tuple[int, ...], Any]
  launch_operands: tuple[Any, ...]


def specialize(spec, launch, backend) -> Specialization:
  """The signature, constexprs and attributes of ``launch`` of ``spec``."""
  kwargs = dict(launch.config.kwargs)
  divisible = _compat.pointer_divisibility_attr(backend)
  pinned = {p.name for p in _compat.jit_function_of(spec.info.fn).params
            if p.do_not_specialize}
  signature, constexprs, attrs, launched = {}, {}, {}, []
  by_name, leaves = {}, {}
  for op in spec.operands:
    if op.path:
      leaves.setdefault(op.name, []).append(op)
    else:
      by_name[op.name] = op
  for index, param in enumerate(spec.info.params):
    if param.name in leaves:
      # A tuple parameter: nested types, attributes by path, one argument
      # per leaf.
      ops = leaves[param.name]
      signature[param.name] = _arguments.nest(
          [(op.path, op.type) for op in ops])
      attrs.update({(index, *op.path): divisible for op in ops
                    if op.type.startswith("*")})
      launched.extend(ops)
      continue
    op = by_name.get(param.name)
    # Triton specialises integer arguments equal to 1 into constants; bools
    # are typed i1 and are not integers to it.
    is_one = (op is not None and op.kind == "scalar"
              and op.type in _INT_TYPES and op.value == 1)
    if param.name in kwargs or op is None or is_one:
      # Unbound, a parameter has a default (binding checked that).
      constexprs[param.name] = kwargs.get(
          param.name, 1 if op is not None else param.default)
      signature[param.name] = "constexpr"
      continue
    signature[param.name] = op.type
    if op.type.startswith("*") or (
        op.kind == "scalar" and op.type in ("i32", "u32", "i64", "u64")
        and op.value % 16 == 0 and param.name not in pinned):
      # As Triton's launcher does: a size or stride divisible by 16 lets
      # accesses vectorise; static per call, so no recompiles.
      attrs[(index,)] = divisible
    launched.append(op)
  return Specialization(signature, constexprs, attrs, tuple(launched))


def value_key(value: Any) -> str:
  # Constexprs may be Triton dtypes or @triton.jit functions: their
  # cache_key (source and callees) identifies them, never their id().
  key = getattr(value, "cache_key", None)
  kind = f"{type(value).__module__}.{type(value).__qualname__}"
  return f"{kind}:{key if isinstance(key, str) else repr(value)}"
