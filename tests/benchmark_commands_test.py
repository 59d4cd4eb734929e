"""Every benchmarks command the docs write runs as written, in quick mode.

The commands are read from README.md, CONTRIBUTING.md and docs/, so that a
command a page adds or changes is run here too. ``benchmarks/run.py``
commands run with ``--quick`` and their ``--out`` in a temporary folder;
``benchmarks/doc_tables.py`` as written (``--readme`` on a copy, which must
come out unchanged); ``benchmarks/peer_suites.py`` on a small jax-triton
style test file in place of the path to jax-triton's tests;
``tests/fuzz_cpu.py`` as written but with two cases;
``benchmarks/run_gpu.sh``, which needs GPUs, is parsed by ``bash -n`` and
its stage must be one the script takes.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The script, then its words up to the end of the code span, a comment or
# an HTML comment's end.
_COMMAND = re.compile(r"(?<![\w/])(?:python|bash)\s+(?:benchmarks/[\w./-]+"
                      r"|tests/fuzz_cpu\.py)"
                      r"(?:[ \t]+(?!--?>)[^\s`#<>]+)*")
_PEER_TEST = '''
import jax
import jax.numpy as jnp
import jax_triton as jt
import numpy as np
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n: tl.constexpr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def test_add():
  x = jnp.arange(40, dtype=jnp.float32)
  out = jt.triton_call(x, x, kernel=add_kernel, out_shape=x,
                       grid=(jt.cdiv(40, 16),), n=40, BLOCK=16)
  np.testing.assert_array_equal(out, 2 * x)
'''


def _pages() -> list[str]:
  pages = glob.glob(os.path.join(_ROOT, "docs", "**", "*.md"), recursive=True)
  return [os.path.join(_ROOT, p) for p in ("README.md", "CONTRIBUTING.md")
          ] + sorted(pages)


def commands() -> dict[str, str]:
  """Each benchmarks command the docs write -> the page writing it first."""
  found: dict[str, str] = {}
  for page in _pages():
    if not os.path.exists(page):
      continue
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for match in _COMMAND.finditer(text):
      found.setdefault(" ".join(match.group(0).split()),
                       os.path.relpath(page, _ROOT))
  return found


def _run_module():
  path = os.path.join(_ROOT, "benchmarks", "run.py")
  spec = importlib.util.spec_from_file_location("benchmarks_run", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _python(args, **kwargs):
  return subprocess.run([sys.executable, *args], cwd=_ROOT, text=True,
                        capture_output=True, check=False, **kwargs)


class BenchmarkCommandsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.commands = commands()
    if not cls.commands:
      raise absltest.SkipTest("no docs in this tree")

  def _of(self, script):
    return {c: page for c, page in self.commands.items()
            if c.split()[1] == script}

  def test_the_docs_write_commands(self):
    scripts = {c.split()[1] for c in self.commands}
    for script in scripts:
      self.assertTrue(os.path.exists(os.path.join(_ROOT, script)),
                      f"{self.commands} name {script}, which is missing")
    for script in ("benchmarks/run.py", "benchmarks/doc_tables.py",
                   "benchmarks/peer_suites.py", "tests/fuzz_cpu.py"):
      self.assertIn(script, scripts)

  def test_the_suite_stays_a_maintained_size(self):
    sources = glob.glob(os.path.join(_ROOT, "benchmarks", "*.py"))
    lines = {os.path.basename(p): len(open(p, encoding="utf-8").readlines())
             for p in sources}
    self.assertLessEqual(len(lines), 12, lines)
    self.assertLessEqual(sum(lines.values()), 3000, lines)

  def test_run_commands_run_quick(self):
    run = _run_module()
    suites = []
    for command, page in self._of("benchmarks/run.py").items():
      args = shlex.split(command)[2:]
      with tempfile.TemporaryDirectory() as tmp:
        # As written, flags and all; --list stops after parsing them.
        result = _python(["benchmarks/run.py", *self._out(args, tmp),
                          "--list"])
      self.assertEqual(result.returncode, 0, f"{page}: {command}:"
                       f" {result.stderr[-2000:]}")
      if "--suite" in args:
        suites += run._names(args[args.index("--suite") + 1])  # pylint: disable=protected-access
    self.assertNotEmpty(suites)
    suites = list(dict.fromkeys(suites))
    with tempfile.TemporaryDirectory() as tmp:
      result = _python(["benchmarks/run.py", "--suite", ",".join(suites),
                        "--quick", "--out", tmp, "--timeout", "600"],
                       timeout=3600)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      for suite in suites:
        with open(os.path.join(tmp, f"{suite}.json"), encoding="utf-8") as f:
          data = json.load(f)
        self.assertTrue(data["quick"])
        self.assertEqual(data["schema"], 1)
        self.assertNotEmpty(data["results"], suite)
        self.assertIn("commit", data["provenance"])

  def _out(self, args, tmp):
    args = list(args)
    if "--out" in args:
      args[args.index("--out") + 1] = tmp
    return args

  def test_doc_tables_commands_run(self):
    for command, page in self._of("benchmarks/doc_tables.py").items():
      args = shlex.split(command)[2:]
      with tempfile.TemporaryDirectory() as tmp:
        if args[0] == "--readme":
          copy = os.path.join(tmp, "README.md")
          shutil.copy(os.path.join(_ROOT, args[1]), copy)
          args[1] = copy
        result = _python(["benchmarks/doc_tables.py", *args])
        self.assertEqual(result.returncode, 0, f"{page}: {command}:"
                         f" {result.stderr[-2000:]}")
        if args[0] == "--readme":
          with open(copy, encoding="utf-8") as f, open(
              os.path.join(_ROOT, "README.md"), encoding="utf-8") as g:
            self.assertEqual(f.read(), g.read(), "the README's table is"
                             f" stale: run {command}")
        else:
          self.assertIn("| --- |", result.stdout, command)

  def test_peer_suites_commands_run(self):
    for command, page in self._of("benchmarks/peer_suites.py").items():
      args = shlex.split(command)[2:]
      with tempfile.TemporaryDirectory() as tmp:
        tests = os.path.join(tmp, "tests")
        os.makedirs(tests)
        with open(os.path.join(tests, "add_test.py"), "w",
                  encoding="utf-8") as f:
          f.write(_PEER_TEST)
        out = os.path.join(tmp, "out")
        flags = {"--out": out}
        given, i = [], 0
        while i < len(args):
          if args[i] in flags:
            given += [args[i], flags[args[i]]]
            i += 2
          elif args[i].startswith("--"):
            given += args[i:i + 2]
            i += 2
          else:  # The path to jax-triton's tests.
            given.append(tests)
            i += 1
        result = _python(["benchmarks/peer_suites.py", *given], timeout=900)
        self.assertEqual(result.returncode, 0, f"{page}: {command}:"
                         f" {result.stderr[-2000:]}")
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
          files = json.load(f)["files"]
        self.assertEqual(files["add_test.py"]["passed"], 1, files)

  def test_fuzz_cpu_commands_run(self):
    for command, page in self._of("tests/fuzz_cpu.py").items():
      args = shlex.split(command)[2:]
      if "--cases" in args:
        args[args.index("--cases") + 1] = "2"
      result = _python(["tests/fuzz_cpu.py", *args, "--cases", "2"],
                       timeout=900)
      self.assertEqual(result.returncode, 0, f"{page}: {command}:"
                       f" {result.stdout[-2000:]} {result.stderr[-2000:]}")
      self.assertIn("2 cases from seed", result.stdout, command)

  def test_a_given_commit_names_the_results_not_the_copy_s_git(self):
    # A GPU machine's copy of the tree can carry another snapshot's .git.
    spec = importlib.util.spec_from_file_location(
        "bench_timing", os.path.join(_ROOT, "benchmarks", "timing.py"))
    timing = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.join(_ROOT, "benchmarks"))  # Its siblings.
    try:
      spec.loader.exec_module(timing)
    finally:
      sys.path.pop(0)
    self.assertEqual(timing.commit("ee16ceee3b2d"), ("ee16ceee3b2d", None))
    self.assertEqual(timing.provenance("ee16ceee3b2d")["commit"],
                     "ee16ceee3b2d")
    head, _ = timing.commit()
    self.assertNotEqual(head, "ee16ceee3b2d")

  def test_run_gpu_commands_parse(self):
    script = os.path.join(_ROOT, "benchmarks", "run_gpu.sh")
    with open(script, encoding="utf-8") as f:
      stages = set(re.findall(r"\$what == (\w+)", f.read()))
    self.assertEqual(subprocess.run(["bash", "-n", script],
                                    check=False).returncode, 0)
    for command, page in self._of("benchmarks/run_gpu.sh").items():
      for stage in shlex.split(command)[2:3]:
        self.assertIn(stage, stages, f"{page}: {command}")


if __name__ == "__main__":
  absltest.main()
