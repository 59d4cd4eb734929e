"""Runs jax-triton's own test files against jt_dist; writes JUnit XML + JSON.

The compatibility yardstick: jt_dist claims to be a drop-in for
``jax_triton.triton_call``. This script builds, in a temporary folder, a
stand-in ``jax_triton`` package that only re-exports jt_dist's public names
(those in ``jt_dist.__all__`` that jax-triton also exports) and implements
nothing, puts it first on ``PYTHONPATH`` and runs pytest on jax-triton's test
files. jax-triton's tests are not part of this repository; fetch them from
https://github.com/jax-ml/jax-triton (``tests/`` at a release tag) into a
folder of your own, e.g. ``.peer_tests/v0.3.1/``.

    python benchmarks/peer_suites.py --out /tmp/peers/v0.3.1 \
        .peer_tests/v0.3.1

Without GPUs the tests run on 8 virtual CPU devices through Triton's
interpreter (slow: use ``--per-test-timeout``). The summary JSON lists, per
file, the passed/failed/skipped counts and each failing test id with the first
line of its error.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# jax-triton's public names across its releases (0.1 .. 0.4): the stand-in
# forwards those that jt_dist also exports publicly, under the same name.
_JAX_TRITON_NAMES = (
    "CUSTOM_CALL_TARGET_NAME", "TensorDescriptor", "cdiv",
    "get_compute_capability", "get_serialized_metadata", "next_power_of_2",
    "strides_from_shape", "triton_call", "utils")

# Loaded by pytest (-p) before any test module: asks JAX for virtual CPU
# devices before its backends start, and bounds each test's time. The alarm
# is handled when the main thread next runs Python, so a test blocked in C
# (waiting on an interpreted kernel) stops only once that call returns.
_PLUGIN = '''\
"""pytest plugin written by benchmarks/peer_suites.py."""
import os
import signal

import pytest
from jt_dist import testing

testing.configure_cpu_devices()
_LIMIT = int(os.environ.get("JT_PEER_TEST_TIMEOUT", "0"))


def _expire(*_):  # The signal handler's (signum, frame).
  raise TimeoutError(f"test ran past JT_PEER_TEST_TIMEOUT={_LIMIT}s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  del item
  if _LIMIT > 0:
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.alarm(_LIMIT)
  try:
    yield
  finally:
    if _LIMIT > 0:
      signal.alarm(0)
      signal.signal(signal.SIGALRM, previous)
'''


def forwarded_names(python: str) -> list[str]:
  """jax-triton's names that jt_dist exports publicly, asked of ``python``."""
  code = "import json, jt_dist; print(json.dumps(sorted(jt_dist.__all__)))"
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (_REPO, os.environ.get("PYTHONPATH")) if p))
  out = subprocess.run([python, "-c", code], check=True, capture_output=True,
                       text=True, env=env).stdout
  public = json.loads(out.strip().splitlines()[-1])
  return sorted(set(public) & set(_JAX_TRITON_NAMES))


def build_stand_in(folder: str, names: list[str]) -> None:
  """Writes the stand-in ``jax_triton`` package and the pytest plugin.

  ``jax_triton.triton_lib`` re-exports the same names, because jax-triton's
  0.4 tests import that module at the top; anything else they reach for in it
  is jax-triton's own and stays missing.

  Args:
    folder: where to write ``jax_triton/`` and ``_peer_suite_plugin.py``.
    names: the jt_dist public names to re-export.
  """
  package = os.path.join(folder, "jax_triton")
  os.makedirs(package, exist_ok=True)
  imports = "".join(f"from jt_dist import {name}\n" for name in names)
  body = ('"""Stand-in for jax_triton: jt_dist\'s public names only."""\n'
          f"{imports}\n__all__ = {names!r}\n")
  for module in ("__init__.py", "triton_lib.py"):
    with open(os.path.join(package, module), "w") as f:
      f.write(body)
  with open(os.path.join(folder, "_peer_suite_plugin.py"), "w") as f:
    f.write(_PLUGIN)


