"""How many programs of a vectorised launch run at once.

Every value of a vectorised launch carries a program axis, so its working
memory grows with the programs run together (tens of GiB over a grid of
2**31). A launch runs its grid in chunks of consecutive programs, each of
working memory (beyond the buffers) under ``WORKING_MEMORY_BOUND``, sized
from measurements per kernel, signature and constexprs:

- A kernel's first chunk is one program. The bytes of every value it
  creates, times ``_TEMPORARIES`` for NumPy's temporaries, bound its
  working memory from above, at next to no cost.
- A chunk whose estimate reaches ``_TRACED_FROM`` is measured exactly
  (``tracemalloc``'s peak, to which NumPy reports), where its work dwarfs
  the tracing; chunks then grow at most ``_GROWTH`` times per step over the
  largest one measured, until a chunk is no more than twice that one.

Later launches size their chunks from the estimate: a small grid runs as
one chunk, unmeasured.
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
  traced: bool  # Whether ``tracemalloc`` measured it (else values counted).


# Kernel key -> Estimate; read and written under the interpreter lock.
_estimates: dict = {}


def chunks(key, total: int) -> Iterator[range]:
  """Ranges of flat program numbers, in order, each to run inside
  ``measured(key, programs)``."""
  start = 0
  while start < total:
    programs = range(start, min(total, start + _next_size(key)))
    yield programs
    start = programs.stop


def _next_size(key) -> int:
  estimate = _estimates.get(key)
  if estimate is None:
    return 1
  target = WORKING_MEMORY_BOUND * _TARGET_FRACTION
  size = max(1, int(target // estimate.per_program))
  if estimate.traced:
    size = min(size, estimate.programs * _GROWTH)
  return size


@contextlib.contextmanager
def measured(key, programs: range):
  """Runs the block as chunk ``programs``, measuring it where needed."""
  estimate = _estimates.get(key)
  if estimate is None:
    with _values_bytes() as counted:
      yield
    _record(key, counted[0] * _TEMPORARIES, programs, traced=False)
  elif (estimate.per_program * len(programs) >= _TRACED_FROM
        and (not estimate.traced or len(programs) > 2 * estimate.programs)):
    with _peak_bytes() as peak:
      yield
    _record(key, peak[0], programs, traced=True)
  else:
    yield


def _record(key, nbytes: int, programs: range, traced: bool) -> None:
  estimate = _estimates.get(key)
  if (estimate is None or (traced and not estimate.traced)
      or len(programs) > estimate.programs):
    _estimates[key] = Estimate(max(nbytes, 1) / len(programs), len(programs),
                               traced)


@contextlib.contextmanager
def _values_bytes():
  """Yields a list whose item counts the bytes of the block's new values
  (broadcast views at their full size)."""
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
  """Yields a list that receives the block's peak of new allocations.

  A caller's ``tracemalloc`` peak is left alone: the block's is then bounded
  by the larger peak less what was allocated before the block.
  """
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

