"""Kernel errors that leave a host callback, and how callers get them back.

jax reports a host callback's exception as its own error. A CPU launch
files its exception under a token in the ``HostFault`` it raises; where
jt_dist owns the boundary, ``raise_original`` raises the kernel's own instead
(under a caller's ``jax.jit``, jax's error carries the kernel's message).
"""

from __future__ import annotations

import collections
import itertools
import re
import threading
import traceback

# Filed faults, oldest first; bounded, as a fault raised under a caller's
# jax.jit is never taken.
_MAX_FILED = 64
_LOCK = threading.Lock()
_filed: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
_tokens = itertools.count(1)
_TOKEN = re.compile(r"\[jt_dist fault (\d+)\]")


# Interrupts (Ctrl-C) that stopped a launch or reached the caller: a launch
# that began before one stops at its next check, so that the rest of an
# interrupted computation (its other devices' launches) ends too.
_interrupts = [0]


def abandon_launches() -> None:
  """Stops every launch begun so far, at its next check."""
  with _LOCK:
    _interrupts[0] += 1


def interrupts() -> int:
  """How many interrupts have abandoned launches: a launch's mark."""
  return _interrupts[0]


class HostFault(Exception):
  """A kernel's exception on its way out of a host callback."""


def file(error: BaseException) -> HostFault:
  """Files ``error`` under a new token; returns the ``HostFault`` to raise."""
  # Keep the traceback's lines, not its frames' locals (the buffers).
  traceback.clear_frames(error.__traceback__)
  with _LOCK:
    token = next(_tokens)
    _filed[token] = error
    while len(_filed) > _MAX_FILED:
      _filed.popitem(last=False)
  kind = type(error)
  # The name a user catches: jt_dist's public one, else the qualified one.
  name = (f"jt_dist.{kind.__name__}" if kind.__module__ == "jt_dist._errors"
          else kind.__name__ if kind.__module__ == "builtins"
          else f"{kind.__module__}.{kind.__qualname__}")
  text = str(error) or kind.__name__
  return HostFault(f"{name}: {text} [jt_dist fault {token}]")


def raise_original(error: BaseException) -> None:
  """Raises the kernel's own exception behind ``error``, if one was filed."""
  if (match := _TOKEN.search(str(error))) is None:
    return
  with _LOCK:  # A filed exception is forgotten once taken.
    original = _filed.pop(int(match.group(1)), None)
  if original is not None:
    raise original.with_traceback(None) from None
