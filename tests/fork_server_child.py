"""The fork server's own side: its loop, and a forked child's run.

``tests/fork_server.py`` starts a server as ``python -c`` code that imports
jt_dist, then this module, then calls ``serve``. The server reads requests
(one JSON line per group of runs) and forks a child per run, which applies
the run's environment, directory, arguments and standard streams and runs
the code as ``python`` would (``child_main``).

Children run side by side, from any number of groups: the server answers a
group with its children's pids at once, then reports each child's exit
status on a line of its own as the child exits, so that a caller can poll a
child as it would a ``subprocess.Popen``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile

# The server's sys.path when it started (``python -c``: "" first).
BASE_PATH: list[str] = []
# Set by the child itself where the import would have read them: see
# tests/fork_server.py.
TRUE_VALUES = ("y", "yes", "t", "true", "on", "1")
# Without pidfds (Linux before 5.3) the server looks for exited children
# this often.
_POLL_S = 0.05


def _pidfd(pid: int) -> int | None:
  """A descriptor that turns readable when ``pid`` exits, where Linux has them."""
  try:
    return os.pidfd_open(pid)
  except (AttributeError, OSError):
    return None


class _Loop:
  """The server's state: its control pipes and the children still running."""

  def __init__(self, fd_in: int, fd_out: int):
    self.fd_in, self.fd_out = fd_in, fd_out
    self.buffer = b""
    self.children: dict[int, int | None] = {}  # pid -> its pidfd, if any

  def send(self, message: dict) -> None:
    data = json.dumps(message).encode() + b"\n"
    try:
      while data:
        data = data[os.write(self.fd_out, data):]
    except BrokenPipeError:  # The test process is gone.
      self.kill_all()
      os._exit(0)  # pylint: disable=protected-access

  def fork(self, requests: list[dict]) -> None:
    pids = []
    for request in requests:
      pid = os.fork()
      if pid == 0:
        for fd in [self.fd_in, self.fd_out, *self.children.values()]:
          if fd is not None and fd > 2:
            os.close(fd)
        child_main(request)
      self.children[pid] = _pidfd(pid)
      pids.append(pid)
    self.send({"pids": pids})

  def reap(self) -> None:
    for pid, fd in list(self.children.items()):
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        if fd is not None:
          os.close(fd)
        del self.children[pid]
        self.send({"exit": pid, "status": os.waitstatus_to_exitcode(status)})

  def kill_all(self) -> None:
    for pid in self.children:
      try:
        os.killpg(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      os.waitpid(pid, 0)

  def read(self) -> bool:
    """Forks the groups that arrived; False once the caller has gone."""
    chunk = os.read(self.fd_in, 65536)
    if not chunk:
      return False
    self.buffer += chunk
    *lines, self.buffer = self.buffer.split(b"\n")
    for line in lines:
      self.fork(json.loads(line)["group"])
    return True

  def wait(self) -> list[int]:
    fds = [fd for fd in self.children.values() if fd is not None]
    polling = len(fds) < len(self.children)
    readable, _, _ = select.select([self.fd_in, *fds], [], [],
                                   _POLL_S if polling else None)
    return readable


def serve(fd_in: int, fd_out: int) -> None:
  """The server's loop, until its caller closes ``fd_in``; never returns."""
  loop = _Loop(fd_in, fd_out)
  loop.send({"ready": True})
  while True:
    readable = loop.wait()
    loop.reap()
    if fd_in in readable and not loop.read():
      loop.kill_all()  # The test process is gone.
      os._exit(0)  # pylint: disable=protected-access


def child_main(request: dict) -> None:
  """In the forked child: runs the request as ``python`` would; never returns."""
  code = 1
  try:
    os.setsid()  # Its own group: a timeout kills whatever it started too.
    _redirect(request)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # The server's imports already chose a temporary directory; the child's
    # own TMPDIR decides, as in a fresh interpreter.
    tempfile.tempdir = None
    _set_jax_options(request["env"])
    code = _run_main(request["argv"])
  except BaseException:  # pylint: disable=broad-except
    _print_exception(*sys.exc_info())
  finally:
    os._exit(_finish(code))  # pylint: disable=protected-access


def _set_jax_options(env: dict[str, str]) -> None:
  """The jax options the child's import would have read from ``env``."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_platforms", env.get("JAX_PLATFORMS") or None)
  jax.config.update("jax_enable_x64", env.get(
      "JAX_ENABLE_X64", "").strip().lower() in TRUE_VALUES)


def _redirect(request: dict) -> None:
  import io  # pylint: disable=g-import-not-at-top
  for fd, key, flags in ((0, "stdin", os.O_RDONLY),
                         (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                         (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    new = os.open(request[key], flags, 0o600)
    os.dup2(new, fd)
    os.close(new)
  # As ``python -u`` (or PYTHONUNBUFFERED) does: a child killed later has
  # still written everything it printed.
  unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
  sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False),
                               encoding="utf-8")
  sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False),
                                encoding="utf-8", line_buffering=False,
                                write_through=unbuffered)
  sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False),
                                encoding="utf-8", errors="backslashreplace",
                                line_buffering=True, write_through=unbuffered)
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
  import atexit  # pylint: disable=g-import-not-at-top
  try:
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    pass
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except
      pass
  return code