def run_pytest(args, stand_in: str, junit: str) -> int:
  """Runs pytest on ``args.paths`` with the stand-in first on the path."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (stand_in, _REPO, env.get("PYTHONPATH")) if p)
  env.setdefault("JT_DIST_CPU_DEVICES", str(args.cpu_devices))
  env["JT_PEER_TEST_TIMEOUT"] = str(args.per_test_timeout)
  first = args.paths[0]
  root = first if os.path.isdir(first) else os.path.dirname(first)
  ini = os.path.join(stand_in, "pytest.ini")
  with open(ini, "w") as f:
    f.write("[pytest]\npython_files = *_test.py\njunit_family = xunit1\n")
  # -c/--rootdir/--confcutdir keep this repository's pytest settings and
  # conftest.py out: jax-triton's files run as they would in its own repo.
  command = [args.python, "-m", "pytest", "-c", ini, "--rootdir", root,
             "--confcutdir", root, "-p", "_peer_suite_plugin",
             "-p", "no:cacheprovider", "-q", "-rs", f"--junitxml={junit}",
             "--continue-on-collection-errors",
             *args.pytest_args, *args.paths]
  process = subprocess.Popen(command, env=env, cwd=stand_in)
  try:
    return process.wait(timeout=args.timeout or None)
  except subprocess.TimeoutExpired:
    print(f"pytest ran past --timeout={args.timeout}s", file=sys.stderr)
    # SIGINT first: pytest still writes the JUnit report of what it ran.
    process.send_signal(signal.SIGINT)
    try:
      process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()
    return 124


def _first_line(element) -> str:
  """The error's first line; for a collection error, its first "E" line."""
  message = element.get("message") or ""
  lines = (element.text or "").splitlines()
  if message == "collection failure":
    lines = [line[1:] for line in lines if line.startswith("E ")] or lines
  else:
    lines = message.splitlines() or lines
  return next((line.strip()[:300] for line in lines if line.strip()), "")


def summarize(junit: str) -> dict:
  """Per-file counts and failing test ids from a JUnit XML report."""
  files = {}
  for case in ET.parse(junit).getroot().iter("testcase"):
    if not case.get("name"):
      continue  # The test running when --timeout interrupted pytest.
    path = case.get("file") or case.get("classname", "").split(".")[0] + ".py"
    name = os.path.basename(path)
    entry = files.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0,
                                    "failures": []})
    cls = case.get("classname", "").split(".")[-1]
    cls = "" if cls == name[:-3] else cls  # A module-level test function.
    test_id = "::".join(p for p in (name, cls, case.get("name")) if p)
    bad = next((b for b in (case.find("failure"), case.find("error"))
                if b is not None), None)
    if bad is not None:
      entry["failed"] += 1
      entry["failures"].append({"id": test_id, "kind": bad.tag,
                                "error": _first_line(bad)})
    elif case.find("skipped") is not None:
      entry["skipped"] += 1
    else:
      entry["passed"] += 1
  return files


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("paths", nargs="+",
                      help="jax-triton test files or a folder of them")
  parser.add_argument("--out", required=True,
                      help="folder for junit.xml and summary.json")
  parser.add_argument("--python", default=sys.executable)
  parser.add_argument("--cpu-devices", type=int, default=8)
  parser.add_argument("--timeout", type=int, default=0,
                      help="seconds for the whole pytest run (0: none)")
  parser.add_argument("--per-test-timeout", type=int, default=0,
                      help="seconds per test (0: none)")
  parser.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[],
                      help="further pytest arguments (last on the line)")
  args = parser.parse_args()
  args.paths = [os.path.abspath(p) for p in args.paths]
  os.makedirs(args.out, exist_ok=True)
  junit = os.path.abspath(os.path.join(args.out, "junit.xml"))
  names = forwarded_names(args.python)
  with tempfile.TemporaryDirectory(prefix="jt_peer_") as stand_in:
    build_stand_in(stand_in, names)
    code = run_pytest(args, stand_in, junit)
  summary = {"paths": args.paths, "forwarded_names": names,
             "pytest_exit_code": code,
             "files": summarize(junit) if os.path.exists(junit) else {}}
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  for name, entry in sorted(summary["files"].items()):
    print(f"{name}: {entry['passed']} passed, {entry['failed']} failed, "
          f"{entry['skipped']} skipped")
  return 0


if __name__ == "__main__":
  sys.exit(main())
