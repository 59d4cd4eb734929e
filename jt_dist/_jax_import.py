"""Imports jax without the CUDA plugin's start-up lines on hosts without GPUs.

With JAX's CUDA plugin installed on a host without NVIDIA GPUs (for
cross-lowering, as the README's test command installs it), ``import jax``
loads the plugin's extension modules (three with jaxlib 0.10.2), and each
writes two lines to file descriptor 2 from C++: absl's "All log messages
before absl::InitializeLog() is called are written to STDERR" and tsl's
"cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will
not be used.". They come before absl is initialised, so no setting turns
them off (``TF_CPP_MIN_LOG_LEVEL`` does not), and on such a host they say
nothing the user can act on.

So, when jt_dist is imported before jax, on a host without NVIDIA devices
and with a CUDA plugin installed, jax is imported while descriptor 2 goes to
a temporary file; afterwards exactly those lines are dropped and everything
else is written back to descriptor 2, in order. Nothing is changed in the
environment, and on a host with GPUs nothing is filtered, since there the
cudart line reports a real problem.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import threading

_HARMLESS_LINES = (
    re.compile(rb"WARNING: All log messages before absl::InitializeLog\(\) is"
               rb" called are written to STDERR"),
    re.compile(rb"I\d{4} [0-9:. ]+ +\d+ cudart_stub\.cc:\d+\] Could not find"
               rb" cuda drivers on your machine, GPU will not be used\."),
)
_CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
_LOCK = threading.Lock()


def has_nvidia_devices() -> bool:
  """Whether the NVIDIA driver exposes any device node on this host."""
  return (os.path.exists("/dev/nvidiactl")
          or bool(glob.glob("/dev/nvidia[0-9]*")))


def _has_cuda_plugin() -> bool:
  for name in _CUDA_PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except (ImportError, ValueError):
      continue
  return False


def drop_harmless_lines(data: bytes) -> bytes:
  """``data`` without the lines that match one of ``_HARMLESS_LINES``."""
  lines = data.splitlines(keepends=True)
  return b"".join(
      line for line in lines
      if not any(p.fullmatch(line.rstrip(b"\r\n")) for p in _HARMLESS_LINES))


def _write_all(fd: int, data: bytes) -> None:
  while data:
    data = data[os.write(fd, data):]


@contextlib.contextmanager
def harmless_lines_dropped(fd: int = 2):
  """Sends ``fd`` to a temporary file; on exit, writes back what is not harmless.

  Args:
    fd: the file descriptor to filter (standard error).

  Yields:
    None.
  """
  try:
    saved = os.dup(fd)
  except OSError:  # No standard error to filter.
    yield
    return
  with _LOCK, tempfile.TemporaryFile() as capture:
    _flush_stderr()
    os.dup2(capture.fileno(), fd)
    try:
      yield
    finally:
      _flush_stderr()
      os.dup2(saved, fd)
      os.close(saved)
      capture.seek(0)
      _write_all(fd, drop_harmless_lines(capture.read()))


def _flush_stderr() -> None:
  with contextlib.suppress(Exception):
    sys.stderr.flush()


def import_jax() -> None:
  """Imports jax, dropping the CUDA plugin's lines on a host without GPUs."""
  if "jax" in sys.modules or has_nvidia_devices() or not _has_cuda_plugin():
    importlib.import_module("jax")
    return
  with harmless_lines_dropped():
    importlib.import_module("jax")
