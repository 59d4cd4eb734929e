"""Running a launch's programs together through the interpreter, or giving way.

A grid runs vectorised in lockstep, in chunks of consecutive programs whose
working memory stays under ``WORKING_MEMORY_BOUND``, sized per kernel key:
a first chunk of one program, its values' bytes (times ``_TEMPORARIES``) an
upper bound; chunks estimated past ``_TRACED_FROM`` are measured by
``tracemalloc`` and grow at most ``_GROWTH`` times a step. A chunk that
raises is undone (``vector_journal``); it and later programs run one at a
time, reporting faults as before; a kernel key that gave way stays so.
``JT_DIST_VECTORIZE=check`` runs both ways (the one-at-a-time results stay)
and raises ``VectorisedMismatchError`` where they differ.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import tracemalloc
from typing import Iterator, NamedTuple

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat
from jt_dist import _errors
from jt_dist import _settings
from jt_dist._cpu import interrupts as _interrupts
from jt_dist._cpu import lockstep_rewrite as _lockstep_rewrite
from jt_dist._cpu import vector_builder as _vb
from jt_dist._cpu import vector_journal as _journal
from jt_dist._cpu import vector_lang as _vl

logger = logging.getLogger("jt_dist")

ONE_AT_A_TIME = "one program at a time"
VECTORISED = "vectorised"
CHECK = "checked both ways"
# The setting's values, as this module names them.
_MODES = {"on": VECTORISED, "off": ONE_AT_A_TIME, "check": CHECK}
# A kernel's own faults, which say nothing about whether it vectorises.
_KERNEL_FAULTS = (_errors.OutOfBoundsAccessError,
                  _errors.UnwrittenOutputReadError, _errors.KernelTypeError,
                  AssertionError)
# Decisions per kernel signature; read and written under the interpreter lock.
_decisions: dict = {}
# Bytes the programs run at once may use (chunk sizes: above).
WORKING_MEMORY_BOUND = 256 << 20
# Chunks are sized for half the bound: the estimate extrapolates.
_TARGET_FRACTION = 0.5
_TEMPORARIES = 4
_TRACED_FROM = 16 << 20
_GROWTH = 64


def mode() -> str:
  """How CPU launches run, as ``JT_DIST_VECTORIZE`` says."""
  return _MODES[_settings.vectorize()]


def run(executor, args, kwargs, checker, patched_language, python_fn,
        progress) -> bool:
  """Runs the launch vectorised if it can; False if the caller must run it
  one program at a time (memory as before). ``patched_language()`` is
  entered once the vectorised builder is in place; ``progress`` hears of
  each chunk run."""
  how = mode()
  grid = _grid(executor)
  if grid is None or how == ONE_AT_A_TIME:
    return False
  launch = Launch(executor, grid, args, kwargs, checker, patched_language,
                  python_fn, progress)
  return _run_both(launch) if how == CHECK else launch.vectorised()


def kernel_key(fn, args, kwargs) -> tuple:
  """Kernel, argument types and constexprs."""
  # Through a runtime scalar's wrapper (jt_dist._core.wrapper).
  fn = fn.__globals__.get("_jt_dist_user_fn", fn)
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
  if _decisions.get(key) != how:
    _decisions[key] = how
    logger.debug("jt_dist: kernel %s runs %s on the CPU (%s)", key[2], how,
                 why)


def _grid(executor):
  """The grid as 3 ints, or None where vectorising cannot help."""
  if callable(executor.grid) or executor.pre_run_hooks:
    return None
  grid = (*map(int, executor.grid), 1, 1)[:3]
  return grid if int(np.prod(grid)) > 1 else None


class Launch:
  """One launch, run vectorised chunk by chunk or one program at a time."""

  def __init__(self, executor, grid, args, kwargs, checker, patched_language,
               python_fn, progress):
    self.executor = executor
    self.grid = grid
    self.args = args
    self.kwargs = kwargs
    self.checker = checker
    self.patched_language = patched_language
    self.key = kernel_key(executor.fn, args, kwargs)
    self.python_fn = python_fn
    self.progress = progress
    self.programs = int(np.prod(grid))

  def vectorised(self) -> bool:
    """As ``run``, without ``check``."""
    if _decisions.get(self.key) == ONE_AT_A_TIME:
      return False
    windows = _journal.windows_of(self.args, self.executor.arg_names,
                                  self.checker)
    if windows is None:
      return False
    journal = _journal.WriteJournal(windows)
    # Masked programs compute too: their float warnings are not the kernel's.
    builder = _vb.VectorBuilder(self.grid, range(0))
    with _interpreter.native_memory_replaced(journal), \
        _interpreter.builder_replaced(builder), \
        self.patched_language(), np.errstate(all="ignore"):
      stopped, chunks = self._chunks(builder, journal)
    if stopped is None:
      _decide(self.key, VECTORISED,
              f"{self.programs} programs in {chunks} chunk(s)")
      return True
    if stopped == 0:
      return False
    with self.patched_language():
      self.one_at_a_time(stopped)
    return True

  def _chunks(self, builder, journal):
    """Runs the chunks in order: (first program not run or None, chunks)."""
    count = 0
    for count, programs in enumerate(_chunk_ranges(self.key, self.programs), 1):
      _interrupts.check()
      builder.set_programs(programs)
      try:
        with _measured(self.key, programs):
          _run_vectorised(self)
      except Exception as e:  # pylint: disable=broad-except
        journal.restore()
        # An interrupt turned into another error stops the launch.
        _interrupts.raise_if_interrupted()
        if isinstance(e, _KERNEL_FAULTS):
          # Reported one at a time; later launches may still vectorise.
          logger.debug("jt_dist: kernel %s faulted vectorised; running its"
                       " programs from %d on one at a time to report it: %s",
                       self.key[2], programs.start, e)
        else:
          _decide(self.key, ONE_AT_A_TIME, f"{type(e).__name__}: {e}")
        return programs.start, count
      journal.clear()
      self.progress.update(programs.stop)
    return None, count

  def one_at_a_time(self, start: int = 0) -> None:
    """Runs programs ``start`` on one at a time, inside ``patched_language``."""
    if start == 0:
      self.executor(*self.args, **self.kwargs)
      return
    fn = self.executor.fn
    builder = _interpreter.builder()
    builder.set_grid_dim(*self.grid)
    call_args = _call_args(self.executor, self.args, self.kwargs)
    # ``patched_language`` has patched the language (upstream's patch_lang
    # would put back what it replaced: Triton 3.6's NumPy 2.4 __index__).
    scope = _interpreter.LangPatchScope()
    try:
      for flat in range(start, self.programs):
        builder.set_grid_idx(*_vb.program_ids(self.grid, flat))
        fn(**call_args)
    except Exception as e:  # As upstream's grid loop reports it.
      raise _compat.InterpreterError(repr(e)) from e
    finally:
      scope.restore()


def _call_args(executor, args, kwargs) -> dict:
  """The kernel's arguments by name, as upstream's executor passes them."""
  kwargs = {k: v for k, v in kwargs.items() if k in executor.arg_names}
  return {
      name: arg if name in executor.constexprs
      else _interpreter.implicit_cvt(arg)
      for name, arg in inspect.getcallargs(executor.fn, *args, **kwargs).items()
  }


def _run_vectorised(launch):
  executor = launch.executor
  fn = _lockstep_rewrite.rewrite(launch.python_fn, lambda: executor.fn)
  # ``patched_language`` has patched what upstream's ``_patch_lang`` would.
  scope = _interpreter.LangPatchScope()
  try:
    _vl.patch(scope, fn.__name__)
    with _compat.attributes_replaced(
        _compat.JITFunction, {"__call__": _call_in_lockstep}):
      fn(**_call_args(executor, launch.args, launch.kwargs))
  finally:
    scope.restore()


def _call_in_lockstep(self, *args, **kwargs):
  """A ``@triton.jit`` helper's call, in its lockstep form."""
  return _lockstep_rewrite.rewrite(
      self.fn, lambda: _interpreter.InterpretedFunction(self.fn).rewrite())(
          *args, **kwargs)


