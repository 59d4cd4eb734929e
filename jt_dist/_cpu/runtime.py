"""Driving Triton's interpreter on host buffers, as a compiled kernel runs.

Upstream expects torch tensors, refuses ``@triton.jit`` helpers outside
``TRITON_INTERPRET=1``, computes on narrow floats' bits, skips device asserts
and reports a failed one as a bare ``AssertionError``. Every patch here lasts
one launch, under the interpreter lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import sys
import weakref

import numpy as np
import triton.language as tl
from triton.language import core as tl_core
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist import _progress
from jt_dist._cpu import atomics as _atomics
from jt_dist._cpu import bfloat16 as _bfloat16
from jt_dist._cpu import bounds as _bounds
from jt_dist._cpu import float8 as _float8
from jt_dist._cpu import host_memory as _host_memory
from jt_dist._cpu import interrupts as _interrupts
from jt_dist._cpu import libdevice as _libdevice
from jt_dist._cpu import lockstep_rewrite as _lockstep_rewrite
from jt_dist._cpu import reductions as _reductions
from jt_dist._cpu import vector_lang as _vector_lang
from jt_dist._cpu import vector_launch as _vector_launch


class _HostBufferExecutor(_interpreter.GridExecutor):
  """Triton's grid executor on host buffers: no copies to and from torch."""

  def _init_args_hst(self, args_dev, kwargs):
    return list(args_dev), dict(kwargs)

  def _restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
    del args_dev, args_hst, kwargs, kwargs_hst


# Making an InterpretedFunction costs ~1% of a tiny launch, per helper call.
_INTERPRETED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _interpreted(python_fn):
  if python_fn not in _INTERPRETED:
    _INTERPRETED[python_fn] = _interpreter.InterpretedFunction(python_fn)
  return _INTERPRETED[python_fn]


def _one_at_a_time_form(python_fn):
  """``python_fn`` as one program runs it: the lockstep form, whose loop
  indices are typed as compiled Triton types them."""
  return _lockstep_rewrite.rewrite(
      python_fn, lambda: _interpreted(python_fn).rewrite())


def run(python_fn, grid: tuple[int, int, int], args, kwargs, checker=None,
        debug: bool = False):
  """Runs ``python_fn`` over ``grid`` (the caller holds the interpreter
  lock); a kernel fault leaves unwrapped from ``InterpreterError``."""
  executor = _HostBufferExecutor(_one_at_a_time_form(python_fn),
                                 list(_interpreted(python_fn).arg_names),
                                 tuple(grid))
  progress = _progress.Progress(
      f"running {python_fn.__name__} on the CPU", int(np.prod(grid)),
      unit="programs", heartbeat=True)
  try:
    with progress, _checked_memory(checker), _programs_counted(progress,
                                                               grid):
      _run_patched(executor, args, kwargs, checker, python_fn, debug,
                   progress)
  except _compat.InterpreterError as e:
    if isinstance(e.__cause__, _KERNEL_FAULTS):
      raise e.__cause__ from None
    if (refused := _math_refusal(e.__cause__, python_fn.__name__)) is not None:
      raise refused from None
    raise


def _programs_counted(progress, grid):
  """Counts the programs run one at a time (each sets its program id)."""
  builder = _interpreter.builder()
  set_grid_idx = builder.set_grid_idx
  rows, columns = grid[0], grid[0] * grid[1]

  def counted(x, y, z):
    _interrupts.check()
    progress.update(x + rows * y + columns * z)
    set_grid_idx(x, y, z)

  return _compat.attributes_replaced(builder, {"set_grid_idx": counted})


_KERNEL_FAULTS = (_errors.OutOfBoundsAccessError,
                  _errors.UnwrittenOutputReadError,
                  _errors.KernelAssertionError,
                  _errors.KernelTypeError,
                  _libdevice.LibdeviceUnsupported)


# Triton's ``math._check_dtype``: "Expected dtype ['fp32'] but got bf16".
_MATH_DTYPE_MESSAGE = re.compile(
    r"Expected dtype \[(?P<accepted>[^\]]*)\] but got (?P<got>\w+)")
# Language names of Triton's type names, for the suggested cast.
_LANGUAGE_NAMES = {"fp16": "float16", "fp32": "float32", "fp64": "float64",
                   "bf16": "bfloat16"}


def _math_refusal(error, kernel: str) -> _errors.KernelTypeError | None:
  """The ``KernelTypeError`` for a math function's dtype refusal (``tl.exp``
  on bf16), or None; read only once a launch fails, so launches pay nothing."""
  found = (_MATH_DTYPE_MESSAGE.fullmatch(str(error))
           if isinstance(error, ValueError) else None)
  name = None if found is None else _interpreter.dtype_refusing_function(
      error.__traceback__)
  if name is None:
    return None
  accepted = re.findall(r"'(\w+)'", found["accepted"])
  first = _LANGUAGE_NAMES.get(accepted[0], accepted[0]) if accepted else ""
  return _errors.KernelTypeError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_interpreter.program_id()}: tl.{name} on {found['got']}"
      f" operands. It takes {' or '.join(accepted)} operands only, and"
      f" compiling it for a GPU fails too (\"{found.group(0)}\"). Cast"
      f" the operands first, e.g. `x.to(tl.{first})`, and the result back"
      " with `.to(...)` where a narrower one is wanted.")


