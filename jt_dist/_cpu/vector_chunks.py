"""How many programs of a vectorised launch run at once.

Working memory grows with the programs run together, so a grid runs in
chunks of consecutive programs under ``WORKING_MEMORY_BOUND``, sized per
kernel key. The first chunk is one program, its values' bytes (times
``_TEMPORARIES``) an upper bound; chunks estimated past ``_TRACED_FROM``
are measured by ``tracemalloc`` and grow at most ``_GROWTH`` times a step.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from typing import Iterator, NamedTuple

from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _compat

WORKING_MEMORY_BOUND = 256 << 20
# Chunks are sized for half the bound: the estimate extrapolates.
_TARGET_FRACTION = 0.5
_TEMPORARIES = 4
_TRACED_FROM = 16 << 20
_GROWTH = 64


class Estimate(NamedTuple):
  """A kernel's working memory per program, over a chunk of ``programs``."""

  per_program: float  # Bytes.
  programs: int
  traced: bool  # Measured by ``tracemalloc`` (else values counted).


# Kernel key -> Estimate; read and written under the interpreter lock.
_estimates: dict = {}


def chunks(key, total: int) -> Iterator[range]:
  """Ranges of flat program numbers, each run inside ``measured``."""
  start = 0
  while start < total:
    programs = range(start, min(total, start + _next_size(key)))
    yield programs
    start = programs.stop


def _next_size(key) -> int:
  estimate = _estimates.get(key)
  if estimate is None:
    return 1
  size = max(1, int(WORKING_MEMORY_BOUND * _TARGET_FRACTION
                    // estimate.per_program))
  return min(size, estimate.programs * _GROWTH) if estimate.traced else size


@contextlib.contextmanager
def measured(key, programs: range):
  """Runs the block as chunk ``programs``, measuring it where needed."""
  estimate = _estimates.get(key)
  if estimate is None:
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
  original = getattr(handle, "__post_init__", None)
  counted = [0]

  def post_init(self):
    if original is not None:
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

