"""Triton's runtime classes, JIT functions and language lock, per Triton."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Mapping

import triton
from triton.runtime import autotuner as _autotuner
from triton.runtime import jit as _jit


JITFunction = _jit.JITFunction
Autotuner = _autotuner.Autotuner
Heuristics = _autotuner.Heuristics
Config = triton.Config
InterpreterError = triton.runtime.errors.InterpreterError


# Triton's interpreter patches ``triton.language`` for a launch, which the
# compiler's code generator calls too: both hold this lock. Reentrant: a
# launch may trace a nested call.
LANGUAGE_LOCK = threading.RLock()


def is_interpreted(fn: Any) -> bool:
  """Whether ``fn`` is an ``InterpretedFunction`` (``TRITON_INTERPRET=1``)."""
  # Looked up, not imported: jt_dist._cpu.interpreter is its one importer.
  interpreter = sys.modules.get("triton.runtime.interpreter")
  return (interpreter is not None
          and isinstance(fn, interpreter.InterpretedFunction))


def is_triton_function(fn: Any) -> bool:
  """Whether ``fn`` is a ``@triton.jit`` function, compiled or interpreted."""
  return isinstance(fn, JITFunction) or is_interpreted(fn)


def jit_function_of(fn: Any) -> JITFunction:
  """A ``JITFunction`` for a ``JITFunction`` or ``InterpretedFunction``."""
  return fn if isinstance(fn, JITFunction) else jit_function_for(fn.fn)


def triton_launcher_scalar_type(value: Any) -> str | None:
  """The type Triton's launcher gives an unannotated scalar (``mangle_type``,
  Triton 3.6-3.9), bools as "i1" (3.9 says "u1"); None where refused."""
  try:
    mangled = _jit.mangle_type(value)
  except (OverflowError, TypeError, ValueError):
    return None
  return "i1" if mangled in ("u1", "i1") else mangled


@functools.lru_cache(maxsize=None)
def jit_function_for(python_fn) -> JITFunction:
  """A ``JITFunction`` of a plain Python function, one per function."""
  # One per function keeps Triton's own per-function caches warm.
  return JITFunction(python_fn)


_ABSENT = object()


@contextlib.contextmanager
def attributes_replaced(owner: Any, replacements: Mapping[str, Any]):
  """Sets attributes of ``owner`` for the block, under ``LANGUAGE_LOCK``;
  restores them after (an attribute only inherited is deleted again)."""
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


def tensor_descriptor_class() -> type:
  """``triton.tools.tensor_descriptor.TensorDescriptor``, imported when a
  pre_hook first needs it."""
  from triton.tools import tensor_descriptor  # pylint: disable=g-import-not-at-top
  return tensor_descriptor.TensorDescriptor


def print_autotuning() -> bool:
  """Triton's ``knobs.autotuning.print`` (``TRITON_PRINT_AUTOTUNING``)."""
  return bool(triton.knobs.autotuning.print)
