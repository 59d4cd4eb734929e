"""Runs a test's Python child in a fork of a process that imported jt_dist.

A fresh interpreter spends about a second importing jax, Triton and jt_dist
before a test's script starts, and the suites start dozens of them (every
documentation chain, every example, the doctor). A *fork server* imports
them once, as ``import jt_dist`` does, and forks a child per run: the child
applies the run's environment, directory, arguments and standard streams,
runs the code as ``python`` would, and exits with its status.
``run_together`` starts several children at once (the disk cache's racing
writers): the server forks them all before it waits for any.

What the child cannot see is the import itself. So a run takes a real
process instead when:

- its code imports jax before jt_dist (that order is what writes the CUDA
  plugin's start-up lines on a host without GPUs, which the tests must see);
- its environment differs from the server's in a variable read while
  importing (``JAX_*``, ``TRITON_*``, ``PYTHON*``, ``TF_*``, ``LD_*``,
  thread counts): one server serves each such environment. Two of them are
  not: ``JAX_PLATFORMS`` and ``JAX_ENABLE_X64`` only give jax options their
  defaults, and no server has started a backend, so the child sets those
  options from its environment (``jax.config.update``), as the import
  would have;
- ``JT_DIST_TEST_FORK_SERVER=0``, or the platform has no ``fork``.

Variables read later (``XLA_FLAGS``, ``JT_DIST_*``, ``CUDA_VISIBLE_DEVICES``,
``XLA_PYTHON_CLIENT_*``) are set in the child before its code runs, and no
server ever starts a JAX backend. Tests whose point is a fresh interpreter
(the import's own output, signals, ``jax.distributed``) keep
``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Sequence

ENV_VAR = "JT_DIST_TEST_FORK_SERVER"
_IMPORT_TIME_PREFIXES = ("JAX_", "TRITON_", "PYTHON", "TF_", "LD_",
                         "OMP_", "OPENBLAS_", "MKL_")
_FIRST_IMPORT = re.compile(r"^\s*(?:import|from)\s+(jax|jt_dist)\b", re.M)
_MAX_SERVERS = 3
# Import-time variables that only set a jax option's default: a child sets
# the option itself (``_set_jax_options``).
_JAX_OPTION_VARS = ("JAX_PLATFORMS", "JAX_ENABLE_X64")
# The values jax reads as true and as false for a boolean variable.
_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("", "n", "no", "f", "false", "off", "0")
# In a server: its sys.path when it started (``python -c``: "" first).
BASE_PATH: list[str] = []

# The server: imports what every run imports first, then, per request line
# (JSON: a group of runs), forks one child per run, answers with their pids,
# and, once every one has exited, with their exit statuses.
_SERVER = r"""
import json, os, select, signal, sys
base_path = list(sys.path)
import jt_dist  # jax and Triton, imported the quiet way users import them.
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import fork_server
sys.path[:] = base_path
fork_server.BASE_PATH = base_path
control_in, control_out = sys.stdin.buffer, sys.stdout.buffer
control_out.write(b"ready\n"); control_out.flush()
while True:
  line = control_in.readline()
  if not line:
    break
  pids = []
  for request in json.loads(line)["group"]:
    pid = os.fork()
    if pid == 0:
      fork_server.child_main(request)
    pids.append(pid)
  control_out.write(json.dumps({"pids": pids}).encode() + b"\n")
  control_out.flush()
  statuses = {}
  while len(statuses) < len(pids):
    for pid in pids:
      if pid not in statuses:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
          statuses[pid] = os.waitstatus_to_exitcode(status)
    if len(statuses) == len(pids):
      break
    readable, _, _ = select.select([control_in], [], [], 0.05)
    if readable and not control_in.peek(1):
      for pid in pids:  # The test process is gone.
        if pid not in statuses:
          os.killpg(pid, signal.SIGKILL)
          os.waitpid(pid, 0)
      sys.exit(0)
  control_out.write(
      json.dumps({"statuses": [statuses[p] for p in pids]}).encode() + b"\n")
  control_out.flush()
"""


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
                      and k not in _JAX_OPTION_VARS))


def _options_readable(env: dict[str, str]) -> bool:
  """Whether a child can set the jax options of ``env`` itself."""
  x64 = env.get("JAX_ENABLE_X64", "").strip().lower()
  return x64 in _TRUE or x64 in _FALSE


def _set_jax_options(env: dict[str, str]) -> None:
  """In a child: the jax options its import would have read from ``env``."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", env.get("JAX_PLATFORMS") or None)
  jax.config.update("jax_enable_x64", env.get(
      "JAX_ENABLE_X64", "").strip().lower() in _TRUE)


