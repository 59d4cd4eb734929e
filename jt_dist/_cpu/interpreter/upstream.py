"""Triton's interpreter: the names and hooks jt_dist's CPU runtime uses.

The one module of jt_dist that imports ``triton.runtime.interpreter``.
Triton 3.6 through 3.9 hold every name below; the private ones are named
once here, each with what it is.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
from typing import Any

import triton
from triton.language import semantic as _semantic
from triton.runtime import interpreter as _interpreter

from jt_dist._compat import attributes_replaced

TensorHandle = _interpreter.TensorHandle
InterpreterBuilder = _interpreter.InterpreterBuilder
GridExecutor = _interpreter.GridExecutor
InterpretedFunction = _interpreter.InterpretedFunction
ReduceOps = _interpreter.ReduceOps
ScanOps = _interpreter.ScanOps
# Triton's semantic layer, whose methods lower ``tl`` calls; the
# interpreter's builtins call the methods of its module-level instance.
TritonSemantic = _semantic.TritonSemantic
# Private: the builder's atomic operations, NumPy's dtype of a Triton type,
# a kernel argument as the interpreter passes it, and its scope of patches
# to ``triton.language`` and the function that fills one for a kernel.
ATOMIC_OP = _interpreter._ir.ATOMIC_OP  # pylint: disable=protected-access
np_dtype = _interpreter._get_np_dtype  # pylint: disable=protected-access
implicit_cvt = _interpreter._implicit_cvt  # pylint: disable=protected-access
LangPatchScope = _interpreter._LangPatchScope  # pylint: disable=protected-access
patch_lang = _interpreter._patch_lang  # pylint: disable=protected-access


def builder():
  """The interpreter's builder in place (jt_dist replaces it per launch)."""
  return _interpreter.interpreter_builder


@contextlib.contextmanager
def builder_replaced(replacement):
  """Makes ``replacement`` the interpreter's builder for the block."""
  with (attributes_replaced(_interpreter,
                            {"interpreter_builder": replacement}),
        attributes_replaced(_interpreter.interpreter_semantic,
                            {"builder": replacement})):
    yield


# Triton's interpreter (3.6 through 3.9) reaches memory only through four
# functions of its native module, which `triton.runtime.interpreter` imports
# as `_interpreter`: load(ptrs, mask, other, dtype), store(ptrs, values,
# mask), atomic_rmw(op, ptrs, values, mask, sem) and atomic_cas(ptrs, cmp,
# values, sem). Plain, block-pointer (3.6) and tensor-descriptor (3.9) loads
# and stores all end there, so it is the one place to check addresses.
_NATIVE_MEMORY_ATTR = "_interpreter"


def native_memory() -> Any:
  """The native module through which the interpreter touches memory."""
  return getattr(_interpreter, _NATIVE_MEMORY_ATTR)


@contextlib.contextmanager
def native_memory_replaced(replacement: Any):
  """Routes the interpreter's memory accesses through ``replacement``.

  Only for one launch, with the caller holding the interpreter lock.
  """
  with attributes_replaced(_interpreter, {_NATIVE_MEMORY_ATTR: replacement}):
    yield


def program_id() -> tuple[int, int, int] | None:
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


def block_pointer(base, shape, strides, offsets, block_shape, order) -> Any:
  """A block pointer handle of Triton's interpreter (Triton 3.6 has them)."""
  cls = getattr(_interpreter, "BlockPointerHandle", None)
  if cls is None:
    raise NotImplementedError(
        f"Triton {triton.__version__}'s interpreter has no block pointers")
  return cls(base, shape, strides, offsets, block_shape, order)


def function_rewriter(python_fn, transform, name: str, value):
  """``python_fn`` rewritten as upstream's interpreter does, then by us.

  Upstream's ``FunctionRewriter`` reads the source from its ``def`` on and
  applies its ``ASTTransformer``; then ``transform`` (a function of the
  module's AST) applies. The function is defined inside an outer one that
  binds ``name`` to ``value``, so the rewritten code reaches ``value`` as a
  closure variable. None where the source cannot be read.
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
