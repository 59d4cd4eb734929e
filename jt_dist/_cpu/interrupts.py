"""Ctrl-C during a CPU launch leaves it as the signal's own exception.

C code can replace the ``KeyboardInterrupt`` (NumPy reports ``TypeError``),
so ``signal_kept`` remembers what SIGINT's handler raised and re-raises it;
code catching broad exceptions in a launch calls ``raise_if_interrupted``.
"""

from __future__ import annotations

import contextlib
import signal
import threading

# What SIGINT's handler raised in the main thread's launch; None outside one.
_raised: list[BaseException] | None = None


def raise_if_interrupted() -> None:
  """Raises what SIGINT's handler raised during this launch, if it did."""
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