def _checked_memory(checker):
  if checker is None:
    return contextlib.nullcontext()
  native = _interpreter.native_memory()
  if _vector_launch.mode() != _vector_launch.ONE_AT_A_TIME:
    # Accesses to the launch's own buffers as NumPy gathers and scatters.
    native = _host_memory.HostMemory(native,
                                     [b.array for b in checker.buffers])
  return _interpreter.native_memory_replaced(
      _bounds.CheckedMemory(native, checker))


def _run_patched(executor, args, kwargs, checker, python_fn, debug,
                 progress):
  # Vectorised where it can (not with tuple operands: the journal knows
  # top-level pointers only), else one program at a time.
  patched = functools.partial(_patched_language, python_fn.__name__, debug)
  if (not any(isinstance(a, tuple) for a in args)
      and _vector_launch.run(executor, args, kwargs, checker, patched,
                             python_fn, progress)):
    return
  with patched():
    executor(*args, **kwargs)


@contextlib.contextmanager
def _patched_language(kernel: str, debug: bool):
  """A launch's language and builder; each patch wraps those before it."""
  def call_interpreted(self, *args, **kwargs):
    # A @triton.jit helper refuses to run unless TRITON_INTERPRET=1.
    return _one_at_a_time_form(self.fn)(*args, **kwargs)

  def index(self):
    # Triton 3.6's `int(data)` of a (1,) array fails on NumPy >= 2.4.
    _vector_lang.require_integer(self, kernel)
    return int(self.handle.data.squeeze())

  with (_compat.attributes_replaced(_compat.JITFunction,
                                    {"__call__": call_interpreted}),
        _interpreter.builder_backported(),
        _compat.attributes_replaced(_interpreter.InterpreterBuilder, {
            "create_extern_elementwise":
                _libdevice.create_extern_elementwise}),
        _bfloat16.bfloat16_like_compiled(),
        _float8.float8_like_compiled(kernel),
        _atomics.float_atomics_on_values(),
        _interpreter.language_patched(),
        _reductions.reductions_on_values(kernel),
        _kernel_asserts(kernel, debug),
        _compat.attributes_replaced(tl_core.tensor, {"__index__": index})):
    yield


def _launch_options(options, debug: bool):
  """Without ``debug`` no ``sanitize_overflow``: its no-op device assert is
  dead work on every int32 ``+``, ``-``, ``*`` (compiled kernels drop it)."""
  changes = {"debug": debug}
  if not debug and getattr(options, "sanitize_overflow", False):
    changes["sanitize_overflow"] = False
  return dataclasses.replace(options, **changes)


def _failure(kernel: str, which: str, message, detail: str = ""):
  text = message.value if isinstance(message, tl.constexpr) else message
  return _errors.KernelAssertionError(
      f"triton_call: kernel {kernel!r}, program id"
      f" {_interpreter.program_id()}: {which} failed{detail}:"
      f" {text!s}")


def _static_assert_location(caller) -> str:
  """Where a static assert ran, and the kernel line that reached it."""
  own = _bounds.source_line(caller.f_code.co_filename, caller.f_lineno)
  kernel_line = _bounds.running_kernel_location()
  if not kernel_line or kernel_line == own:
    return f" at {own}"
  return f" at {own}, reached from the kernel's line {kernel_line}"


@contextlib.contextmanager
def _kernel_asserts(kernel: str, debug: bool):
  """Device asserts on with ``debug``, failures named; enter inside
  ``_interpreter.language_patched()``, whose ``static_assert`` this replaces."""
  builder = _interpreter.builder()

  def create_assert(self, condition, message):
    del self
    holds = np.asarray(condition.data, dtype=bool)
    if not holds.all():
      detail = f" in {int((~holds).sum())} of {holds.size} lanes"
      raise _failure(kernel, "tl.device_assert", message, detail)

  def static_assert(cond, msg="", **kwargs):
    del kwargs
    if not cond:  # A constexpr's truth is its value's.
      where = _static_assert_location(sys._getframe(1))  # pylint: disable=protected-access
      raise _failure(kernel, "tl.static_assert", msg or "(no message)", where)

  options = _launch_options(builder.options, bool(debug))
  with (_compat.attributes_replaced(builder, {"options": options}),
        _compat.attributes_replaced(_interpreter.InterpreterBuilder,
                                    {"create_assert": create_assert}),
        _compat.attributes_replaced(tl, {"static_assert": static_assert}),
        _compat.attributes_replaced(tl_core,
                                    {"static_assert": static_assert})):
    yield


def interpreter_scalar(value, triton_type: str):
  """A scalar argument typed as a compiled kernel types it: upstream types a
  float weakly (``x_fp16 * alpha`` stays fp16), 3.6 rejects its own bools,
  3.9 stores an int in [2**31, 2**32) in 4 bytes."""
  tl_dtype = {"fp32": tl.float32, "fp64": tl.float64, "i1": tl.int1,
              "i32": tl.int32, "u32": tl.uint32, "i64": tl.int64,
              "u64": tl.uint64}[triton_type]
  data = np.array([value], dtype=_interpreter.np_dtype(tl_dtype))
  return tl.tensor(_interpreter.TensorHandle(data, tl_dtype), tl_dtype)
