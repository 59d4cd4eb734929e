"""``jt_dist.testing``'s tests over processes joined by jax.distributed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import jax

from jt_dist import _settings
from jt_dist._backend import cache as _cache


def configure_cpu_devices(count: int = 8) -> None:
  """Asks JAX for ``count`` virtual CPU devices.

  Must run before JAX initialises its backends (before the first array is
  made); afterwards it has no effect. Set ``JT_DIST_CPU_DEVICES`` to override
  the count.

  Args:
    count: the number of CPU devices to create.
  """
  # Backends already initialised keep what they have.
  with contextlib.suppress(RuntimeError):
    jax.config.update("jax_num_cpu_devices", _settings.cpu_devices(count))


# run_processes' protocol with its processes; no user sets it (not settings).
_ENV_COORDINATOR = "JT_DIST_COORDINATOR"
_ENV_NUM_PROCESSES = "JT_DIST_NUM_PROCESSES"
_ENV_PROCESS_ID = "JT_DIST_PROCESS_ID"
_ENV_FAILURE_FILE = "JT_DIST_FAILURE_FILE"  # Gets an uncaught traceback.
_TRACEBACK_START = "Traceback (most recent call last):"
# How long the others run on after one process failed: a peer blocked in a
# collective with it would otherwise wait for jax.distributed's heartbeat.
_GRACE_S = 10.0
_PORT_IN_USE = ("Address already in use", "address already in use",
                "Failed to add port")


class MultiProcessError(AssertionError):
  """A process of ``run_processes`` failed, hung or could not start."""


@dataclasses.dataclass(frozen=True)
class ProcessOutput:
  """What one process of ``run_processes`` printed, and how it ended.

  Attributes:
    process_id: its ``jax.process_index()``.
    returncode: its exit status; None when ``run_processes`` killed it
      (at the timeout, or after another process failed).
    stdout: everything it printed to stdout.
    stderr: everything it printed to stderr.
  """

  process_id: int
  returncode: int | None
  stdout: str
  stderr: str

  def json_lines(self) -> list[Any]:
    """Every stdout line that is a JSON document, parsed, in order."""
    found = []
    for line in self.stdout.splitlines():
      line = line.strip()
      if line.startswith(("{", "[")):
        with contextlib.suppress(ValueError):
          found.append(json.loads(line))
    return found


def free_port() -> int:
  """A TCP port on localhost that no one listens on at the moment."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def initialize_process() -> tuple[int, int]:
  """Joins this process to a ``run_processes`` group with jax.distributed.

  Call it first thing in a script started by ``run_processes``, before any
  array is made. On the CPU it asks for the per-process device count and
  for the CPU collectives (gloo) that cross-process computations need.

  It also wraps ``sys.excepthook`` (the previous hook still runs) so that
  an exception the script does not catch reaches ``run_processes`` with its
  traceback at once: the process may never exit by itself, as
  ``jax.distributed``'s shutdown waits for peers that may be blocked in a
  collective.

  Returns:
    ``(process_id, num_processes)``.

  Raises:
    RuntimeError: the script was not started by ``run_processes``.
  """
  if _ENV_COORDINATOR not in os.environ:
    raise RuntimeError(
        "initialize_process: JT_DIST_COORDINATOR is not set; start this"
        " script with jt_dist.testing.run_processes(...).")
  process_id = int(os.environ[_ENV_PROCESS_ID])
  num_processes = int(os.environ[_ENV_NUM_PROCESSES])
  if os.environ.get(_ENV_FAILURE_FILE):
    _report_uncaught_exceptions(os.environ[_ENV_FAILURE_FILE])
  if os.environ.get("JAX_PLATFORMS", "") == "cpu":
    configure_cpu_devices(4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=os.environ[_ENV_COORDINATOR],
      num_processes=num_processes, process_id=process_id)
  return process_id, num_processes


def _report_uncaught_exceptions(path: str) -> None:
  previous = sys.excepthook

  def hook(kind, value, tb):
    previous(kind, value, tb)
    text = "".join(traceback.format_exception(kind, value, tb))
    # Written atomically: the parent never reads half a traceback. Failing,
    # the exit status and stderr still tell the parent.
    with contextlib.suppress(OSError):
      _cache._atomic_write(  # pylint: disable=protected-access
          os.path.dirname(path), path, text.encode())

  sys.excepthook = hook


