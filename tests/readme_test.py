"""Every ```python block of README.md runs, as pasted, with nothing on stderr.

The blocks run in order in one fresh process, sharing one namespace, as a
reader pasting them into one interpreter would. A block preceded by a line
``<!-- not run: <reason> -->`` is left out; the reason is required.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest

from jt_dist import _jax_import

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not run\s*:(.*?)-->\s*$")

# Runs the blocks given as JSON on stdin; each keeps its README line numbers
# in tracebacks.
_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for line, code in json.load(sys.stdin):
  exec(compile("\\n" * line + code, "README.md", "exec"), namespace)
"""


@dataclasses.dataclass(frozen=True)
class Block:
  line: int  # 0-based index of the block's first code line.
  language: str
  code: str
  not_run: str | None  # The reason, when marked "not run".


def code_blocks(text: str) -> list[Block]:
  """The fenced code blocks of a Markdown text, with their "not run" marks.

  Args:
    text: Markdown.

  Returns:
    Every fenced block, in order.

  Raises:
    ValueError: a fence is never closed, or a "not run" mark gives no reason.
  """
  lines = text.splitlines()
  blocks = []
  i = 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    indent, ticks, language = opening.groups()
    end = next((j for j in range(i + 1, len(lines))
                if lines[j].strip() == ticks), None)
    if end is None:
      raise ValueError(f"README line {i + 1}: the {ticks}{language} fence is"
                       " never closed.")
    code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
    if indent:
      code = textwrap.dedent(code)
    blocks.append(Block(i + 1, language, code, _not_run_reason(lines, i)))
    i = end + 1
  return blocks


def _not_run_reason(lines: list[str], fence: int) -> str | None:
  previous = next((lines[j] for j in range(fence - 1, -1, -1)
                   if lines[j].strip()), "")
  mark = _NOT_RUN.match(previous)
  if not mark:
    return None
  reason = mark.group(1).strip()
  if not reason:
    raise ValueError(f"README line {fence}: `<!-- not run: -->` gives no"
                     " reason; write why the block below cannot run.")
  return reason


def _readme() -> str:
  with open(os.path.join(_ROOT, "README.md"), encoding="utf-8") as f:
    return f.read()


def _readme_bash() -> str:
  return "\n".join(b.code for b in code_blocks(_readme())
                   if b.language == "bash")


class CodeBlocksTest(absltest.TestCase):

  def test_finds_blocks_marks_and_indented_blocks(self):
    text = ("intro\n```python\na = 1\n```\n\n<!-- not run: needs a GPU -->\n"
            "```python\nb = 2\n```\n* item\n\n  ```python\n  c = 3\n"
            "  if c:\n    d = 4\n  ```\n```bash\necho\n```\n")
    blocks = code_blocks(text)
    self.assertEqual([(b.line, b.language, b.code, b.not_run) for b in blocks],
                     [(2, "python", "a = 1\n", None),
                      (7, "python", "b = 2\n", "needs a GPU"),
                      (12, "python", "c = 3\nif c:\n  d = 4\n", None),
                      (17, "bash", "echo\n", None)])

  def test_a_mark_without_reason_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"line 2: .*gives no reason"):
      code_blocks("x\n<!-- not run: -->\n```python\na = 1\n```\n")

  def test_an_unclosed_fence_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"line 2: the ```python fence"):
      code_blocks("x\n```python\na = 1\n")


class ReadmeTest(absltest.TestCase):

  def test_python_blocks_run_with_nothing_on_stderr(self):
    blocks = [b for b in code_blocks(_readme()) if b.language == "python"]
    self.assertGreaterEqual(len(blocks), 3)  # Quickstart, mesh, vmap.
    runnable = [(b.line, b.code) for b in blocks if b.not_run is None]
    with tempfile.TemporaryDirectory() as cache:
      env = dict(os.environ, JT_DIST_CACHE_DIR=cache)
      env.pop("JT_DIST_CPU_DEVICES", None)
      # This test process already holds most of a GPU's memory (JAX's
      # preallocation); a child that preallocates too retries smaller
      # blocks and logs each failure to stderr.
      env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
      result = subprocess.run(
          [sys.executable, "-c", _RUNNER], input=json.dumps(runnable),
          capture_output=True, text=True, cwd=_ROOT, env=env, timeout=600,
          check=False)
    self.assertEqual(result.returncode, 0,
                     f"README blocks failed:\n{result.stderr}")
    self.assertEqual(result.stderr, "", "README blocks wrote to stderr")
    if not _jax_import.has_nvidia_devices():
      # The mesh snippet spans every local device: 8 virtual CPU devices.
      self.assertIn("'x': 8", result.stdout)

  def test_ci_runs_the_readme_commands(self):
    path = os.path.join(_ROOT, ".ci", "run")
    if not os.path.exists(path):
      self.skipTest(f"{path} is not in this tree (Bazel's runfiles hold only"
                    " README.md)")
    with open(path, encoding="utf-8") as f:
      ci = f.read()
    bash = _readme_bash()
    plugin = re.search(r'pip install --no-deps "jax-cuda12-plugin==[^"]*"',
                       bash)
    self.assertIsNotNone(plugin, "README installs no jax-cuda12-plugin")
    for command in ("pip install -e .", "python examples/sharded_add.py",
                    'pip install -e ".[test]"', plugin.group(0),
                    "python -m pytest tests tests_multigpu -q"):
      self.assertIn(command, bash)
      self.assertIn(command, ci)


if __name__ == "__main__":
  absltest.main()