class _Server:
  """One server process; serves one request (a group of runs) at a time."""

  def __init__(self, env: dict[str, str], cwd: str):
    self.lock = threading.Lock()
    self.buffer = b""
    self.process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, os.path.abspath(__file__)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    if self._readline(120) != b"ready":
      self.close()
      raise RuntimeError("the fork server did not start")

  def _readline(self, timeout: float | None) -> bytes | None:
    """One line from the server, or None after ``timeout`` seconds."""
    fd = self.process.stdout.fileno()
    deadline = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in self.buffer:
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      ready, _, _ = select.select([fd], [], [], left)
      if not ready:
        return None
      chunk = os.read(fd, 65536)
      if not chunk:
        raise RuntimeError("the fork server exited")
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    return line

  def run(self, requests: list[dict], timeout: float | None) -> list[int]:
    """The children's exit statuses; raises TimeoutExpired after killing them.

    The runs start together, each in a fork of its own, and the answer
    comes when every one has exited.
    """
    self.process.stdin.write(json.dumps({"group": requests}).encode() + b"\n")
    self.process.stdin.flush()
    line = self._readline(60)
    if line is None:
      raise RuntimeError("the fork server did not answer")
    pids = json.loads(line)["pids"]
    line = self._readline(timeout)
    if line is None:
      for pid in pids:
        try:
          os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      self._readline(60)
      raise subprocess.TimeoutExpired(requests[0]["argv"], timeout)
    return json.loads(line)["statuses"]

  def close(self) -> None:
    try:
      self.process.stdin.close()
      self.process.wait(timeout=10)
    except Exception:  # pylint: disable=broad-except
      self.process.kill()


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
  if (_enabled() and _options_readable(env)
      and all(_eligible(a, input, cwd) for a in argvs)):
    try:
      server = _server(env, cwd)
    except (OSError, RuntimeError):
      server = None
    if server is not None and server.lock.acquire(blocking=False):
      try:
        return _run_forked(server, argvs, env, cwd, input, timeout)
      finally:
        server.lock.release()
  return _run_real(argvs, env, cwd, input, timeout)


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
    statuses = server.run(requests, timeout)
    done = []
    for argv, request, status in zip(argvs, requests, statuses):
      with open(request["stdout"], encoding="utf-8", errors="replace") as f:
        stdout = f.read()
      with open(request["stderr"], encoding="utf-8", errors="replace") as f:
        stderr = f.read()
      done.append(subprocess.CompletedProcess([sys.executable, *argv], status,
                                              stdout, stderr))
  return done


def child_main(request: dict) -> None:
  """In the forked child: runs the request as ``python`` would; never returns."""
  code = 1
  try:
    os.setsid()  # Its own group: a timeout kills whatever it started too.
    _redirect(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _set_jax_options(request["env"])
    code = _run_main(request["argv"])
  except BaseException:  # pylint: disable=broad-except
    _print_exception(*sys.exc_info())
  finally:
    os._exit(_finish(code))  # pylint: disable=protected-access


def _redirect(request: dict) -> None:
  import io  # pylint: disable=g-import-not-at-top
  for fd, key, flags in ((0, "stdin", os.O_RDONLY),
                         (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                         (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    new = os.open(request[key], flags, 0o600)
    os.dup2(new, fd)
    os.close(new)
  sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False),
                               encoding="utf-8")
  sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                encoding="utf-8", line_buffering=False)
  sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                encoding="utf-8", errors="backslashreplace",
                                line_buffering=True)
  sys.__stdin__, sys.__stdout__, sys.__stderr__ = (sys.stdin, sys.stdout,
                                                   sys.stderr)


def _run_main(argv: list[str]) -> int:
  """Runs ``python *argv``'s program; its exit status."""
  import runpy  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  try:
    if argv[0] == "-c":
      sys.argv = ["-c", *argv[2:]]
      sys.path[:] = ["", *BASE_PATH[1:]]
      main = types.ModuleType("__main__")
      main.__builtins__ = __builtins__
      sys.modules["__main__"] = main
      exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
    elif argv[0] == "-m":
      sys.argv = [argv[1], *argv[2:]]
      sys.path[:] = [os.getcwd(), *BASE_PATH[1:]]
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
      sys.argv = list(argv)
      sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])),
                     *BASE_PATH[1:]]
      runpy.run_path(argv[0], run_name="__main__")
  except SystemExit as e:
    return _exit_status(e.code)
  except BaseException:  # pylint: disable=broad-except
    _print_exception(*sys.exc_info())
    return 1
  return 0


def _exit_status(code) -> int:
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


def _print_exception(kind, value, tb) -> None:
  """Prints as Python does for an uncaught exception, without this module's frames."""
  while tb is not None and tb.tb_frame.f_code.co_filename in (
      __file__, getattr(sys.modules.get("runpy"), "__file__", None)):
    tb = tb.tb_next
  try:
    if value is not None:
      value = value.with_traceback(tb)  # What the hook prints, on 3.12 too.
    sys.excepthook(kind, value, tb)
  except Exception:  # pylint: disable=broad-except
    pass


def _finish(code: int) -> int:
  import atexit as _atexit  # pylint: disable=g-import-not-at-top,reimported
  try:
    _atexit._run_exitfuncs()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    pass
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  return code