def _process_env(base, port, process_id, num_processes, cpu_devices,
                 gpus_per_process):
  env = {**(os.environ if base is None else base),
         _ENV_COORDINATOR: f"localhost:{port}",
         _ENV_NUM_PROCESSES: str(num_processes),
         _ENV_PROCESS_ID: str(process_id), "PYTHONUNBUFFERED": "1"}
  # The children import this jt_dist, not another copy installed elsewhere.
  root = os.path.abspath(os.path.join(__file__, "..", "..", ".."))
  path = env.get("PYTHONPATH", "").split(os.pathsep)
  env["PYTHONPATH"] = os.pathsep.join(
      [root] + [p for p in path if p and p != root])
  if gpus_per_process:
    first = process_id * gpus_per_process
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        str(first + i) for i in range(gpus_per_process))
    env.pop("JAX_PLATFORMS", None)
  else:
    env["JAX_PLATFORMS"] = "cpu"
    env[_settings.CPU_DEVICES] = str(cpu_devices)
  return env


def _wait(procs, markers, deadline: float,
          grace_s: float) -> tuple[set[int], bool, list[int]]:
  """``(killed, timed_out, failed)``; ``failed`` in the order seen."""
  failed: list[int] = []
  failed_at = None
  while True:
    codes = [p.poll() for p in procs]
    failed += [i for i, c in enumerate(codes) if i not in failed and (
        c not in (None, 0) or os.path.exists(markers[i]))]
    if None not in codes:
      return set(), False, failed
    now = time.monotonic()
    if failed_at is None and failed:
      failed_at = now
    timed_out = now > deadline
    if timed_out or (failed_at is not None and now > failed_at + grace_s):
      killed = {i for i, p in enumerate(procs) if p.poll() is None}
      for i in killed:
        os.killpg(procs[i].pid, signal.SIGKILL)  # Its own session: Popen.
        procs[i].wait()
      return killed, timed_out, failed
    time.sleep(0.05)


def _run_once(argv, envs, timeout_s, grace_s, cwd, popen):
  """Runs the group once: outputs, timed_out, failed, first traceback."""
  with tempfile.TemporaryDirectory(prefix="jt_dist_procs_") as logs:
    procs = []
    markers = [os.path.join(logs, f"{i}.traceback") for i in range(len(envs))]
    for i, env in enumerate(envs):
      with open(os.path.join(logs, f"{i}.out"), "w") as out, \
          open(os.path.join(logs, f"{i}.err"), "w") as err:
        # Its own session: killpg then ends it and all it started.
        procs.append(popen(
            list(argv), env={**env, _ENV_FAILURE_FILE: markers[i]},
            cwd=cwd, stdout=out, stderr=err, start_new_session=True))
    killed, timed_out, failed = _wait(
        procs, markers, time.monotonic() + timeout_s, grace_s)
    outputs = [ProcessOutput(i, None if i in killed else p.returncode,
                             *(pathlib.Path(logs, f"{i}.{s}").read_text()
                               for s in ("out", "err")))
               for i, p in enumerate(procs)]
    first = ""
    if failed:
      # The traceback the process reported, else the last in its stderr.
      try:
        first = pathlib.Path(markers[failed[0]]).read_text()
      except OSError:
        stderr = outputs[failed[0]].stderr
        start = stderr.rfind(_TRACEBACK_START)
        first = stderr[start:] if start >= 0 else ""
  return outputs, timed_out, failed, first


