"""Every ```python block of every page under docs/ runs, with nothing on stderr.

Each page's blocks run as tests/doc_blocks.py says: a self-contained block
in a fresh process of its own, a block marked ``<!-- continues: NAME -->``
after the block it continues. Blocks marked ``<!-- gpu only: ... -->`` run
on hosts with NVIDIA GPUs; ``<!-- not run: ... -->`` blocks never run.
The benchmarks page types no figure: its tables come from
benchmarks/results/ through benchmarks/doc_tables.py, and that folder holds
exactly the files the pages render. Every example has a page that includes
its script, and the API reference's option tables agree with the
signatures.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import inspect
import json
import os
import re
from xml.etree import ElementTree

from absl.testing import absltest
from absl.testing import parameterized

import doc_blocks
import jt_dist
import script_util

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = os.path.join(_ROOT, "docs")


def _pages() -> list[str]:
  return sorted(os.path.relpath(p, _ROOT) for p in glob.glob(
      os.path.join(_DOCS, "**", "*.md"), recursive=True))


def _pages_with_python() -> list[str]:
  """The pages with at least one python block that runs.

  Pages whose python blocks are all marked not to run (the examples' pages,
  which include each script: tests/examples_test.py runs the scripts) have
  nothing to run; test_every_page_s_marks_are_valid still reads them.
  """
  return [path for path in _pages()
          if any(b.language == "python" and b.not_run is None
                 for b in doc_blocks.code_blocks(_read(path), path))]


def _doc_tables():
  """benchmarks/doc_tables.py, the MkDocs hook that renders results."""
  path = os.path.join(_ROOT, "benchmarks", "doc_tables.py")
  spec = importlib.util.spec_from_file_location("doc_tables", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _read(path: str) -> str:
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    return f.read()


class DocsTest(parameterized.TestCase):

  def test_there_are_pages(self):
    if not os.path.isdir(_DOCS):
      self.skipTest(f"{_DOCS} is not in this tree")
    self.assertGreaterEqual(len(_pages()), 10)

  def test_every_page_s_marks_are_valid(self):
    # Unknown marks, marks without a reason and chains that continue a
    # missing block raise ValueError, on pages that run nothing too.
    for path in _pages():
      doc_blocks.chains(doc_blocks.code_blocks(_read(path), path), path)

  @parameterized.named_parameters(
      (re.sub(r"\W", "_", path[len("docs/"):-len(".md")]), path)
      # A tree without docs/ (Bazel runfiles without data) gets one test
      # that skips, not a NoTestsError.
      for path in _pages_with_python() or ["docs/missing.md"])
  def test_page_blocks_run_with_nothing_on_stderr(self, path):
    if not os.path.exists(os.path.join(_ROOT, path)):
      self.skipTest(f"{path} is not in this tree")
    blocks = doc_blocks.code_blocks(_read(path), path)
    chains = doc_blocks.chains(blocks, path)
    if not chains:
      self.skipTest(f"{path}: every python block is marked not to run")
    skipped = []
    for chain in chains:
      if chain.gpu_only and not script_util.has_nvidia_devices():
        skipped.append(f"line {chain.first_line}: {chain.gpu_only}")
        continue
      with self.subTest(line=chain.first_line):
        result = doc_blocks.run_chain(chain, path, _ROOT)
        problem = doc_blocks.failure(chain, path, result)
        self.assertIsNone(problem, problem)
    if len(skipped) == len(chains):
      self.skipTest(f"{path}: every block needs a GPU: {'; '.join(skipped)}")

  def test_every_example_has_a_page_showing_its_script(self):
    index = os.path.join("docs", "examples", "index.md")
    if not os.path.exists(os.path.join(_ROOT, index)):
      self.skipTest(f"{index} is not in this tree")
    listed = _read(index)
    for example in sorted(glob.glob(os.path.join(_ROOT, "examples", "*.py"))):
      name = os.path.splitext(os.path.basename(example))[0]
      page = os.path.join("docs", "examples", f"{name}.md")
      self.assertTrue(os.path.exists(os.path.join(_ROOT, page)),
                      f"examples/{name}.py has no page {page}")
      self.assertIn(f"({name}.md)", listed, f"{index} does not link {page}")
      # The snippets extension includes the script itself, as it is now.
      self.assertIn(f'--8<-- "examples/{name}.py"', _read(page), page)

  @parameterized.named_parameters(
      ("triton_call", "calling.md", "triton_call"),
      ("sharded_triton_call", "sharding.md", "sharded_triton_call"))
  def test_the_options_tables_match_the_signatures(self, page, function):
    path = os.path.join("docs", "api", page)
    if not os.path.exists(os.path.join(_ROOT, path)):
      self.skipTest(f"{path} is not in this tree")
    rows = re.findall(r"^\| `(\w+)` \| .*? \| (required|`[^`]*`) \| .*\|$",
                      _read(path), re.M)
    parameters = inspect.signature(getattr(jt_dist, function)).parameters
    expected = [(p.name, "required" if p.default is p.empty
                 else f"`{p.default!r}`")
                for p in parameters.values() if p.kind is p.KEYWORD_ONLY]
    self.assertEqual(rows, expected, f"{path}: the table of {function}'s"
                     " options, against inspect.signature")

  def test_the_benchmarks_page_types_no_figure(self):
    path = os.path.join("docs", "benchmarks.md")
    if not os.path.exists(os.path.join(_ROOT, path)):
      self.skipTest(f"{path} is not in this tree")
    text = _read(path)
    prose = re.sub(r"```.*?```|`[^`]*`|<!--.*?-->", "", text, flags=re.S)
    # A measured figure has a decimal point, or a unit of time or rate.
    figures = re.findall(
        r"\d+\.\d+|\d[\d,]*\s*(?:µs|us|ms|s\b|TFLOP/s|GB/s|×|%)", prose)
    self.assertEqual(figures, [], f"{path} types figures by hand; render"
                     " them from benchmarks/results/ with a"
                     " `<!-- results: FILE -->` mark")
    marks = re.findall(r"^<!--\s*results:\s*(\S+)\s*-->\s*$", text, re.M)
    self.assertNotEmpty(marks)
    doc_tables = _doc_tables()
    for mark in marks:
      path = os.path.join(_ROOT, "benchmarks", "results", mark)
      self.assertTrue(os.path.exists(path), mark)
      with open(path, encoding="utf-8") as f:
        measured = doc_tables.measured(json.load(f))
      rendered = doc_tables.render_file(mark)
      if measured:
        # The commit it measured, its tables and its charts.
        self.assertIn("at commit `", rendered, mark)
        self.assertIn("| --- |", rendered, mark)
        self.assertIn("<svg", rendered, mark)
      else:
        self.assertIn("Not yet measured on this tree", rendered, mark)
        self.assertNotIn("| --- |", rendered, mark)
        self.assertIn(doc_tables.command(mark), rendered, mark)
    rendered = doc_tables.expand(text)
    self.assertEqual(rendered.count("*Rendered from"), len(marks))

  def test_the_cpu_results_are_measured_on_this_tree(self):
    # Re-run on this host with benchmarks/run.py --suite all-cpu.
    doc_tables = _doc_tables()
    for path in glob.glob(os.path.join(_ROOT, "benchmarks", "results",
                                       "cpu", "*.json")):
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
      self.assertTrue(doc_tables.measured(data), path)
      self.assertFalse(data["quick"], path)
      self.assertEqual(data["schema"], 1, path)

  def test_a_quick_run_or_a_bad_chart_fails_the_build(self):
    doc_tables = _doc_tables()
    data = {"schema": 1, "quick": True, "provenance": {"commit": "f00dfeed"},
            "results": [{"case": "c", "impl": "a", "us": 1.0},
                        {"case": "c", "impl": "b", "us": 2.0}]}
    with self.assertRaisesRegex(ValueError, "quick"):
      doc_tables.render(data, "cpu/x.json")
    data["quick"] = False
    self.assertIn("<svg", doc_tables.render(data, "cpu/x.json"))
    data["plots"] = [{"case": "c", "metrics": ["missing"]}]
    with self.assertRaisesRegex(ValueError, "nothing to plot"):
      doc_tables.render(data, "cpu/x.json")

  def test_charts_are_svg_in_the_page_s_colours(self):
    chart = _doc_tables().bar_chart(
        "t", [{"impl": "a <b>", "ms": 1.5}, {"impl": "c", "ms": 3.0}], ["ms"])
    root = ElementTree.fromstring(chart)
    self.assertEqual(root.get("fill"), "currentColor")
    self.assertEqual(len(root.findall("{http://www.w3.org/2000/svg}rect")), 3)

  def test_the_results_folder_holds_only_what_the_docs_render(self):
    results = os.path.join(_ROOT, "benchmarks", "results")
    if not os.path.isdir(results) or not os.path.isdir(_DOCS):
      self.skipTest("benchmarks/results/ or docs/ is not in this tree")
    rendered = set()
    for path in _pages():
      rendered.update(re.findall(r"^<!--\s*results:\s*(\S+)\s*-->\s*$",
                                 _read(path), re.M))
    present = {os.path.relpath(os.path.join(folder, name), results)
               for folder, _, names in os.walk(results) for name in names}
    # One JSON per benchmark and device (DEVICE/BENCHMARK.json), each
    # rendered by a page; logs and earlier runs stay out of the repository.
    self.assertEqual(present, rendered)
    for name in present:
      self.assertRegex(name, r"^[a-z0-9]+/[a-z0-9_]+\.json$")

  def test_every_public_name_is_on_an_api_page(self):
    pages = glob.glob(os.path.join(_DOCS, "api", "*.md"))
    if not pages:
      self.skipTest("docs/api/ is not in this tree")
    text = "".join(_read(p) for p in pages)
    import jt_dist.testing  # pylint: disable=g-import-not-at-top
    for module in (jt_dist, jt_dist.testing):
      for name in module.__all__:
        # An entry (`::: jt_dist.NAME`, or a member of `::: jt_dist.testing`)
        # or the name in code on a page.
        found = re.search(
            rf"^::: {module.__name__}\.{name}$|^ +- {name}$"
            rf"|`(?:{module.__name__}\.)?{re.escape(name)}`", text, re.M)
        self.assertTrue(found,
                        f"{module.__name__}.{name} is on no page of docs/api/")

  def test_the_api_index_names_every_public_name(self):
    path = os.path.join("docs", "api", "index.md")
    if not os.path.exists(os.path.join(_ROOT, path)):
      self.skipTest(f"{path} is not in this tree")
    text = _read(path)
    missing = [name for name in jt_dist.__all__
               if f"`{name}`" not in text and f"`jt_dist.{name}`" not in text]
    self.assertEqual(missing, [], f"{path}'s table leaves these out")

  def test_the_docs_speak_of_the_product_not_of_its_history(self):
    paths = _pages() + ["README.md", "CHANGELOG.md"]
    history = re.compile(
        r"\bissues?\b|\bsessions?\b|(?<![\w&])#\d+\b"
        # A commit: 7 to 40 hex digits, with a letter and a digit.
        r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", re.I)
    for path in paths:
      if os.path.exists(os.path.join(_ROOT, path)):
        found = [m.group(0) for m in history.finditer(_read(path))]
        self.assertEqual(found, [], f"{path} names an issue, a session or"
                         " a commit: say what the product does instead")

  def test_rendered_tables_leave_out_commits(self):
    table = _doc_tables()._by_case(  # pylint: disable=protected-access
        [{"case": "suite", "impl": "this tree", "commit": "f00dfeed",
          "wall_s": 1.5}])
    self.assertNotIn("f00dfeed", table)
    self.assertIn("wall_s", table)

  def test_contributing_lists_every_module(self):
    text = _read("CONTRIBUTING.md")
    section = text.split("### Every module", 1)[-1].split("\n## ", 1)[0]
    listed = set()
    for item in re.split(r"^\* ", section, flags=re.M)[1:]:
      folder = re.match(r"\*\*`((?:\w+/)+)`\*\*", item)
      prefix = folder.group(1) if folder else ""
      listed.update(prefix + name
                    for name in re.findall(r"`(\w+\.py)`", item))
    package = os.path.join(_ROOT, "jt_dist")
    modules = set()
    for path in glob.glob(os.path.join(package, "**", "*.py"),
                          recursive=True):
      name = os.path.relpath(path, package).replace(os.sep, "/")
      # A subpackage's __init__.py that holds only its docstring is the
      # folder's, not a module to list.
      if name.endswith("/__init__.py") and len(
          ast.parse(_read(os.path.join("jt_dist", name))).body) <= 1:
        continue
      modules.add(name)
    self.assertEqual(sorted(listed - modules), [],
                     "CONTRIBUTING.md lists modules that do not exist")
    self.assertEqual(sorted(modules - listed), [],
                     "CONTRIBUTING.md's 'Every module' leaves these out")


if __name__ == "__main__":
  absltest.main()
