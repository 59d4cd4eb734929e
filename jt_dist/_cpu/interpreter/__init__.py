"""Triton's interpreter: the names and hooks jt_dist's CPU runtime uses.

The only package importing ``triton.runtime.interpreter`` (3.6 to 3.9 hold
every name below).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import traceback
from typing import Any

from triton.language import semantic as _semantic
from triton.runtime import interpreter as _interpreter

from jt_dist._compat import attributes_replaced
from jt_dist._cpu.interpreter.language import language_patched
from jt_dist._cpu.interpreter.triton36_floats import builder_backported
from jt_dist._cpu.interpreter.triton36_floats import nan_ignoring

TensorHandle = _interpreter.TensorHandle
InterpreterBuilder = _interpreter.InterpreterBuilder
GridExecutor = _interpreter.GridExecutor
InterpretedFunction = _interpreter.InterpretedFunction
ReduceOps = _interpreter.ReduceOps
ScanOps = _interpreter.ScanOps
# The interpreter's builtins call the methods of its module-level instance.
TritonSemantic = _semantic.TritonSemantic
# Private names of the interpreter, named here only.
ATOMIC_OP = _interpreter._ir.ATOMIC_OP  # pylint: disable=protected-access
np_dtype = _interpreter._get_np_dtype  # pylint: disable=protected-access
implicit_cvt = _interpreter._implicit_cvt  # pylint: disable=protected-access
LangPatchScope = _interpreter._LangPatchScope  # pylint: disable=protected-access
patch_lang = _interpreter._patch_lang  # pylint: disable=protected-access
# Triton 3.6 only: 3.9 removed block pointers (its tl.advance raises).
BlockPointerHandle = getattr(_interpreter, "BlockPointerHandle", None)


def builder():
  """The interpreter's builder in place."""
  return _interpreter.interpreter_builder


@contextlib.contextmanager
def builder_replaced(replacement):
  """Makes ``replacement`` the interpreter's builder for the block."""
  with (attributes_replaced(_interpreter,
                            {"interpreter_builder": replacement}),
        attributes_replaced(_interpreter.interpreter_semantic,
                            {"builder": replacement})):
    yield


# Every memory access ends in this native module: the one place to check.
def native_memory() -> Any:
  return _interpreter._interpreter  # pylint: disable=protected-access


def native_memory_replaced(replacement: Any):
  """Routes the interpreter's memory accesses through ``replacement``."""
  return attributes_replaced(_interpreter, {"_interpreter": replacement})


def program_id() -> tuple[int, int, int] | None:
  """The program the interpreter is running, as (x, y, z)."""
  builder = getattr(_interpreter, "interpreter_builder", None)
  grid_idx = getattr(builder, "grid_idx", None)
  return None if grid_idx is None else tuple(int(i) for i in grid_idx)


def dtype_refusing_function(tb) -> str | None:
  """The math function whose ``math._check_dtype`` raised along ``tb``."""
  for frame, _ in traceback.walk_tb(tb):
    if "dtypes" in frame.f_code.co_freevars:
      name = getattr(frame.f_locals.get("fn"), "__name__", None)
      if name is not None:
        return name
  return None


def function_rewriter(python_fn, transform, name: str, value):
  """``python_fn`` rewritten as upstream does, then by ``transform``, with
  ``name`` bound to ``value`` as a closure variable; None without source."""
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
