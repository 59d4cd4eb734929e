"""Ctrl-C during a CPU launch leaves it as the signal's own exception.

C code can replace the ``KeyboardInterrupt`` (NumPy reports ``TypeError``),
so ``signal_kept`` remembers what SIGINT's handler raised and re-raises it;
code catching broad exceptions in a launch calls ``raise_if_interrupted``.

Python runs SIGINT's handler in the main thread, which may be waiting on a
computation over several devices whose launches run on XLA's threads, one
after another (the interpreter is one). Every launch that began before an
interrupt stops at its next ``check`` (a chunk, a program, a loop trip), so
that the interrupted computation ends and the next launch runs.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from jt_dist._core import host_faults as _host_faults

# What SIGINT's handler raised in the main thread's launch; None outside one.
_raised: list[BaseException] | None = None
# The interrupt count a thread's launch began under.
_launch = threading.local()


def check() -> None:
  """Stops this thread's launch if a launch was interrupted since it began."""
  began = getattr(_launch, "began", None)
  if began is not None and began != _host_faults.interrupts():
    raise KeyboardInterrupt(
        "jt_dist: launch stopped: Ctrl-C interrupted another launch of the"
        " computation it belongs to")


class _Abandoning:
  """SIGINT's handler, abandoning the launches in flight before it runs."""

  def __init__(self, previous):
    self.previous = previous

  def __call__(self, signum, frame):
    _host_faults.abandon_launches()
    return self.previous(signum, frame)


def watch_interrupts() -> None:
  """Makes Ctrl-C stop the launches in flight on XLA's threads too.

  Python runs SIGINT's handler in the main thread, which may be waiting on
  a computation whose launches run elsewhere: they would run on to their
  end. Called where a CPU call is lowered; wraps the handler in force (a
  callable one: Python's, or the caller's), which still decides what the
  signal raises.
  """
  if threading.current_thread() is not threading.main_thread():
    return
  current = signal.getsignal(signal.SIGINT)
  if callable(current) and not isinstance(current, _Abandoning):
    signal.signal(signal.SIGINT, _Abandoning(current))


def raise_if_interrupted() -> None:
  """Raises what SIGINT's handler raised during this launch, if it did."""
  if _raised and threading.current_thread() is threading.main_thread():
    raise _raised[0]


@contextlib.contextmanager
def signal_kept():
  """Within the block, a launch, SIGINT's exception is the one that leaves
  it, and ``check`` stops the launch once another was interrupted."""
  outer_launch = getattr(_launch, "began", None)
  _launch.began = (_host_faults.interrupts() if outer_launch is None
                   else outer_launch)
  try:
    with _handler_kept():
      yield
  finally:
    _launch.began = outer_launch


@contextlib.contextmanager
def _handler_kept():
  main = threading.current_thread() is threading.main_thread()
  previous = signal.getsignal(signal.SIGINT) if main else None
  if not callable(previous):
    yield
    return
  raised: list[BaseException] = []

  def handler(signum, frame):
    try:
      previous(signum, frame)
    except BaseException as e:  # pylint: disable=broad-except
      raised.append(e)
      _host_faults.abandon_launches()  # The computation's other launches.
      raise

  global _raised
  outer, _raised = _raised, raised
  signal.signal(signal.SIGINT, handler)
  try:
    yield
  except BaseException as e:  # pylint: disable=broad-except
    if raised and e is not raised[0]:
      # What the launch made of the interrupt says nothing to the caller.
      raise raised[0] from None
    raise
  finally:
    _raised = outer
    signal.signal(signal.SIGINT, previous)
