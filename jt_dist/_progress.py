"""Progress on long work: autotuning and CPU launches that run for seconds.

A ``Progress`` says nothing for its first ``after_s`` seconds, so that short
work stays silent. Past that it logs a line on the ``jt_dist`` logger at
INFO every ``every_s`` seconds and when the work ends, and, where standard
error is a terminal and no handler would already print those lines there,
keeps one line on it up to date. ``JT_DIST_PROGRESS=0`` turns it all off.

Work that cannot say how far it has come while one step runs (a CPU launch
whose one chunk takes a minute) asks for a heartbeat: one daemon thread per
process, started when first needed, as tqdm's monitor is, reports such work
while it runs, so a launch pays no thread of its own.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from jt_dist import _settings

logger = logging.getLogger("jt_dist")


def _to_terminal() -> bool:
  """Whether to draw on stderr: a terminal that the logger does not reach."""
  stream = sys.stderr
  return bool(getattr(stream, "isatty", lambda: False)()) and not (
      logger.isEnabledFor(logging.INFO) and logger.hasHandlers())


class Progress:
  """Reports how far a long piece of work has come; a context manager.

  Args:
    what: the work, as a line's start ("autotuning matmul_kernel").
    total: how many steps the work has, or None where that is unknown.
    unit: what a step is, e.g. "configs" or "programs".
    after_s: the seconds of silence before the first report.
    every_s: the seconds between reports on the logger.
    heartbeat: report while no ``update`` comes too, from the monitor
      thread, with the last count given.
  """

  def __init__(self, what: str, total: int | None = None, *,
               unit: str = "steps", after_s: float = 5.0,
               every_s: float = 5.0, heartbeat: bool = False):
    self.what, self.total, self.unit = what, total, unit
    self._after_s, self._every_s = after_s, every_s
    self._start = time.monotonic()
    self._next_log = self._start + after_s
    self._next_draw = self._start + after_s
    self._enabled = _settings.progress()
    self._terminal = self._enabled and _to_terminal()
    self._reported = self._ended = False
    self._done = 0
    self._lock = threading.Lock()
    self._heartbeat = heartbeat and self._enabled

  def _line(self, done: int, elapsed: float) -> str:
    if self.total:
      share = f"{done}/{self.total} {self.unit} ({100 * done // self.total}%)"
    else:
      share = f"{done} {self.unit}"
    return f"jt_dist: {self.what}: {share}, {elapsed:.1f} s"

  def update(self, done: int) -> None:
    """Records that ``done`` steps are complete; reports if it is time."""
    if not self._enabled:
      return
    self._done = done
    self._report_if_due()

  def _report_if_due(self) -> None:
    now = time.monotonic()
    if now < self._next_draw and now < self._next_log:
      return
    with self._lock:  # The caller's thread or the monitor's, not both.
      if self._ended:
        return
      line = self._line(self._done, now - self._start)
      if now >= self._next_log:
        self._reported = True
        self._next_log = now + self._every_s
        logger.info("%s", line)
      if self._terminal and now >= self._next_draw:
        self._reported = True
        self._next_draw = now + 0.25
        sys.stderr.write("\r" + line + "\033[K")
        sys.stderr.flush()

  def __enter__(self) -> "Progress":
    if self._heartbeat:
      _MONITOR.watch(self)
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if self._heartbeat:
      _MONITOR.unwatch(self)
    with self._lock:
      self._ended = True
    if not self._reported:
      return
    elapsed = time.monotonic() - self._start
    ending = "stopped" if exc_type is not None else "done"
    line = f"jt_dist: {self.what}: {ending} after {elapsed:.1f} s"
    logger.info("%s", line)
    if self._terminal:
      sys.stderr.write("\r" + line + "\033[K\n")
      sys.stderr.flush()


class _Monitor:
  """The heartbeat: one daemon thread reporting the watched work."""

  _TICK_S = 0.25

  def __init__(self):
    self._watched: set[Progress] = set()
    self._changed = threading.Condition()
    self._thread: threading.Thread | None = None

  def watch(self, progress: Progress) -> None:
    with self._changed:
      self._watched.add(progress)
      if self._thread is None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="jt_dist-progress")
        self._thread.start()
      self._changed.notify()

  def unwatch(self, progress: Progress) -> None:
    with self._changed:
      self._watched.discard(progress)

  def _run(self) -> None:
    while True:
      with self._changed:
        self._changed.wait_for(lambda: self._watched)
        watched = list(self._watched)
      for progress in watched:
        progress._report_if_due()  # pylint: disable=protected-access
      time.sleep(self._TICK_S)


_MONITOR = _Monitor()
