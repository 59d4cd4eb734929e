"""Hooks into Triton's interpreter for the CPU runtime (``jt_dist._cpu``).

Where the interpreter touches memory, which program instance it runs, its
block pointers, and the one way jt_dist replaces its attributes for a launch.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
from typing import Any, Mapping

import triton
from triton.language import semantic as _semantic
from triton.runtime import interpreter as _interpreter

from jt_dist._compat.triton_api import LANGUAGE_LOCK

_ABSENT = object()


@contextlib.contextmanager
def attributes_replaced(owner: Any, replacements: Mapping[str, Any]):
  """Sets attributes of ``owner`` for the ``with`` block, then restores them.

  The one way jt_dist patches Triton (the interpreter's builder and module,
  ``JITFunction``): for one launch, under ``LANGUAGE_LOCK``, because the
  interpreter and the compiler share these objects across threads. The lock
  is reentrant, so launches that already hold it nest patches freely. An
  attribute that ``owner`` only inherited is deleted again rather than left
  shadowing the inherited one.

  Args:
    owner: a class, module or instance with a ``__dict__``.
    replacements: attribute name -> the value to hold inside the block.
  """
  with LANGUAGE_LOCK:
    own = vars(owner)
    saved = {name: own.get(name, _ABSENT) for name in replacements}
    for name, value in replacements.items():
      setattr(owner, name, value)
    try:
      yield
    finally:
      for name, value in saved.items():
        if value is _ABSENT:
          delattr(owner, name)
        else:
          setattr(owner, name, value)


# Triton's interpreter (3.6 through 3.9) reaches memory only through four
# functions of its native module, which `triton.runtime.interpreter` imports
# as `_interpreter`: load(ptrs, mask, other, dtype), store(ptrs, values,
# mask), atomic_rmw(op, ptrs, values, mask, sem) and atomic_cas(ptrs, cmp,
# values, sem). Plain, block-pointer (3.6) and tensor-descriptor (3.9) loads
# and stores all end there, so it is the one place to check addresses.
_NATIVE_MEMORY_ATTR = "_interpreter"


def interpreter_native_memory() -> Any:
  """The native module through which the interpreter touches memory."""
  return getattr(_interpreter, _NATIVE_MEMORY_ATTR)


@contextlib.contextmanager
def interpreter_native_memory_replaced(replacement: Any):
  """Routes the interpreter's memory accesses through ``replacement``.

  Only for one launch, with the caller holding the interpreter lock.
  """
  with attributes_replaced(_interpreter, {_NATIVE_MEMORY_ATTR: replacement}):
    yield


def interpreter_program_id() -> tuple[int, int, int] | None:
  """The program instance the interpreter is running, as (x, y, z)."""
  builder = getattr(_interpreter, "interpreter_builder", None)
  grid_idx = getattr(builder, "grid_idx", None)
  return None if grid_idx is None else tuple(int(i) for i in grid_idx)


def dtype_refusing_function(traceback) -> str | None:
  """The math function whose dtype check raised along ``traceback``.

  Triton 3.6 through 3.9 check a math function's operands in
  ``math._check_dtype``'s ``check``, a closure over the accepted ``dtypes``
  and the function ``fn``; None where no frame of the traceback is one.
  """
  while traceback is not None:
    frame = traceback.tb_frame
    if "dtypes" in frame.f_code.co_freevars:
      fn = frame.f_locals.get("fn")
      name = getattr(fn, "__name__", None)
      if name is not None:
        return name
    traceback = traceback.tb_next
  return None


def interpreter_semantic_class() -> type:
  """The class of Triton's semantic layer, whose methods lower ``tl`` calls.

  ``TritonSemantic`` in Triton 3.6 through 3.9; the interpreter's builtins
  call the methods of its module-level instance.
  """
  return _semantic.TritonSemantic


def interpreter_block_pointer(base, shape, strides, offsets, block_shape,
                              order) -> Any:
  """A block pointer handle of Triton's interpreter (Triton 3.6 has them)."""
  cls = getattr(_interpreter, "BlockPointerHandle", None)
  if cls is None:
    raise NotImplementedError(
        f"Triton {triton.__version__}'s interpreter has no block pointers")
  return cls(base, shape, strides, offsets, block_shape, order)


def interpreter_function_rewriter(python_fn, transform, name: str, value):
  """``python_fn`` rewritten as upstream's interpreter does, then by us.

  Upstream's ``FunctionRewriter`` (Triton 3.6 through 3.9) reads the
  source from its ``def`` on and applies its ``ASTTransformer``; then
  ``transform`` (a function of the module's AST) applies. The function is
  defined inside an outer one that binds ``name`` to ``value``, so the
  rewritten code reaches ``value`` as a closure variable.

  Returns:
    The rewritten function, or None where its source cannot be read.
  """
  rewriter = _interpreter.FunctionRewriter(python_fn)
  try:
    lines, _ = inspect.getsourcelines(python_fn)
  except (OSError, TypeError):
    return None
  # pylint: disable=protected-access
  rewriter.filename, rewriter.def_file_lineno = (
      rewriter._get_jit_fn_file_line())
  rewriter.def_lineno = rewriter._find_def(lines)
  tree = ast.parse(rewriter._prepare_source(lines))
  tree = transform(rewriter.ast_transformer.visit(tree))
  fn_name = python_fn.__name__
  outer = ast.FunctionDef(
      name=fn_name, args=ast.arguments(
          posonlyargs=[], args=[ast.arg(name)], kwonlyargs=[],
          kw_defaults=[], defaults=[]),
      body=tree.body + [ast.Return(ast.Name(fn_name, ast.Load()))],
      decorator_list=[], returns=None)
  tree = ast.Module(body=[outer], type_ignores=[])
  ast.fix_missing_locations(tree)
  ast.increment_lineno(tree, rewriter.def_file_lineno - 1)
  return rewriter._compile_and_exec(tree)(value)
