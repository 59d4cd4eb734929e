"""Helpers for absltest suites of Triton kernels, on GPUs or the CPU.

Suites written with these helpers run unchanged on real GPUs and, through
Triton's interpreter, on virtual CPU devices: call
``configure_cpu_devices()`` before JAX starts, derive test classes from
``TestCase``, and ask for devices with ``require_devices``.

``run_processes`` starts a script as several processes joined by
``jax.distributed`` (virtual CPU devices in each, or one GPU each), and
fails with every process's output when one of them dies, raises or hangs;
the script joins with ``initialize_process()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import types
from typing import Any, Callable, Iterator, Sequence

from absl.testing import parameterized
import jax
import numpy as np
import triton
import triton.language as tl

__all__ = [
    "MultiProcessError",
    "ProcessOutput",
    "TestCase",
    "configure_cpu_devices",
    "free_port",
    "initialize_process",
    "platform",
    "run_processes",
    "tag_kernel",
]

_DEFAULT_CPU_DEVICES = 8


def configure_cpu_devices(count: int = _DEFAULT_CPU_DEVICES) -> None:
  """Asks JAX for ``count`` virtual CPU devices.

  Must run before JAX initialises its backends (before the first array is
  made); afterwards it has no effect. Set ``JT_DIST_CPU_DEVICES`` to override
  the count.

  Args:
    count: the number of CPU devices to create.
  """
  count = int(os.environ.get("JT_DIST_CPU_DEVICES", count))
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    pass  # Backends already initialised: keep what they have.


def platform() -> str:
  """The platform tests run on: "gpu" when JAX sees GPUs, else "cpu"."""
  return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


@triton.jit
def tag_kernel(x_ptr, n, out_ptr, tag_ptr, BLOCK: tl.constexpr,
               TAG: tl.constexpr):
  """``out = 2 * x``; program 0 also writes the constexpr ``TAG`` to ``tag``.

  Autotuned over configs that differ in ``TAG``, it shows which config ran
  on each shard (one ``tag`` element per shard), which is how the tests
  check that every shard of every process runs the same config.
  """
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2,
           mask=mask)
  if tl.program_id(0) == 0:
    tl.store(tag_ptr, TAG)


class TestCase(parameterized.TestCase):
  """An absltest case with fresh random inputs and device requirements."""

  def setUp(self):
    super().setUp()
    # A new seed per test: kernels must be right on any input, and a fixed
    # seed would let a lucky input pass forever.
    self.seed = int.from_bytes(os.urandom(4), "little")
    self.np_rng = np.random.default_rng(self.seed)

  def random(self, shape, dtype=np.float32, low=-2.0, high=2.0) -> np.ndarray:
    """Fresh random values of ``dtype``; never all zeros."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
      return self.np_rng.random(shape) < 0.5
    if dtype.kind in "iu":
      lo = max(int(low * 50), int(np.iinfo(dtype).min))
      hi = min(int(high * 50), int(np.iinfo(dtype).max))
      return self.np_rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    values = self.np_rng.uniform(low, high, size=shape)
    return values.astype(dtype)

  def devices(self, count: int | None = None) -> list[Any]:
    """The local devices of the test platform, or skips if too few."""
    devices = jax.devices()
    if count is not None and len(devices) < count:
      kind = "GPUs" if platform() == "gpu" else f"{devices[0].platform} devices"
      self.skipTest(f"needs >={count} {kind}, found {len(devices)}")
    return devices if count is None else devices[:count]

  @contextlib.contextmanager
  def assertRaisesKernelError(self, error_type: type[BaseException],
                              *, jitted: bool) -> Iterator[Any]:
    """Expects a kernel's ``error_type`` out of the ``with`` block.

    Outside any trace a call raises the kernel's own exception; inside the
    caller's ``jax.jit`` the kernel runs in a host callback (on the CPU),
    and jax's error (``JaxRuntimeError``, or ``ValueError`` in some jax
    versions) carries the kernel's exception type and message.

    Args:
      error_type: the kernel's exception type.
      jitted: whether the call runs inside the caller's ``jax.jit``.

    Yields:
      An object whose ``message`` is the kernel's message, once raised.
    """
    caught = types.SimpleNamespace(message=None)
    expected = Exception if jitted else error_type
    with self.assertRaises(expected) as raised:
      yield caught
    message = str(raised.exception)
    if jitted:
      head = f"{error_type.__name__}: "
      self.assertIn(head, message)
      message = message[message.index(head) + len(head):]
    caught.message = message

  def assertAllClose(self, actual, expected, *, rtol=1e-5, atol=1e-5,
                     msg: str = ""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    self.assertEqual(actual.shape, expected.shape, msg)
    np.testing.assert_allclose(
        actual.astype(np.float64) if actual.dtype.kind == "V" else actual,
        expected, rtol=rtol, atol=atol,
        err_msg=f"{msg} (seed {self.seed})")

  def assertDotClose(self, actual, expected, *, cpu_rtol=1e-4, cpu_atol=1e-3,
                     gpu_error=1e-2):
    """Compares a result of dot products with ``expected`` (say, NumPy's).

    On the CPU element by element; on GPUs, which compute a float32
    ``tl.dot`` in TF32 (10-bit mantissa), by the relative Frobenius error.
    """
    if platform() != "gpu":
      self.assertAllClose(actual, expected, rtol=cpu_rtol, atol=cpu_atol)
      return
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    self.assertEqual(actual.shape, expected.shape)
    error = np.linalg.norm(actual - expected) / np.linalg.norm(expected)
    self.assertLess(error, gpu_error, f"(seed {self.seed})")


# --- Several processes joined by jax.distributed --------------------------

_ENV_COORDINATOR = "JT_DIST_COORDINATOR"
_ENV_NUM_PROCESSES = "JT_DIST_NUM_PROCESSES"
_ENV_PROCESS_ID = "JT_DIST_PROCESS_ID"
# Where a process writes the traceback of an exception it did not catch.
_ENV_FAILURE_FILE = "JT_DIST_FAILURE_FILE"
_TRACEBACK_START = "Traceback (most recent call last):"
# After one process fails, the others get this long to fail or finish too:
# a peer blocked in a collective with a dead process would otherwise wait
# for jax.distributed's own heartbeat timeout.
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
        try:
          found.append(json.loads(line))
        except ValueError:
          pass
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
  _report_uncaught_exceptions(os.environ.get(_ENV_FAILURE_FILE))
  if os.environ.get("JAX_PLATFORMS", "") == "cpu":
    configure_cpu_devices(int(os.environ.get("JT_DIST_CPU_DEVICES", 4)))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=os.environ[_ENV_COORDINATOR],
      num_processes=num_processes, process_id=process_id)
  return process_id, num_processes


