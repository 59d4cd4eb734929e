"""Runs Python as a user would, in a fresh process, and checks it was quiet.

Code that imports jt_dist before jax runs in a fork of a process that has
imported jt_dist already (tests/fork_server.py): what it would have printed
while importing is what tests/quiet_start_test.py checks, in real processes.

For tests of what users run whole: the examples (tests/examples_test.py)
and pasted documentation blocks. A run passes when it exits 0 and writes
nothing to stderr: on a host without GPUs that has JAX's CUDA plugin,
importing jax before jt_dist writes the plugin's start-up lines there, and
a warning a user would see is a failure too.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile
from typing import Sequence

import fork_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# What JAX's CUDA plugin writes to stderr when jax is imported on a host
# without NVIDIA GPUs (the suites install it to cross-lower). jt_dist leaves
# the process's stderr alone, so a child's stderr is read without them.
_PLUGIN_LINES = (
    re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is"
               r" called are written to STDERR"),
    re.compile(r"I\d{4} [0-9:. ]+ +\d+ cudart_stub\.cc:\d+\] Could not find"
               r" cuda drivers on your machine, GPU will not be used\."),
)


def has_nvidia_devices() -> bool:
  """Whether the NVIDIA driver exposes any device node on this host."""
  return (os.path.exists("/dev/nvidiactl")
          or bool(glob.glob("/dev/nvidia[0-9]*")))


def without_plugin_lines(text: str) -> str:
  """``text`` without the CUDA plugin's start-up lines (none on GPU hosts)."""
  if has_nvidia_devices():
    return text
  return "".join(line for line in text.splitlines(keepends=True)
                 if not any(p.fullmatch(line.rstrip("\r\n"))
                            for p in _PLUGIN_LINES))


def run_python(
    argv: Sequence[str], *, stdin: str | None = None, timeout: float = 600,
    env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  """Runs ``python *argv`` from the tree's root, with this tree's jt_dist.

  The child gets an empty jt_dist disk cache of its own, the device count
  a user's plain run gets (``JT_DIST_CPU_DEVICES`` is dropped), and no GPU
  memory preallocation: a test process may already hold most of a GPU,
  and a child that preallocates too logs each failed attempt to stderr.

  Args:
    argv: the interpreter's arguments, e.g. ``["examples/add.py"]`` or
      ``["-c", code]``.
    stdin: text to feed the child.
    timeout: seconds before the child is killed (the test then fails).
    env: variables to set on top of this process's environment.

  Returns:
    The finished process, with stdout and stderr as text.
  """
  with tempfile.TemporaryDirectory() as cache:
    child = fork_server.tree_env(ROOT, JT_DIST_CACHE_DIR=cache,
                                 XLA_PYTHON_CLIENT_PREALLOCATE="false")
    child.pop("JT_DIST_CPU_DEVICES", None)
    child.update(env or {})
    return fork_server.run(argv, input=stdin, cwd=ROOT, env=child,
                           timeout=timeout)


def assert_quiet_success(test, result: subprocess.CompletedProcess,
                         what: str) -> None:
  """Fails ``test`` unless ``result`` exited 0 with an empty stderr.

  Args:
    test: the ``unittest.TestCase`` to fail.
    result: from ``run_python``.
    what: what ran, for the failure message (e.g. "examples/add.py").
  """
  test.assertEqual(result.returncode, 0,
                   f"{what} exited with {result.returncode}:\n{result.stderr}")
  test.assertEqual(without_plugin_lines(result.stderr), "",
                   f"{what} wrote to stderr (import jt_dist before jax?)")
