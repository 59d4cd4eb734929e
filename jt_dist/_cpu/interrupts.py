"""Ctrl-C during a CPU launch leaves the launch as the signal's own exception.

Python runs a signal's handler between two bytecodes, so Ctrl-C raises
``KeyboardInterrupt`` inside whatever Python code a launch is running at the
time, and some of that code runs under C functions that replace the
exception with their own. NumPy does: when it reads a shape through Python
(Triton 3.9's block shapes are ``tl.tuple`` objects, whose ``__iter__`` is
Python) and the read raises, it reports ``TypeError: expected a sequence of
integers or a single integer``. Triton's interpreter then wraps that as a
fault of the kernel, and the caller sees an ``InterpreterError`` instead of
the interrupt.

For the length of a launch on the main thread, ``signal_kept`` wraps the
SIGINT handler in force: the wrapper runs it as it is and remembers what it
raised. If the launch then fails with anything else, that exception is
replaced by the handler's. Nothing changes where the handler raises
nothing, where it is not a Python function (``SIG_IGN``, ``SIG_DFL``), or
off the main thread, which never runs signal handlers.

Code that catches broad exceptions inside the launch (the vectorised
interpreter, which gives way to one program at a time on any error) calls
``raise_if_interrupted`` first, so that an interrupt it caught in another
form stops the launch instead of starting it over.
"""

from __future__ import annotations

import contextlib
import signal
import threading

# What the SIGINT handler raised during the launch now running on the main
# thread (``signal_kept``), or None outside one.
_raised: list[BaseException] | None = None


def raise_if_interrupted() -> None:
  """Raises what SIGINT's handler raised during this launch, if it did
  (``KeyboardInterrupt`` under Python's default handler)."""
  if _raised and threading.current_thread() is threading.main_thread():
    raise _raised[0]


@contextlib.contextmanager
def signal_kept():
  """Within the block, SIGINT's exception is the one that leaves it."""
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
