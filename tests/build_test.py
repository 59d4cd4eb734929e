"""BUILD lists every module, test, example and benchmark file."""

import ast
import glob
import os

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _literals() -> set[str]:
  """Every string literal in BUILD."""
  with open(os.path.join(_ROOT, "BUILD")) as f:
    tree = ast.parse(f.read())  # BUILD's Starlark here is valid Python.
  return {node.value for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def _build_strings() -> set[str]:
  """BUILD's literals, plus those its comprehensions build with `%`."""
  strings = _literals()
  # List comprehensions name "tests/%s.py" % name: expand them.
  templates = {s for s in strings if "%s" in s}
  return strings | {t % s for t in templates for s in strings}


def _sources(folder: str) -> list[str]:
  return sorted(
      os.path.relpath(p, _ROOT)
      for p in glob.glob(os.path.join(_ROOT, folder, "**", "*.py"),
                         recursive=True)
      if not os.path.basename(p) == "conftest.py")


class BuildTest(absltest.TestCase):

  def test_every_python_file_is_listed(self):
    listed = _build_strings()
    for folder in ("jt_dist", "tests", "tests_multigpu", "examples",
                   "benchmarks"):
      for path in _sources(folder):
        self.assertIn(path, listed, f"{path} is missing from BUILD")

  def test_every_test_file_has_a_py_test(self):
    with open(os.path.join(_ROOT, "BUILD")) as f:
      text = f.read()
    for path in _sources("tests") + _sources("tests_multigpu"):
      if not path.endswith("_test.py"):
        continue
      name = os.path.basename(path)[:-3]
      self.assertIn(f'"{name}"', text, f"no py_test named {name} in BUILD")

  def test_listed_files_exist(self):
    for entry in _literals():
      if entry.endswith(".py") and "%" not in entry and "/" in entry:
        self.assertTrue(os.path.exists(os.path.join(_ROOT, entry)), entry)


if __name__ == "__main__":
  absltest.main()
