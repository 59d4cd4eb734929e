"""Runs a test's Python child in a fork of a process that imported jt_dist.

A fresh interpreter spends about a second importing jax, Triton and jt_dist
before a test's script starts, and the suites start dozens of them (every
documentation chain, every example, the doctor, every ``jax.distributed``
group). A *fork server* imports them once, as ``import jt_dist`` does, and
forks a child per run (``tests/fork_server_child.py``): the child applies
the run's environment, directory, arguments and standard streams, runs the
code as ``python`` would, and exits with its status.

- ``run`` and ``run_together`` are ``subprocess.run`` for one child or for
  several that start together and race (the disk cache's writers);
- ``popen`` is ``subprocess.Popen`` for ``jt_dist.testing.run_processes``:
  the processes of a ``jax.distributed`` group start as forks, and the
  harness polls, waits for and kills them as it would real ones.

What the child cannot see is the import itself. So a run takes a real
process instead when:

- its code imports jax before jt_dist (that order is what writes the CUDA
  plugin's start-up lines on a host without GPUs, which the tests must see);
- its environment differs from the server's in a variable read while
  importing (``JAX_*``, ``TRITON_*``, ``PYTHON*``, ``TF_*``, ``LD_*``,
  thread counts): one server serves each such environment. Three of them
  are not: ``JAX_PLATFORMS`` and ``JAX_ENABLE_X64`` only give jax options
  their defaults, and no server has started a backend, so the child sets
  those options from its environment (``jax.config.update``), as the import
  would have; ``PYTHONUNBUFFERED`` makes the child's streams write through;
- ``JT_DIST_TEST_FORK_SERVER=0``, or the platform has no ``fork``.

Variables read later (``XLA_FLAGS``, ``JT_DIST_*``, ``CUDA_VISIBLE_DEVICES``,
``XLA_PYTHON_CLIENT_*``) are set in the child before its code runs, and no
server ever starts a JAX backend. Tests whose point is a fresh interpreter
(the import's own output, signals, the harness's own process handling) keep
``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

import fork_server_child

ENV_VAR = "JT_DIST_TEST_FORK_SERVER"
_IMPORT_TIME_PREFIXES = ("JAX_", "TRITON_", "PYTHON", "TF_", "LD_",
                         "OMP_", "OPENBLAS_", "MKL_")
_FIRST_IMPORT = re.compile(r"^\s*(?:import|from)\s+(jax|jt_dist)\b", re.M)
_MAX_SERVERS = 3
# Import-time variables whose effect a child applies itself
# (``fork_server_child``): two jax options' defaults, and unbuffered streams.
_SET_BY_CHILD = ("JAX_PLATFORMS", "JAX_ENABLE_X64", "PYTHONUNBUFFERED")
# The values jax reads as false for a boolean variable (and as true:
# ``fork_server_child.TRUE_VALUES``).
_FALSE = ("", "n", "no", "f", "false", "off", "0")

def _enabled() -> bool:
  return (hasattr(os, "fork")
          and os.environ.get(ENV_VAR, "1").strip().lower()
          not in ("0", "false", "off", "no"))


def imports_jt_dist_first(code: str) -> bool:
  """Whether ``code``'s first import of jax or jt_dist is jt_dist's."""
  found = _FIRST_IMPORT.search(code)
  return found is None or found.group(1) == "jt_dist"


def _import_env(env: dict[str, str]) -> tuple:
  return tuple(sorted((k, v) for k, v in env.items()
                      if k.startswith(_IMPORT_TIME_PREFIXES)
                      and k not in _SET_BY_CHILD))


def _options_readable(env: dict[str, str]) -> bool:
  """Whether a child can set the jax options of ``env`` itself."""
  x64 = env.get("JAX_ENABLE_X64", "").strip().lower()
  return x64 in fork_server_child.TRUE_VALUES or x64 in _FALSE


# Imported lazily by a run's first kernel, lowering or collective (Triton's
# code generator with Gluon, which the interpreter's scalar conversion also
# imports; libdevice; jax's buffer callbacks, multi-host helpers and MLIR
# dialects): about 0.1 s per child otherwise. A module that this Triton or
# jax lacks is skipped.
_PRELOADED = ("triton.compiler.code_generator",
              "triton.language.extra.libdevice",
              "jax.experimental.buffer_callback",
              "jax.experimental.multihost_utils",
              "jaxlib.mlir.dialects.builtin", "jaxlib.mlir.dialects.mhlo")

# The server imports what every run imports first, then this directory's
# fork_server_child, whose loop serves the requests.
_SERVER = r"""
import gc, importlib, os, sys
base_path = list(sys.path)
import jt_dist  # jax and Triton, imported as users import them.
for name in sys.argv[2:]:
  try:
    importlib.import_module(name)
  except ImportError:
    pass
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import fork_server_child
sys.path[:] = base_path
fork_server_child.BASE_PATH = base_path
# The children's full collections then skip what the imports made.
gc.collect()
gc.freeze()
fork_server_child.serve(sys.stdin.fileno(), sys.stdout.fileno())
"""


class _Server:
  """One server process; any number of children, from any thread.

  A reader thread takes the server's lines: the answer to a request (its
  children's pids) goes to the thread that sent it, and each child's exit
  status is kept, by pid, for whoever polls or waits for that child.
  """

  def __init__(self, env: dict[str, str], cwd: str):
    self._send_lock = threading.Lock()  # One request and its answer at once.
    self._exited = threading.Condition()
    self._statuses: dict[int, int] = {}
    self._answers: queue.Queue = queue.Queue()
    self.alive = True
    self.process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, os.path.abspath(__file__),
         *_PRELOADED],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    threading.Thread(target=self._read, daemon=True,
                     name="fork-server-reader").start()
    if not self._answer(120).get("ready"):
      self.close()
      raise RuntimeError("the fork server did not start")

  def _read(self) -> None:
    buffer = b""
    fd = self.process.stdout.fileno()
    while chunk := os.read(fd, 65536):
      *lines, buffer = (buffer + chunk).split(b"\n")
      for line in lines:
        message = json.loads(line)
        with self._exited:
          if "exit" in message:
            self._statuses[message["exit"]] = message["status"]
            self._exited.notify_all()
          else:
            # New children: a status kept under a reused pid is stale.
            for pid in message.get("pids", ()):
              self._statuses.pop(pid, None)
            self._answers.put(message)
    with self._exited:
      self.alive = False
      self._exited.notify_all()
    self._answers.put({})

  def _answer(self, timeout: float) -> dict:
    try:
      return self._answers.get(timeout=timeout)
    except queue.Empty:
      return {}

  def start(self, requests: list[dict]) -> list[int]:
    """Forks a child per request; their pids."""
    with self._send_lock:
      if not self.alive:
        raise RuntimeError("the fork server exited")
      self.process.stdin.write(
          json.dumps({"group": requests}).encode() + b"\n")
      self.process.stdin.flush()
      pids = self._answer(60).get("pids")
    if pids is None:
      raise RuntimeError("the fork server did not answer")
    return pids

  def status(self, pid: int) -> int | None:
    """The child's exit status, or None while it runs."""
    with self._exited:
      return self._statuses.get(pid)

  def wait(self, pids: Sequence[int],
           timeout: float | None) -> list[int] | None:
    """The children's exit statuses, or None if one runs past ``timeout``."""
    with self._exited:
      self._exited.wait_for(
          lambda: not self.alive or all(p in self._statuses for p in pids),
          timeout)
      if all(p in self._statuses for p in pids):
        return [self._statuses[p] for p in pids]
      if not self.alive:
        raise RuntimeError("the fork server exited")
      return None

  def close(self) -> None:
    """Ends the server, and with it every child still running."""
    try:
      self.process.stdin.close()
      self.process.wait(timeout=10)
    except Exception:  # pylint: disable=broad-except
      self.process.kill()