def _run_both(launch) -> bool:
  """``JT_DIST_VECTORIZE=check``: False where the vectorised run gave way."""
  windows = _journal.windows_of(launch.args, launch.executor.arg_names,
                                launch.checker)
  if windows is None:
    return False
  before = _snapshot(windows)
  if not launch.vectorised():
    return False
  vectorised = _snapshot(windows)
  for w, (data, written) in zip(windows, before):
    _journal.writable_bytes(w.array)[...] = data
    if written is not None:
      w.written[...] = written
  with launch.patched_language():
    launch.one_at_a_time()
  for w, (data, written) in zip(windows, vectorised):
    differs = np.flatnonzero(data != _journal.writable_bytes(w.array))
    if differs.size:
      raise _mismatch(launch, w, differs, data, "holds")
    if written is not None and (written != w.written).any():
      differs = np.flatnonzero(written != w.written)
      raise _mismatch(launch, w, differs, written, "marks as written")
  return True


def _snapshot(windows) -> list[tuple[np.ndarray, np.ndarray | None]]:
  return [(_journal.writable_bytes(w.array).copy(),
           None if w.written is None else w.written.copy()) for w in windows]


def _mismatch(launch, window, differs, vectorised, what):
  """The error for byte offsets ``differs`` of ``window``."""
  name, array = window.name, window.array
  itemsize = max(array.itemsize, 1)
  elements = np.unique(differs // itemsize)
  first = int(elements[0])
  index = tuple(int(i) for i in np.unravel_index(first, array.shape or (1,)))
  if what == "holds":
    ours = vectorised.view(array.dtype).reshape(-1)[first]
    theirs = array.reshape(-1)[first]
    detail = f"{ours} vectorised, {theirs} one program at a time"
  else:
    ours = bool(vectorised[first * itemsize:(first + 1) * itemsize].all())
    detail = (f"{'written' if ours else 'not written'} vectorised, "
              f"{'not ' if ours else ''}written one program at a time")
  return _errors.VectorisedMismatchError(
      f"triton_call: kernel {launch.key[2]!r} (JT_DIST_VECTORIZE=check):"
      f" what {name} {what} differs between the vectorised run and the run"
      f" one program at a time, first at element index {index}: {detail}"
      f" ({elements.size} element(s) differ). The outputs are those of the"
      f" run one program at a time. The vectorised interpreter is wrong for"
      f" this kernel: set JT_DIST_VECTORIZE=0 to run it one program at a"
      f" time, and report the kernel to jt_dist.")


def decisions_of(python_fn) -> set[str]:
  """How launches of ``python_fn`` ran (for tests)."""
  where = (python_fn.__code__.co_filename, python_fn.__name__)
  return {how for key, how in _decisions.items() if (key[0], key[2]) == where}


class Estimate(NamedTuple):
  """A kernel's working memory per program, over a chunk of ``programs``."""

  per_program: float  # Bytes.
  programs: int
  traced: bool  # Measured by ``tracemalloc`` (else values counted).


# Kernel key -> Estimate; read and written under the interpreter lock.
_estimates: dict = {}


def _chunk_ranges(key, total: int) -> Iterator[range]:
  """Ranges of flat program numbers, each run inside ``_measured``."""
  start = 0
  while start < total:
    programs = range(start, min(total, start + _next_size(key)))
    yield programs
    start = programs.stop


def _next_size(key) -> int:
  if (estimate := _estimates.get(key)) is None:
    return 1
  size = max(1, int(WORKING_MEMORY_BOUND * _TARGET_FRACTION
                    // estimate.per_program))
  return min(size, estimate.programs * _GROWTH) if estimate.traced else size


@contextlib.contextmanager
def _measured(key, programs: range):
  """Runs the block as chunk ``programs``, measuring it where needed."""
  if (estimate := _estimates.get(key)) is None:
    with _values_bytes() as counted:
      yield
    nbytes, traced = counted[0] * _TEMPORARIES, False
  elif (estimate.per_program * len(programs) >= _TRACED_FROM
        and (not estimate.traced or len(programs) > 2 * estimate.programs)):
    with _peak_bytes() as peak:
      yield
    nbytes, traced = peak[0], True
  else:
    yield
    return
  # A first, traced or larger chunk: its estimate replaces the last.
  _estimates[key] = Estimate(max(nbytes, 1) / len(programs), len(programs),
                             traced)


@contextlib.contextmanager
def _values_bytes():
  """Yields ``[bytes of the block's new values]`` (views at full size)."""
  handle = _interpreter.TensorHandle
  original = handle.__post_init__  # Triton 3.6 to 3.9 have one.
  counted = [0]

  def post_init(self):
    original(self)
    counted[0] += getattr(self.data, "nbytes", 0)

  with _compat.attributes_replaced(handle, {"__post_init__": post_init}):
    yield counted


@contextlib.contextmanager
def _peak_bytes():
  """Yields a list receiving the block's allocation peak (bounded from
  above where a caller traces already: its peak is left alone)."""
  found: list[int] = []
  started = not tracemalloc.is_tracing()
  if started:
    tracemalloc.start()
  before, peak_before = tracemalloc.get_traced_memory()
  try:
    yield found
  finally:
    _, peak = tracemalloc.get_traced_memory()
    if started:
      tracemalloc.stop()
    found.append(max(peak, peak_before) - before)