def run_processes(argv: Sequence[str], *, num_processes: int = 2,
                  cpu_devices_per_process: int = 4,
                  gpus_per_process: int | None = None,
                  timeout_s: float = 300.0, grace_s: float = _GRACE_S,
                  env: dict | None = None,
                  cwd: str | None = None,
                  popen: Callable[..., Any] = subprocess.Popen
                  ) -> list[ProcessOutput]:
  """Runs ``argv`` as ``num_processes`` processes joined by jax.distributed.

  Each process gets its id, the group size and a free localhost port for
  the coordinator through the environment; the script calls
  ``initialize_process()`` to join. On the CPU every process has
  ``cpu_devices_per_process`` virtual devices; with ``gpus_per_process``
  each sees only its own GPUs (``CUDA_VISIBLE_DEVICES``).

  Args:
    argv: the command, e.g. ``[sys.executable, "worker.py"]``.
    num_processes: how many processes to start (at least 1).
    cpu_devices_per_process: virtual CPU devices per process.
    gpus_per_process: GPUs per process; None runs on the CPU.
    timeout_s: the most the whole group may take.
    grace_s: how long the others may run on once one process failed.
    env: the base environment (default: this process's).
    cwd: the working directory.
    popen: starts each process, called as ``subprocess.Popen`` is:
      ``popen(argv, env=..., cwd=..., stdout=file, stderr=file,
      start_new_session=True)``. The object it returns needs ``pid`` (the
      process group to kill), ``poll()``, ``wait()`` and ``returncode``.
      Pass a launcher of your own, e.g. one that forks a process that has
      already imported jax, where a fresh interpreter per process costs
      too much.

  Returns:
    One ``ProcessOutput`` per process, by process id.

  Raises:
    MultiProcessError: a process exited with an error or raised an
      exception it did not catch (seen when it raises if it joined with
      ``initialize_process()``, else when it exits), or the group ran past
      ``timeout_s``. After a failure the others, and the failed process
      if it has not exited (``jax.distributed``'s shutdown can wait
      forever), are killed ``grace_s`` later at the latest. The message
      names the first process seen to fail and gives its traceback, then
      every process's stdout and stderr.
    TypeError: ``num_processes`` is not an int.
    ValueError: ``num_processes`` is below 1.
  """
  num_processes = _checked_count(num_processes)
  for _ in range(3):
    port = free_port()
    envs = [_process_env(env, port, i, num_processes, cpu_devices_per_process,
                         gpus_per_process) for i in range(num_processes)]
    outputs, timed_out, failed, first_traceback = _run_once(
        argv, envs, timeout_s, grace_s, cwd, popen)
    # Another program may bind the free port first: then try another one.
    if not any(m in o.stderr for o in outputs for m in _PORT_IN_USE):
      break
  _raise_if_failed(argv, num_processes, outputs, timed_out, failed,
                   first_traceback, timeout_s, grace_s)
  return outputs


def _raise_if_failed(argv, num_processes, outputs, timed_out, failed,
                     first_traceback, timeout_s, grace_s) -> None:
  """Raises ``MultiProcessError`` for a failed or timed-out group."""
  if failed:
    first = failed[0]
    late = (f" The group also ran past timeout_s={timeout_s:g}."
            if timed_out else "")
    text = first_traceback or "(none printed)"
    headline = (
        f"run_processes: {argv} failed in process(es) {sorted(failed)} of"
        f" {num_processes}; process {first} failed first, and any process"
        f" still running {grace_s:g} s later was killed.{late}\n"
        f"----- process {first} traceback -----\n{text[-6000:]}")
  elif timed_out:
    headline = (
        f"run_processes: {argv} in {num_processes} processes did not finish"
        f" within {timeout_s:g} s; the processes still running were killed.")
  else:
    return
  parts = [headline]
  for out in outputs:
    status = ("killed by run_processes" if out.returncode is None
              else f"exit status {out.returncode}")
    if out.returncode is None and out.process_id in failed:
      status = "raised, then killed by run_processes"
    parts.append(
        f"----- process {out.process_id} ({status}) stdout -----\n"
        f"{out.stdout[-6000:]}\n"
        f"----- process {out.process_id} stderr -----\n{out.stderr[-6000:]}")
  raise MultiProcessError("\n".join(parts))


def _checked_count(num_processes: Any) -> int:
  try:
    if isinstance(num_processes, bool):
      raise TypeError
    count = operator.index(num_processes)
  except TypeError:
    raise TypeError(
        f"run_processes: num_processes={num_processes!r} of type"
        f" {type(num_processes).__name__} must be an int, e.g. 2.") from None
  if count < 1:
    raise ValueError(
        f"run_processes: num_processes={count} must be at least 1; with"
        " none, nothing would run and a test built on it would pass"
        " without running anything.")
  return count