def _kill_groups(pids: Sequence[int]) -> None:
  for pid in pids:
    try:
      os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


_servers: dict[tuple, _Server] = {}
_servers_lock = threading.Lock()


def _server(env: dict[str, str], cwd: str) -> _Server:
  key = (_import_env(env), cwd)
  with _servers_lock:
    server = _servers.get(key)
    if server is None or server.process.poll() is not None:
      if len(_servers) >= _MAX_SERVERS:
        _servers.pop(next(iter(_servers))).close()
      server = _servers[key] = _Server(env, cwd)
    return server


@atexit.register
def _close_all() -> None:
  for server in _servers.values():
    server.close()
  _servers.clear()


def tree_env(root: str, **updates: str) -> dict[str, str]:
  """This process's environment with ``root`` first on ``PYTHONPATH``.

  ``updates`` are applied last. Children whose environments come from here
  agree on ``PYTHONPATH``, so that they share a server wherever their other
  import-time variables agree too.
  """
  path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
  return {**os.environ, "PYTHONPATH": path, **updates}


def run(argv: Sequence[str], *, env: dict[str, str], cwd: str,
        input: str | None = None,  # pylint: disable=redefined-builtin
        timeout: float | None = None) -> subprocess.CompletedProcess:
  """``subprocess.run([sys.executable, *argv], capture_output=True, text=True)``.

  Runs in a fork of a server when the run allows it (see the module's
  docstring), else in a real process.

  Args:
    argv: the interpreter's arguments: ``["-c", code, ...]``,
      ``["-m", module, ...]`` or ``[script, ...]``.
    env: the child's whole environment.
    cwd: its working directory.
    input: text for its standard input.
    timeout: seconds before the child is killed and TimeoutExpired raised.
  """
  return run_together([argv], env=env, cwd=cwd, input=input,
                      timeout=timeout)[0]