def _report_uncaught_exceptions(path: str | None) -> None:
  """Writes an uncaught exception's traceback to ``path`` for the parent."""
  if not path:
    return
  previous = sys.excepthook

  def hook(kind, value, tb):
    previous(kind, value, tb)
    text = "".join(traceback.format_exception(kind, value, tb))
    try:
      # Renamed into place: the parent never reads half a traceback.
      with open(path + ".tmp", "w") as f:
        f.write(text)
      os.replace(path + ".tmp", path)
    except OSError:
      pass  # The exit status and stderr still tell the parent.

  sys.excepthook = hook


def _process_env(base, port, process_id, num_processes, cpu_devices,
                 gpus_per_process):
  env = dict(os.environ if base is None else base)
  env.update({
      _ENV_COORDINATOR: f"localhost:{port}",
      _ENV_NUM_PROCESSES: str(num_processes),
      _ENV_PROCESS_ID: str(process_id),
      "PYTHONUNBUFFERED": "1",
  })
  # The children import the jt_dist this process runs, not another copy
  # installed elsewhere.
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
  env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in path if p != root])
  if gpus_per_process:
    first = process_id * gpus_per_process
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        str(first + i) for i in range(gpus_per_process))
    env.pop("JAX_PLATFORMS", None)
  else:
    env["JAX_PLATFORMS"] = "cpu"
    env["JT_DIST_CPU_DEVICES"] = str(cpu_devices)
  return env


def _report(outputs: Sequence[ProcessOutput], headline: str,
            failed: Sequence[int] = ()) -> str:
  parts = [headline]
  for out in outputs:
    status = ("killed by run_processes" if out.returncode is None
              else f"exit status {out.returncode}")
    if out.returncode is None and out.process_id in failed:
      status = "raised, then " + status
    parts.append(
        f"----- process {out.process_id} ({status}) stdout -----\n"
        f"{out.stdout[-6000:]}\n"
        f"----- process {out.process_id} stderr -----\n{out.stderr[-6000:]}")
  return "\n".join(parts)


