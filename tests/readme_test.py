"""Every ```python block of README.md runs, as pasted, with nothing on stderr.

The blocks run as tests/doc_blocks.py says: a block is self-contained (a
fresh process of its own) or says which block it continues
(``<!-- continues: NAME -->``); ``<!-- not run: <reason> -->`` leaves one
out, with its reason. The README's install and test commands are those
.ci/run runs.
"""

from __future__ import annotations

import importlib.util
import os
import re

from absl.testing import absltest

import doc_blocks
from doc_blocks import code_blocks
import script_util

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    with self.assertRaisesRegex(ValueError, r"line 2: .*gives no value"):
      code_blocks("x\n<!-- not run: -->\n```python\na = 1\n```\n")

  def test_an_unknown_mark_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"page.md line 2: unknown mark"
                                r" `<!-- contnues: -->`"):
      code_blocks("x\n<!-- contnues: a -->\n```python\na = 1\n```\n",
                  "page.md")

  def test_an_unclosed_fence_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"line 2: the ```python fence"):
      code_blocks("x\n```python\na = 1\n")

  def test_blocks_join_the_chain_they_continue(self):
    text = ("<!-- block: setup -->\n```python\na = 1\n```\n"
            "```python\nz = 0\n```\n"
            "<!-- continues: setup -->\n\n<!-- block: next -->\n"
            "<!-- stdout has: 2 -->\n```python\nprint(a + 1)\n```\n"
            "<!-- continues: next -->\n<!-- gpu only: needs sm_90 -->\n"
            "```python\nb = a\n```\n"
            "<!-- on cpu: the interpreter -->\n```python\nc = 1\n```\n")
    found = doc_blocks.chains(code_blocks(text))
    self.assertEqual([[b.code for b in c.blocks] for c in found],
                     [["a = 1\n", "print(a + 1)\n", "b = a\n"], ["z = 0\n"],
                      ["c = 1\n"]])
    self.assertEqual(found[0].gpu_only, "needs sm_90")
    self.assertIsNone(found[1].gpu_only)
    self.assertEqual([c.on_cpu for c in found],
                     [None, None, "the interpreter"])
    self.assertEqual(found[0].blocks[1].stdout_has, ("2",))

  def test_continuing_an_unknown_or_skipped_block_is_refused(self):
    with self.assertRaisesRegex(ValueError, r"continues 'setup', which no"
                                r" earlier block is named"):
      doc_blocks.chains(code_blocks(
          "<!-- continues: setup -->\n```python\na = 1\n```\n"))
    with self.assertRaisesRegex(ValueError, r"continues 'setup', which is"
                                r" marked not to run"):
      doc_blocks.chains(code_blocks(
          "<!-- block: setup -->\n<!-- not run: a sketch -->\n"
          "```python\na = 1\n```\n"
          "<!-- continues: setup -->\n```python\nb = a\n```\n"))

  def test_a_chain_that_fails_or_writes_to_stderr_is_reported(self):
    chain = doc_blocks.Chain(list(code_blocks(
        "<!-- stdout has: done -->\n```python\nprint('do')\n```\n")))
    passed = doc_blocks.Result(0, "done\n", "")
    self.assertIsNone(doc_blocks.failure(chain, "p.md", passed))
    self.assertIn("stdout lacks 'done'", doc_blocks.failure(
        chain, "p.md", doc_blocks.Result(0, "do\n", "")))
    self.assertIn("wrote to stderr", doc_blocks.failure(
        chain, "p.md", doc_blocks.Result(0, "done\n", "W")))
    self.assertIn("failed", doc_blocks.failure(
        chain, "p.md", doc_blocks.Result(1, "", "NameError")))


class ReadmeTest(absltest.TestCase):

  def test_python_blocks_run_with_nothing_on_stderr(self):
    blocks = [b for b in code_blocks(_readme()) if b.language == "python"]
    self.assertGreaterEqual(len(blocks), 2)  # Quickstart, mesh.
    for chain in doc_blocks.chains(blocks):
      if chain.gpu_only and not script_util.has_nvidia_devices():
        continue
      with self.subTest(line=chain.first_line):
        result = doc_blocks.run_chain(chain, "README.md", _ROOT)
        problem = doc_blocks.failure(chain, "README.md", result)
        self.assertIsNone(problem, problem)
        if not script_util.has_nvidia_devices() and any(
            "make_mesh" in b.code for b in chain.blocks):
          # The mesh snippet spans every local device: 8 virtual CPU
          # devices, which the snippet asks for itself.
          self.assertIn("'x': 8", result.stdout)

  def test_eager_table_is_the_committed_results(self):
    # Rows only for GPUs whose dispatch result names its commit, figures
    # as the committed JSON has them.
    path = os.path.join(_ROOT, "benchmarks", "doc_tables.py")
    if not os.path.exists(path):
      self.skipTest(f"{path} is not in this tree")
    spec = importlib.util.spec_from_file_location("doc_tables", path)
    doc_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_tables)
    readme = _readme()
    start = readme.index(doc_tables.README_START) + len(
        doc_tables.README_START)
    self.assertEqual(readme[start:readme.index(doc_tables.README_END)],
                     f"\n{doc_tables.readme_table()}\n",
                     "README.md's eager table is not the committed results:"
                     " python benchmarks/doc_tables.py --readme README.md")

  def test_the_readme_is_short(self):
    # The reference material lives on the docs site (docs/).
    lines = _readme().count("\n")
    self.assertLessEqual(lines, 200, f"README.md has {lines} lines; move"
                         " reference material to a page under docs/")

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
    # The ROCm suite cross-lowers through JAX's ROCm plugin: without it,
    # most of a CPU host's skips would be that suite's.
    rocm = re.search(r"pip install --no-deps \"jax-rocm7-plugin=="
                     r"\$\(python -c '[^']*'\)\"", bash)
    self.assertIsNotNone(rocm, "README installs no jax-rocm7-plugin")
    for command in ("pip install -e .", "python examples/sharded_add.py",
                    'pip install -e ".[test]"', plugin.group(0),
                    rocm.group(0),
                    "python -m pytest tests tests_multigpu -q"):
      self.assertIn(command, bash)
      self.assertIn(command, ci)


if __name__ == "__main__":
  absltest.main()
