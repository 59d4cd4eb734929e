"""``JT_DIST_VECTORIZE=check``: every launch run both ways, and compared.

A launch runs vectorised first; what it wrote (every buffer's bytes, and
the bounds checker's map of written output bytes) is kept, the buffers are
put back, and the launch runs again one program at a time. Those results
stay; any difference raises ``VectorisedMismatchError``. A launch that
gives way runs one program at a time only, with nothing to compare.
"""

from __future__ import annotations

import numpy as np

from jt_dist import _errors
from jt_dist._cpu import vector_journal as _journal


def run_both(launch) -> bool:
  """Runs ``launch`` (a ``vector_launch.Launch``) both ways and compares.

  True once both runs are done and agree (else ``VectorisedMismatchError``);
  False where the vectorised run gave way before running.
  """
  windows = _journal.windows_of(launch.args, launch.checker)
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
  _compare(launch, windows, vectorised)
  return True


def _snapshot(windows) -> list[tuple[np.ndarray, np.ndarray | None]]:
  return [(_journal.writable_bytes(w.array).copy(),
           None if w.written is None else w.written.copy()) for w in windows]


def _compare(launch, windows, vectorised) -> None:
  names = _names(launch)
  for k, (w, (data, written)) in enumerate(zip(windows, vectorised)):
    reference = _journal.writable_bytes(w.array)
    differs = np.flatnonzero(data != reference)
    if differs.size:
      raise _mismatch(launch, names[k], w.array, differs, data, "holds")
    if written is not None and (written != w.written).any():
      differs = np.flatnonzero(written != w.written)
      raise _mismatch(launch, names[k], w.array, differs, written,
                      "marks as written")


def _names(launch) -> list[str]:
  """Each buffer as the messages name it: its parameter, and role if known."""
  if launch.checker is not None:
    return [f"{b.param!r} ({b.role})" for b in launch.checker.buffers]
  return [repr(n) for n in _journal.pointer_names(launch.args,
                                                  launch.executor.arg_names)]


def _mismatch(launch, name, array, differs, vectorised, what):
  """The error for bytes ``differs`` (byte offsets) of buffer ``array``."""
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