def run_together(argvs: Sequence[Sequence[str]], *, env: dict[str, str],
                 cwd: str, input: str | None = None,  # pylint: disable=redefined-builtin
                 timeout: float | None = None
                 ) -> list[subprocess.CompletedProcess]:
  """``run`` for several children at once: they start together and race.

  All are forks of one server, or (where a run does not allow it) all are
  real processes, started before any is waited for.

  Args:
    argvs: each child's interpreter arguments, as ``run``'s ``argv``.
    env: every child's whole environment.
    cwd: their working directory.
    input: text for each one's standard input.
    timeout: seconds (for the whole group) before every child still
      running is killed and TimeoutExpired raised.
  """
  argvs = [list(argv) for argv in argvs]
  server = _server_for(argvs, env, cwd, input)
  if server is not None:
    return _run_forked(server, argvs, env, cwd, input, timeout)
  return _run_real(argvs, env, cwd, input, timeout)


def _server_for(argvs, env, cwd, input):  # pylint: disable=redefined-builtin
  """The server that may fork these runs, or None for real processes."""
  if not (_enabled() and _options_readable(env)
          and all(_eligible(a, input, cwd) for a in argvs)):
    return None
  try:
    return _server(env, cwd)
  except (OSError, RuntimeError):
    return None


def _run_real(argvs, env, cwd, input, timeout):  # pylint: disable=redefined-builtin
  """Real processes, all started before the first is waited for."""
  processes = [
      subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=env, cwd=cwd)
      for argv in argvs]
  deadline = None if timeout is None else time.monotonic() + timeout
  done = []
  try:
    for argv, process in zip(argvs, processes):
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      stdout, stderr = process.communicate(input, timeout=left)
      done.append(subprocess.CompletedProcess(
          [sys.executable, *argv], process.returncode, stdout, stderr))
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()
  return done


def _eligible(argv: list[str], input: str | None, cwd: str) -> bool:  # pylint: disable=redefined-builtin
  if not argv:
    return False
  if argv[0] == "-c":
    code = argv[1] + "\n" + _payload_code(input)
  elif argv[0] == "-m":
    return len(argv) > 1 and argv[1].split(".")[0] == "jt_dist"
  elif argv[0].startswith("-"):
    return False
  else:
    try:
      with open(os.path.join(cwd, argv[0]), encoding="utf-8") as f:
        code = f.read()
    except OSError:
      return False
  return imports_jt_dist_first(code)


