"""The tests' fork server runs a child as ``python`` would, or falls back."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **kwargs):
  # The tree on PYTHONPATH as the suites' other children have it: they
  # share a server where nothing else differs.
  env = fork_server.tree_env(_ROOT, **kwargs.pop("env", {}))
  return fork_server.run(["-c", code, *kwargs.pop("args", ())], env=env,
                         cwd=kwargs.pop("cwd", _ROOT), **kwargs)


def _forked(result) -> bool:
  """Whether the child printed that its parent was not this process."""
  return result.stdout.splitlines()[-1] == "forked"


def _gone(pid: int) -> bool:
  """Whether ``pid`` has exited (a zombie waiting for its reaper has)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rpartition(")")[2].split()[0] == "Z"
  except FileNotFoundError:
    if os.path.isdir("/proc/self"):
      return True
  try:
    os.kill(pid, 0)  # Without /proc: a zombie still counts as running.
  except ProcessLookupError:
    return True
  return False


_PARENT = ("import os, sys\n"
           f"print('forked' if os.getppid() != {os.getpid()} else 'real')\n")


@absltest.skipUnless(hasattr(os, "fork"), "fork servers need os.fork")
class ForkServerTest(parameterized.TestCase):

  def test_runs_like_python(self):
    code = textwrap.dedent("""\
        import jt_dist, os, sys
        print(sys.argv, os.getcwd(), os.environ["SEEN"], sys.path[0] == "")
        print(sys.stdin.read().upper())
        print("to stderr", file=sys.stderr)
        """) + _PARENT
    result = _run(code, args=("a", "b"), env={"SEEN": "yes"},
                  input="typed", timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    lines = result.stdout.splitlines()
    self.assertEqual(lines[0], f"['-c', 'a', 'b'] {_ROOT} yes True")
    self.assertEqual(lines[1], "TYPED")
    self.assertEqual(result.stderr, "to stderr\n")
    self.assertTrue(_forked(result))

  def test_temporary_directory_is_the_childs(self):
    code = "import jt_dist, tempfile\nprint(tempfile.gettempdir())\n" + _PARENT
    # The server is the one this process's environment gets (started here
    # if none was): its import chose the temporary directory of that one.
    self.assertTrue(_forked(_run(code, timeout=120)))
    with tempfile.TemporaryDirectory() as tmp:
      result = _run(code, env={"TMPDIR": tmp}, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout.splitlines(), [tmp, "forked"])

  @parameterized.parameters((None, 0), (3, 3), ("'a message'", 1))
  def test_exit_status(self, code, status):
    result = _run(f"import jt_dist, sys\nsys.exit({code})", timeout=120)
    self.assertEqual(result.returncode, status)
    if isinstance(code, str):
      self.assertEqual(result.stderr, "a message\n")

  def test_uncaught_exception_prints_its_traceback_only(self):
    result = _run("import jt_dist\n\ndef f():\n  raise KeyError('gone')\nf()",
                  timeout=120)
    self.assertEqual(result.returncode, 1)
    self.assertTrue(result.stderr.startswith(
        "Traceback (most recent call last):\n"), result.stderr)
    self.assertIn('File "<string>", line 5, in <module>', result.stderr)
    self.assertTrue(result.stderr.endswith("KeyError: 'gone'\n"),
                    result.stderr)
    self.assertNotIn("fork_server", result.stderr)
    self.assertNotIn("runpy", result.stderr)

  def test_device_count_is_the_childs(self):
    for count in (3, 5):
      result = _run(
          "import jt_dist, jax\nprint(len(jax.devices('cpu')))\n" + _PARENT,
          env={"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"},
          timeout=120)
      self.assertEqual(result.returncode, 0, result.stderr)
      self.assertEqual(result.stdout.splitlines()[0], str(count))
      self.assertTrue(_forked(result))

  def test_timeout_kills_the_child_and_its_children(self):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    pid_file = os.path.join(tmp.name, "pid")
    code = ("import jt_dist, os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c',"
            " 'import time; time.sleep(60)'])\n"
            f"with open({pid_file!r} + '.tmp', 'w') as f:\n"
            "  f.write(str(child.pid))\n"
            f"os.replace({pid_file!r} + '.tmp', {pid_file!r})\n"
            "time.sleep(60)\n")
    start = time.monotonic()
    with self.assertRaises(subprocess.TimeoutExpired):
      _run(code, timeout=0.5)
    self.assertLess(time.monotonic() - start, 30)
    with open(pid_file, encoding="utf-8") as f:
      grandchild = int(f.read())
    deadline = time.monotonic() + 30
    while not _gone(grandchild):
      if time.monotonic() > deadline:
        os.kill(grandchild, signal.SIGKILL)
        self.fail(f"the child's child {grandchild} outlived the timeout")
      time.sleep(0.01)
    # The server serves the next run.
    self.assertEqual(_run("import jt_dist\nprint(1)", timeout=120).stdout,
                     "1\n")

  @parameterized.named_parameters(("forked", "1"), ("real", "0"))
  def test_run_together_starts_every_child_before_waiting(self, server):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    # Each child waits for all three: run one after another, none would
    # see the others, and each would exit 3.
    code = textwrap.dedent(f"""\
        import os, sys, time
        folder, me = {tmp.name!r}, sys.argv[1]
        open(os.path.join(folder, me), "w").close()
        deadline = time.monotonic() + 20
        while len(os.listdir(folder)) < 3:
          if time.monotonic() > deadline:
            sys.exit(3)
          time.sleep(0.01)
        print(me)
        """) + _PARENT
    with mock.patch.dict(os.environ, {fork_server.ENV_VAR: server}):
      done = fork_server.run_together(
          [["-c", code, str(i)] for i in range(3)],
          env=fork_server.tree_env(_ROOT), cwd=_ROOT, timeout=120)
    self.assertEqual([r.returncode for r in done], [0, 0, 0],
                     [r.stderr for r in done])
    self.assertEqual([r.stdout.splitlines()[0] for r in done],
                     ["0", "1", "2"])
    self.assertEqual({_forked(r) for r in done}, {server == "1"})

  @parameterized.named_parameters(("forked", "1"), ("real", "0"))
  def test_run_together_timeout_kills_every_child(self, server):
    code = "import time\ntime.sleep(60)\n"
    start = time.monotonic()
    with mock.patch.dict(os.environ, {fork_server.ENV_VAR: server}):
      with self.assertRaises(subprocess.TimeoutExpired):
        fork_server.run_together([["-c", code]] * 2,
                                 env=fork_server.tree_env(_ROOT), cwd=_ROOT,
                                 timeout=0.2)
    self.assertLess(time.monotonic() - start, 30)
    self.assertEqual(_run("import jt_dist\nprint(1)", timeout=120).stdout,
                     "1\n")

  def test_script_and_module(self):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    script = os.path.join(tmp.name, "s.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write("import jt_dist, sys\nprint(__name__, sys.argv[1:])\n" + _PARENT)
    result = fork_server.run([script, "x"], env=fork_server.tree_env(_ROOT),
                             cwd=_ROOT, timeout=120)
    self.assertEqual(result.stdout.splitlines()[0], "__main__ ['x']")
    self.assertTrue(_forked(result))
    result = fork_server.run(["-m", "jt_dist", "--help"],
                             env=fork_server.tree_env(_ROOT), cwd=_ROOT,
                             timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn("usage", result.stdout.lower())

  @parameterized.named_parameters(
      ("jax_first", "import jax\nimport jt_dist\n", False),
      ("jt_dist_first", "import jt_dist\nimport jax\n", True),
      ("from_jax_first", "from jax import numpy\nimport jt_dist\n", False),
      ("neither", "import numpy\n", True),
      ("indented", "if True:\n  import jax\nimport jt_dist\n", False))
  def test_import_order_decides(self, code, first):
    self.assertEqual(fork_server.imports_jt_dist_first(code), first)

  @parameterized.parameters(("import jax\nimport jt_dist\n", False),
                            ("import jt_dist\nimport jax\n", True))
  def test_import_order_picks_the_process(self, code, forked):
    result = _run(code + _PARENT, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(_forked(result), forked)

  def test_docs_runner_payload_is_read(self):
    payload = '[["page.md", 0, "import jax\\nimport jt_dist\\n"]]'
    self.assertFalse(fork_server._eligible(["-c", "import json"], payload,  # pylint: disable=protected-access
                                           _ROOT))
    payload = '[["page.md", 0, "import jt_dist\\nimport jax\\n"]]'
    self.assertTrue(fork_server._eligible(["-c", "import json"], payload,  # pylint: disable=protected-access
                                          _ROOT))

  def test_import_time_environment_gets_its_own_server(self):
    code = ("import jt_dist, jax\nprint(jax.config.jax_traceback_filtering)\n"
            + _PARENT)
    # Not this process's setting: a server of its own. It also preloads a
    # module that does not exist, which it skips.
    other = ("off" if os.environ.get("JAX_TRACEBACK_FILTERING") != "off"
             else "tracebackhide")
    with mock.patch.object(fork_server, "_PRELOADED",
                           (*fork_server._PRELOADED, "jt_dist_no_such_module")):  # pylint: disable=protected-access
      result = _run(code, env={"JAX_TRACEBACK_FILTERING": other}, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout.splitlines()[0], other)
    self.assertTrue(_forked(result))

  def test_child_starts_with_the_preloads_imported_and_frozen(self):
    preloads = [name for name in fork_server._PRELOADED  # pylint: disable=protected-access
                if importlib.util.find_spec(name) is not None]
    self.assertIn("triton.compiler.code_generator", preloads)
    code = ("import gc, sys\nimport jt_dist\n"
            f"print([n for n in {preloads!r} if n not in sys.modules])\n"
            "print(gc.get_freeze_count() > 100_000)\n" + _PARENT)
    result = _run(code, timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout.splitlines(), ["[]", "True", "forked"])

  @parameterized.parameters("0", "1", "true", "off")
  def test_jax_options_set_by_the_child_share_a_server(self, x64):
    code = ("import jt_dist, jax\n"
            "print(jax.config.jax_enable_x64, jax.config.jax_platforms,"
            " jax.devices()[0].platform)\n" + _PARENT)
    plain = _run(code, timeout=120)
    servers = dict(fork_server._servers)  # pylint: disable=protected-access
    result = _run(code, env={"JAX_ENABLE_X64": x64, "JAX_PLATFORMS": "cpu"},
                  timeout=120)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertEqual(result.stdout.splitlines()[0],
                     f"{x64 in ('1', 'true')} cpu cpu")
    self.assertTrue(_forked(plain) and _forked(result))
    self.assertEqual(fork_server._servers, servers)  # pylint: disable=protected-access

  def test_unreadable_jax_option_takes_a_real_process(self):
    # jax itself refuses the value at import: so must the child, in a
    # process of its own.
    env = {"JAX_ENABLE_X64": "maybe"}
    self.assertFalse(fork_server._options_readable(env))  # pylint: disable=protected-access
    result = _run("import jt_dist\n" + _PARENT, env=env, timeout=120)
    self.assertEqual(result.stdout, "")
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("maybe", result.stderr)

  def _popen(self, code: str, **env: str):
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    # pylint: disable=consider-using-with
    out = open(os.path.join(tmp.name, "out"), "w+", encoding="utf-8")
    err = open(os.path.join(tmp.name, "err"), "w+", encoding="utf-8")
    self.addCleanup(out.close)
    self.addCleanup(err.close)
    process = fork_server.popen([sys.executable, "-c", code],
                                env=fork_server.tree_env(_ROOT, **env),
                                cwd=_ROOT, stdout=out, stderr=err,
                                start_new_session=True)
    self.addCleanup(process.kill)
    return process, out

  def _wait_for_line(self, out, line: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      out.seek(0)
      text = out.read()
      if line in text.splitlines():
        return text
      time.sleep(0.02)
    self.fail(f"no line {line!r} within 60 s")

  def test_popen_is_polled_waited_for_and_killed_as_a_process(self):
    # Unbuffered, as PYTHONUNBUFFERED asks: what it printed before it was
    # killed is in its file.
    code = (f"import jt_dist, time\n{_PARENT}print('started')\n"
            "time.sleep(60)\n")
    process, out = self._popen(code, PYTHONUNBUFFERED="1")
    self.assertIsInstance(process, fork_server.Process)
    text = self._wait_for_line(out, "started")
    self.assertEqual(text.splitlines()[0], "forked")
    self.assertIsNone(process.poll())
    with self.assertRaises(subprocess.TimeoutExpired):
      process.wait(timeout=0.1)
    self.assertEqual(os.getsid(process.pid), process.pid)
    os.killpg(process.pid, signal.SIGKILL)
    self.assertEqual(process.wait(timeout=60), -signal.SIGKILL)
    self.assertEqual(process.poll(), -signal.SIGKILL)

  def test_popen_children_run_side_by_side(self):
    # The first waits for what the second writes: a server that served one
    # request at a time would never start the second.
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    flag = os.path.join(tmp.name, "flag")
    waiter, _ = self._popen(
        f"import jt_dist, os, sys, time\ndeadline = time.monotonic() + 30\n"
        f"while not os.path.exists({flag!r}):\n"
        "  if time.monotonic() > deadline: sys.exit(3)\n"
        "  time.sleep(0.01)\n")
    writer, _ = self._popen(f"import jt_dist\nopen({flag!r}, 'w').close()\n"
                            "raise SystemExit(4)\n")
    self.assertEqual((waiter.wait(timeout=60), writer.wait(timeout=60)),
                     (0, 4))

  def test_popen_of_another_program_or_unnamed_streams_is_subprocess(self):
    # The code alone could be forked (it imports neither jax nor jt_dist,
    # which also keeps the real process cheap): the stream decides.
    for args, stdout in (([sys.executable, "-c", "import sys"],
                          subprocess.PIPE),
                         (["/bin/sh", "-c", "exit 3"], subprocess.DEVNULL)):
      process = fork_server.popen(args, env=fork_server.tree_env(_ROOT),
                                  cwd=_ROOT, stdout=stdout,
                                  stderr=subprocess.DEVNULL)
      self.assertIsInstance(process, subprocess.Popen)
      process.communicate(timeout=120)

  def test_turned_off(self):
    self.assertTrue(_forked(_run(_PARENT, timeout=120)))
    with mock.patch.dict(os.environ, {fork_server.ENV_VAR: "0"}):
      result = _run(_PARENT, timeout=120)
    self.assertFalse(_forked(result))


if __name__ == "__main__":
  absltest.main()
