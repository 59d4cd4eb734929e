"""Running a whole launch through the interpreter at once, or giving way.

A launch first runs vectorised (``vector_builder``, ``vector_lang``): all
program instances together, each value carrying a leading program axis.
Where it cannot (the kernel's Python control flow depends on the program,
an operation has no vectorised form, or anything raises), every buffer the
attempt wrote is put back as it was, with the bounds checker's record of
written bytes, and the caller runs the launch one program at a time as
Triton's interpreter does; that path also reports any fault exactly as
before. A kernel (per signature and constexprs) that once gave way runs
one program at a time from then on.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import logging
import os
import weakref

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._cpu import vector_builder as _vb
from jt_dist._cpu import vector_lang as _vl

logger = logging.getLogger("jt_dist")

# The environment variable that turns vectorised launches off ("0", ...).
ENV_VAR = "JT_DIST_VECTORIZE"
ONE_AT_A_TIME = "one program at a time"
VECTORISED = "vectorised"
# A kernel's own faults, which say nothing about whether it vectorises.
_KERNEL_FAULTS = (_errors.OutOfBoundsAccessError,
                  _errors.UnwrittenOutputReadError, _errors.KernelTypeError,
                  AssertionError)
# Decisions per kernel signature; read and written under the interpreter lock.
_decisions: dict = {}


def enabled() -> bool:
  """Whether CPU launches try the vectorised interpreter (default on).

  Off, launches run exactly as Triton's interpreter runs them: one program
  at a time, memory through its native module.
  """
  value = os.environ.get(ENV_VAR, "1").strip().lower()
  return value not in ("0", "false", "off", "no")


def run(executor, args, kwargs, checker, patched_language) -> bool:
  """Runs the launch vectorised if it can.

  The caller holds the interpreter lock, with memory patched as for a
  one-program-at-a-time launch.

  Args:
    executor: the launch's ``GridExecutor`` (function, grid, constexprs).
    args: the kernel's positional arguments.
    kwargs: its constexpr keyword arguments.
    checker: the launch's ``bounds.MemoryChecker``, or None.
    patched_language: a context manager factory that patches
      ``triton.language`` as for a one-program-at-a-time launch; entered
      once the vectorised builder is in place (the patched builtins call
      the interpreter's semantic, whose builder this replaces).

  Returns:
    True if the launch ran; False if the caller must run it one program at
    a time, with memory as it was before this call.
  """
  grid = _grid(executor)
  if grid is None or not enabled():
    return False
  key = kernel_key(executor.fn, args, kwargs)
  if _decisions.get(key) == ONE_AT_A_TIME:
    return False
  journal = _journal(args, checker)
  if journal is None:
    return False
  try:
    with _compat.interpreter_native_memory_replaced(journal), \
        _vector_builder_installed(grid), patched_language():
      _run_vectorised(executor, args, kwargs)
  except _KERNEL_FAULTS as e:
    # The kernel's own fault: the one-program path reports it as always
    # (program id included); later, correct launches may still vectorise.
    journal.restore()
    logger.debug("jt_dist: kernel %s faulted vectorised; rerunning it one"
                 " program at a time to report it: %s", key[2], e)
    return False
  except Exception as e:  # pylint: disable=broad-except
    journal.restore()
    _decide(key, ONE_AT_A_TIME, f"{type(e).__name__}: {e}")
    return False
  _decide(key, VECTORISED, f"{int(np.prod(grid))} programs at once")
  return True


def kernel_key(fn, args, kwargs) -> tuple:
  """What a decision is cached under: kernel, argument types, constexprs."""
  code = fn.__code__
  sig = tuple(_arg_signature(a) for a in args)
  consts = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
  return (code.co_filename, code.co_firstlineno, fn.__qualname__, sig, consts)


def _arg_signature(arg):
  if hasattr(arg, "data_ptr"):
    return ("pointer", str(getattr(arg, "dtype", "")))
  if isinstance(arg, tl.core.tensor):
    return ("scalar", str(arg.dtype))
  return type(arg).__name__


def _decide(key, how: str, why: str) -> None:
  if _decisions.get(key) == how:
    return
  _decisions[key] = how
  logger.debug("jt_dist: kernel %s runs %s on the CPU (%s)", key[2], how,
               why)


def _grid(executor):
  """The launch's grid as 3 ints, or None where vectorising cannot help."""
  if callable(executor.grid) or executor.pre_run_hooks:
    return None
  grid = tuple(int(g) for g in executor.grid)
  grid = grid + (1,) * (3 - len(grid))
  return grid if int(np.prod(grid)) > 1 else None


# Rewritten kernel function -> the names it takes as arguments.
_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _parameters(fn) -> frozenset[str]:
  found = _PARAMETERS.get(fn)
  if found is None:
    spec = inspect.getfullargspec(fn)
    found = _PARAMETERS[fn] = frozenset(spec.args) | frozenset(
        spec.kwonlyargs)
  return found


def _run_vectorised(executor, args, kwargs):
  fn = executor.fn
  accepted = _parameters(fn)
  kwargs = {k: v for k, v in kwargs.items() if k in accepted}
  # ``patched_language`` has patched triton.language and its core, the only
  # modules upstream's ``_patch_lang(fn)`` would patch again.
  scope = _interpreter._LangPatchScope()  # pylint: disable=protected-access
  try:
    _vl.patch(scope, fn.__name__)
    call_args = inspect.getcallargs(fn, *args, **kwargs)
    call_args = {
        name: arg if name in executor.constexprs
        else _interpreter._implicit_cvt(arg)  # pylint: disable=protected-access
        for name, arg in call_args.items()
    }
    fn(**call_args)
  finally:
    scope.restore()


@contextlib.contextmanager
def _vector_builder_installed(grid):
  """Makes a ``VectorBuilder`` the interpreter's builder for one launch."""
  builder = _vb.VectorBuilder(grid)
  with (_compat.attributes_replaced(_interpreter,
                                    {"interpreter_builder": builder}),
        _compat.attributes_replaced(_interpreter.interpreter_semantic,
                                    {"builder": builder})):
    yield builder


def _journal(args, checker):
  """A write journal over the launch's buffers, or None if unknown."""
  if checker is not None:
    arrays = [b.array for b in checker.buffers]
    windows = [checker.address_window(k) for k in range(len(arrays))]
    written = [b.written for b in checker.buffers if b.written is not None]
  else:
    pointers = [a for a in args if hasattr(a, "data_ptr")]
    if any(not isinstance(getattr(p, "buffer", None), np.ndarray)
           for p in pointers):
      return None
    arrays = [p.buffer for p in pointers]
    windows = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays]
    written = []
  return _WriteJournal(_compat.interpreter_native_memory(), arrays, windows,
                       written)