def _payload_code(text: str | None) -> str:
  """The code in a run's standard input: the docs' runner reads its blocks
  there, as JSON ``[path, line, code]`` triples."""
  if not text:
    return ""
  try:
    blocks = json.loads(text)
    return "\n".join(code for _, _, code in blocks)
  except (ValueError, TypeError):
    return text


def _run_forked(server, argvs, env, cwd, input, timeout):  # pylint: disable=redefined-builtin
  with tempfile.TemporaryDirectory() as tmp:
    requests = []
    for i, argv in enumerate(argvs):
      paths = {name: os.path.join(tmp, f"{i}.{name}")
               for name in ("stdin", "stdout", "stderr")}
      with open(paths["stdin"], "w", encoding="utf-8") as f:
        f.write(input or "")
      requests.append({"argv": argv, "env": env, "cwd": cwd, **paths})
    pids = server.start(requests)
    statuses = server.wait(pids, timeout)
    if statuses is None:
      _kill_groups(pids)
      server.wait(pids, 60)
      raise subprocess.TimeoutExpired([sys.executable, *argvs[0]], timeout)
    done = []
    for argv, request, status in zip(argvs, requests, statuses):
      with open(request["stdout"], encoding="utf-8", errors="replace") as f:
        stdout = f.read()
      with open(request["stderr"], encoding="utf-8", errors="replace") as f:
        stderr = f.read()
      done.append(subprocess.CompletedProcess([sys.executable, *argv], status,
                                              stdout, stderr))
  return done


class Process:
  """A forked child, as ``subprocess.Popen`` shows a process: see ``popen``.

  It leads a session of its own (as ``start_new_session=True`` would
  have it), so ``os.killpg(process.pid, ...)`` reaches what it started too.
  """

  def __init__(self, args: list[str], server: _Server, pid: int):
    self.args = args
    self.pid = pid
    self.returncode: int | None = None
    self._server = server

  def poll(self) -> int | None:
    if self.returncode is None:
      self.returncode = self._server.status(self.pid)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None:
      statuses = self._server.wait([self.pid], timeout)
      if statuses is None:
        raise subprocess.TimeoutExpired(self.args, timeout)
      self.returncode = statuses[0]
    return self.returncode

  def kill(self) -> None:
    if self.poll() is None:
      _kill_groups([self.pid])


def popen(args: Sequence[str], *, env: dict[str, str] | None = None,
          cwd: str | None = None, stdout=None, stderr=None,
          start_new_session: bool = False, **kwargs):
  """``subprocess.Popen(args, ...)``, forked from a server where it may be.

  Made for ``jt_dist.testing.run_processes(..., popen=fork_server.popen)``:
  a group's processes start in a fraction of a second each, and the harness
  polls, waits for and kills them as it would real ones. The run is forked
  when ``args`` is ``[sys.executable, ...]`` as ``run`` would fork it, and
  both streams are files with names (the child writes to them by name);
  anything else starts a real process with every argument as given.

  Returns:
    A ``Process`` for a forked child, else the ``subprocess.Popen``.
  """
  args = list(args)
  env = dict(os.environ if env is None else env)
  cwd = os.getcwd() if cwd is None else cwd
  named = all(isinstance(getattr(s, "name", None), str)
              for s in (stdout, stderr))
  server = None
  if not kwargs and named and args[:1] == [sys.executable]:
    server = _server_for([args[1:]], env, cwd, None)
  if server is None:
    return subprocess.Popen(args, env=env, cwd=cwd, stdout=stdout,
                            stderr=stderr, start_new_session=start_new_session,
                            **kwargs)
  (pid,) = server.start([{"argv": args[1:], "env": env, "cwd": cwd,
                          "stdin": os.devnull, "stdout": stdout.name,
                          "stderr": stderr.name}])
  return Process(args, server, pid)