def _wait(procs, markers, deadline: float,
          grace_s: float) -> tuple[set[int], str, list[int]]:
  """Waits for every process.

  Returns:
    The processes killed, why ("timeout", "failure" or "" if none), and
    those that failed (exited with an error or wrote a traceback to their
    marker), in the order they were seen to fail.
  """
  failed: list[int] = []
  failed_at = None
  while True:
    codes = [p.poll() for p in procs]
    failed += [i for i, c in enumerate(codes) if i not in failed and (
        c not in (None, 0) or os.path.exists(markers[i]))]
    if all(c is not None for c in codes):
      return set(), "", failed
    now = time.monotonic()
    if failed_at is None and failed:
      failed_at = now
    timed_out = now > deadline
    if timed_out or (failed_at is not None and now > failed_at + grace_s):
      killed = set()
      for i, p in enumerate(procs):
        if p.poll() is None:
          os.killpg(p.pid, signal.SIGKILL)  # Its own session: see Popen.
          p.wait()
          killed.add(i)
      return killed, "timeout" if timed_out else "failure", failed
    time.sleep(0.05)


def _traceback(marker: str, stderr: str) -> str:
  """The traceback a process reported, else the last one in its stderr."""
  try:
    with open(marker) as f:
      return f.read()
  except OSError:
    start = stderr.rfind(_TRACEBACK_START)
    return stderr[start:] if start >= 0 else ""


def _run_once(argv, num_processes, env_for, timeout_s, grace_s, cwd, popen):
  """Runs the group once: outputs, why it was killed, failed, tracebacks."""
  with tempfile.TemporaryDirectory(prefix="jt_dist_procs_") as logs:
    procs, files = [], []
    markers = [os.path.join(logs, f"{i}.traceback")
               for i in range(num_processes)]
    for i in range(num_processes):
      out = open(os.path.join(logs, f"{i}.out"), "w+")
      err = open(os.path.join(logs, f"{i}.err"), "w+")
      files.append((out, err))
      # A session of its own, so that a hung process and anything it
      # started can be killed together by its process group id.
      procs.append(popen(
          list(argv), env={**env_for(i), _ENV_FAILURE_FILE: markers[i]},
          cwd=cwd, stdout=out, stderr=err, start_new_session=True))
    killed, why, failed = _wait(procs, markers, time.monotonic() + timeout_s,
                                grace_s)
    outputs = []
    for i, (p, (out, err)) in enumerate(zip(procs, files)):
      out.seek(0)
      err.seek(0)
      code = None if i in killed else p.returncode
      outputs.append(ProcessOutput(i, code, out.read(), err.read()))
      out.close()
      err.close()
    tracebacks = {i: _traceback(markers[i], outputs[i].stderr)
                  for i in failed}
  return outputs, why, failed, tracebacks


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
    outputs, why, failed, tracebacks = _run_once(
        argv, num_processes,
        lambda i, port=port: _process_env(env, port, i, num_processes,
                                          cpu_devices_per_process,
                                          gpus_per_process),
        timeout_s, grace_s, cwd, popen)
    # The port was free when chosen but another program may take it
    # before the coordinator binds it: then try another one.
    if not any(m in o.stderr for o in outputs for m in _PORT_IN_USE):
      break
  _raise_if_failed(argv, num_processes, outputs, why, failed, tracebacks,
                   timeout_s, grace_s)
  return outputs


def _raise_if_failed(argv, num_processes, outputs, why, failed, tracebacks,
                     timeout_s, grace_s) -> None:
  """Raises ``MultiProcessError`` for a failed or timed-out group."""
  if failed:
    first = failed[0]
    headline = (
        f"run_processes: {argv} failed in process(es) {sorted(failed)} of"
        f" {num_processes}; process {first} failed first, and any process"
        f" still running {grace_s:g} s later was killed.")
    if why == "timeout":
      headline += f" The group also ran past timeout_s={timeout_s:g}."
    text = tracebacks.get(first) or "(none printed)"
    headline += f"\n----- process {first} traceback -----\n{text[-6000:]}"
    raise MultiProcessError(_report(outputs, headline, failed))
  if why == "timeout":
    raise MultiProcessError(_report(outputs, (
        f"run_processes: {argv} in {num_processes} processes did not finish"
        f" within {timeout_s:g} s; the processes still running were"
        " killed.")))


def _checked_count(num_processes: Any) -> int:
  if isinstance(num_processes, bool):
    count = None
  else:
    try:
      count = operator.index(num_processes)
    except TypeError:
      count = None
  if count is None:
    raise TypeError(
        f"run_processes: num_processes={num_processes!r} of type"
        f" {type(num_processes).__name__} must be an int, e.g. 2.")
  if count < 1:
    raise ValueError(
        f"run_processes: num_processes={count} must be at least 1; with"
        " none, nothing would run and a test built on it would pass"
        " without running anything.")
  return count
