"""Generated ``@triton.jit`` kernels that call a user's kernel inline.

Triton inlines the callee, so a wrapper costs nothing. ``reordered`` takes
the parameters in another order (jaxlib passes inputs first) and loads
those passed as pointers (``runtime_scalar``). The user's kernel is never
modified; wrappers are cached, so that Triton's caches stay warm.
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import inspect
import linecache
from typing import Any, Sequence

import triton.language as tl

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import kernel as _kernel


def prefix(param_names: Sequence[str], base: str) -> str:
  """A prefix for internal names that no parameter starts with."""
  while any(name.startswith(base) for name in param_names):
    base += "_"
  return base


def call_line(p: str, names: Sequence[str]) -> str:
  """The wrapper's call of the user's kernel, every parameter by name."""
  return f"{p}kernel({', '.join(f'{n}={n}' for n in names)})"


def raise_compile_error(error: BaseException, spec, shapes) -> None:
  """Raises Triton's compile ``error`` as the user's kernel's own: Triton
  reports it at a wrapper's call line, chained to the callee's own (a 0-d
  array used as a number named as such); ``shapes``: the operands'."""
  own = error
  while own.__cause__ is not None:
    node = getattr(own, "node", None)
    if isinstance(node, ast.Expr):
      node = node.value
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id.startswith("_jt_")
            and node.func.id.endswith("kernel")):
      break
    own = own.__cause__
  _errors.raise_if_scalar_pointer(own, spec, shapes)
  if own is error:
    raise error
  own.__suppress_context__ = True
  raise own


def make_kernel(base_fn: Any, source: str, p: str, what: str,
                scope: dict[str, Any] | None = None) -> Any:
  """The kernel ``source`` defines (one ``def`` named as the user's), which
  calls ``base_fn`` (without its layers) as ``{p}kernel``; of the same class
  as ``base_fn``, keeping its ``do_not_specialize``."""
  jit_fn = _compat.jit_function_of(base_fn)
  python_fn = jit_fn.fn
  # Triton names the compiled kernel by it: profiles show the user's.
  qualname = python_fn.__qualname__
  # Registered for ``inspect``, which Triton reads the source with; an mtime
  # of None keeps linecache.checkcache from dropping the entry.
  digest = hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
  filename = f"<jt_dist {what} of {qualname} {digest}>"
  linecache.cache[filename] = (len(source), None,
                               source.splitlines(keepends=True), filename)
  namespace = {"tl": tl, f"{p}tl": tl, f"{p}kernel": jit_fn,
               "__name__": python_fn.__module__, **(scope or {})}
  # dont_inherit: this module's `from __future__ import annotations` would
  # turn the constexpr annotations into strings, which Triton misreads.
  exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # pylint: disable=exec-used
  wrapper = namespace[python_fn.__name__]
  wrapper.__qualname__ = qualname
  if not isinstance(base_fn, _compat.JITFunction):
    # Triton's InterpretedFunction (TRITON_INTERPRET=1): the same class.
    return type(base_fn)(wrapper)
  names = set(inspect.signature(wrapper).parameters)
  pinned = [q.name for q in jit_fn.params
            if q.do_not_specialize and q.name in names]
  return _compat.JITFunction(wrapper, do_not_specialize=pinned or None)


@functools.lru_cache(maxsize=256)
def reordered(kernel: Any, order: tuple[str, ...],
              loaded: tuple[tuple[str, int], ...] = ()) -> Any:
  """``kernel`` (its layers copied) taking its parameters in ``order``;
  ``loaded``: ``(name, divisibility)`` of those passed by pointer."""
  info = _kernel.kernel_info(kernel)
  wrapper = _wrapper(info.fn, order, dict(loaded))
  for layer in reversed(info.layers):
    layer = copy.copy(layer)
    layer.fn = wrapper
    wrapper = layer
  return wrapper


def _wrapper(base_fn, order, loaded: dict[str, int]):
  jit_fn = _compat.jit_function_of(base_fn)
  python_fn = jit_fn.fn
  declared = inspect.signature(python_fn).parameters
  constexprs = {q.name for q in jit_fn.params if q.is_constexpr}
  p = prefix(order, "_jt_wrap_")
  scope, parts, body = {}, [], []
  # Python takes a default only where every later parameter has one: keep
  # those of the trailing run in the user's order (the call binds the rest).
  keep = _trailing_in_order(order, list(declared))
  for k, name in enumerate(order):
    param = declared[name]
    text = name
    if name in constexprs:
      text += ": tl.constexpr"
    elif name not in loaded and param.annotation is not param.empty:
      scope[f"{p}a{k}"] = param.annotation
      text += f": {p}a{k}"
    if name in keep and param.default is not param.empty:
      scope[f"{p}d{k}"] = param.default
      text += f" = {p}d{k}"
    parts.append(text)
    if name in loaded:
      value = f"{p}tl.load({name})"
      if loaded[name] > 1:
        value = f"{p}tl.multiple_of({value}, {loaded[name]})"
      body.append(f"{name} = {value}")
  body.append(call_line(p, list(declared)))
  source = (f"def {python_fn.__name__}({', '.join(parts)}):\n"
            + "".join(f"    {line}\n" for line in body))
  if loaded:
    # The CPU's launch decisions are recorded as the user's kernel's; the
    # interpreter's rewrite of the wrapper keeps its globals.
    scope["_jt_dist_user_fn"] = python_fn
  kernel = make_kernel(base_fn, source, p, "wrapper", scope)
  # Pointers it loads are no 0-d arrays of the user's (jt_dist._errors).
  kernel.fn.loaded_by_value = frozenset(loaded)
  return kernel


def _trailing_in_order(order, declared) -> set[str]:
  """The longest tail of ``order`` that keeps the user's relative order."""
  tail = []
  for name in reversed(order):
    if tail and declared.index(name) > declared.index(tail[-1]):
      break
    tail.append(name)
  return set(tail)