class _WriteJournal:
  """The interpreter's memory module, keeping buffers' contents before writes.

  A buffer is copied just before the attempt first writes into it (by the
  written addresses' range, masked lanes included, so possibly more than
  needed), so that ``restore`` can undo the attempt.
  """

  def __init__(self, inner, arrays, windows, written):
    self._inner = inner
    self._arrays = arrays
    self._windows = windows
    self._saved: dict[int, np.ndarray] = {}
    self._written = [(w, w.copy()) for w in written]

  def __getattr__(self, name):
    return getattr(self._inner, name)

  def _save(self, ptrs):
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    if ptrs.size == 0:
      return
    lo, hi = int(ptrs.min()), int(ptrs.max())
    for k, (start, end) in enumerate(self._windows):
      if k not in self._saved and lo < end and hi >= start:
        self._saved[k] = self._arrays[k].copy()

  def store(self, ptrs, values, mask):
    self._save(ptrs)
    return self._inner.store(ptrs, values, mask)

  def atomic_rmw(self, op, ptrs, values, mask, sem):
    self._save(ptrs)
    return self._inner.atomic_rmw(op, ptrs, values, mask, sem)

  def atomic_cas(self, ptrs, cmp, values, sem):
    self._save(ptrs)
    return self._inner.atomic_cas(ptrs, cmp, values, sem)

  def restore(self) -> None:
    """Puts back every buffer and written-byte map the attempt changed."""
    for k, saved in self._saved.items():
      target = self._arrays[k]
      # Through the address: an input buffer may be a read-only array.
      ctypes.memmove(target.ctypes.data, saved.ctypes.data, saved.nbytes)
    self._saved.clear()
    for live, saved in self._written:
      np.copyto(live, saved)


@contextlib.contextmanager
def one_program_at_a_time():
  """Turns vectorised launches off within the block (tests, benchmarks)."""
  previous = os.environ.get(ENV_VAR)
  os.environ[ENV_VAR] = "0"
  try:
    yield
  finally:
    if previous is None:
      del os.environ[ENV_VAR]
    else:
      os.environ[ENV_VAR] = previous


def decisions_of(python_fn) -> set[str]:
  """How launches of the kernel function ``python_fn`` ran (for tests)."""
  where = (python_fn.__code__.co_filename, python_fn.__name__)
  return {how for key, how in _decisions.items() if (key[0], key[2]) == where}
