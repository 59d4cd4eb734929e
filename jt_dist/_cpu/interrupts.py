"""Ctrl-C during a CPU launch leaves the launch as the signal's own exception.

Ctrl-C raises ``KeyboardInterrupt`` inside whatever Python code a launch
runs, and some of it runs under C functions that replace the exception: when
NumPy reads a shape through Python (Triton 3.9's ``tl.tuple`` block shapes)
and the read raises, it reports ``TypeError: expected a sequence of
integers``, which Triton's interpreter wraps as a fault of the kernel.

For a launch on the main thread, ``signal_kept`` wraps the SIGINT handler
in force (a Python function; ``SIG_IGN`` and ``SIG_DFL`` are left alone) and
remembers what it raised; a launch that then fails with anything else
raises the handler's exception instead. Code that catches broad exceptions
inside the launch (the vectorised interpreter, which gives way to one
program at a time on any error) calls ``raise_if_interrupted`` first, so
that an interrupt caught in another form stops the launch.
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
