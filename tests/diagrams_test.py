"""The docs' pictures: each renders as well-formed SVG within its bounds,
names what it should, and draws the kernels as the docs declare them; the
MkDocs hook puts each where a page asks for it, and fails the build on a
mark that names no picture.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import types
from xml.etree import ElementTree

from absl.testing import absltest
from absl.testing import parameterized

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SVG = "{http://www.w3.org/2000/svg}"


def _hook():
  """docs/_diagrams/hook.py, as MkDocs loads it."""
  path = os.path.join(_ROOT, "docs", "_diagrams", "hook.py")
  spec = importlib.util.spec_from_file_location("diagrams_hook", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_HOOK = _hook() if os.path.isdir(os.path.join(_ROOT, "docs")) else None
_NAMES = sorted(_HOOK.diagrams.PICTURES) if _HOOK else ["missing"]


def _read(path: str) -> str:
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    return f.read()


def _pages() -> list[str]:
  return sorted(os.path.relpath(p, _ROOT) for p in glob.glob(
      os.path.join(_ROOT, "docs", "**", "*.md"), recursive=True))


def _texts(svg: str) -> list[ElementTree.Element]:
  return list(ElementTree.fromstring(svg).iter(f"{_SVG}text"))


class DiagramsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if _HOOK is None:
      self.skipTest("docs/ is not in this tree")

  @parameterized.parameters(*_NAMES)
  def test_renders_well_formed_within_its_bounds(self, name):
    svg = _HOOK.diagrams.render(name)
    root = ElementTree.fromstring(svg)
    self.assertEqual(root.tag, f"{_SVG}svg")
    self.assertNotIn("\n\n", svg)  # Markdown ends a raw HTML block there.
    self.assertTrue(root.find(f"{_SVG}title").text.strip())
    _, _, width, height = map(float, root.get("viewBox").split())
    self.assertEqual((width, height), (float(root.get("width")),
                                       float(root.get("height"))))
    # Every label fits in the picture, as wide as its font draws it.
    svg_module = _HOOK.diagrams.svg
    for text in _texts(svg):
      classes = (text.get("class") or "").split()
      size = 11 if "small" in classes else 13 if "heading" in classes else 12
      drawn = svg_module.text_width(text.text, size, "prose" not in classes)
      left = {"start": 0, "middle": drawn / 2, "end": drawn}[
          text.get("text-anchor")]
      x, y = float(text.get("x")), float(text.get("y"))
      self.assertGreaterEqual(x - left, 0, text.text)
      self.assertLessEqual(x - left + drawn, width + 0.5, text.text)
      self.assertLessEqual(y, height, text.text)
    # Each arrowhead used is defined, with an id of this picture's own.
    ids = {m.get("id") for m in root.iter(f"{_SVG}marker")}
    used = set(re.findall(r'marker-end="url\(#([\w-]+)\)"', svg))
    self.assertEqual(used, ids)
    self.assertTrue(all(i.startswith(f"jtd-{name}-") for i in ids))

  @parameterized.parameters(
      ("binding", ["x_ptr", "out_ptr", "BLOCK", "xy", "z_ptr", "Mean",
                   "BLOCK_SIZE", "call", "wrapper", "kernel"]),
      ("binding-positional", ["x_ptr", "y_ptr", "n", "out_ptr", "BLOCK"]),
      ("calls", ["triton_call's memo", "jax.jit's executables",
                 "compiled kernels", "kernel_call(…)(x)", "jax.jit(f)(x)"]),
      ("mesh-sharded-call", ["device 0", "device 3",
                             "n = shard_size(0) = 2048"]),
      ("mesh-out-reduce", ["psum", "K = shard_size(0, axis=1)"]),
      ("mesh-sharding-rule", ["M = shard_size(0, axis=0)",
                              "C: float32[M@x, N]"]),
  )
  def test_names_what_it_draws(self, name, labels):
    texts = [t.text for t in _texts(_HOOK.diagrams.render(name))]
    for label in labels:
      self.assertIn(label, texts)

  def test_binding_draws_every_parameter_of_each_kernel_as_the_docs_declare(
      self):
    binding = _HOOK.diagrams.binding
    docs = _read("README.md") + "".join(_read(p) for p in _pages())
    texts = [t.text for t in _texts(_HOOK.diagrams.render("binding"))]
    for kernel, params in binding.KERNELS.items():
      with self.subTest(kernel=kernel):
        found = re.search(rf"^def {kernel}\((.*?)\):", docs, re.M | re.S)
        self.assertIsNotNone(found, f"no page defines {kernel}")
        declared = [p.split(":")[0].split("=")[0].strip()
                    for p in found.group(1).split(",")]
        self.assertEqual(list(params), declared)
        self.assertIn(f"def {kernel}(", " ".join(texts))
        for param in params:
          self.assertIn(param, texts)

  def test_each_picture_is_on_a_page_and_each_mark_names_one(self):
    placed = set()
    for path in _pages():
      for name in _HOOK.MARK.findall(_read(path)):
        self.assertIn(name, _HOOK.diagrams.PICTURES, path)
        placed.add(name)
    self.assertEqual(placed, set(_HOOK.diagrams.PICTURES))

  def test_a_mark_becomes_a_figure_with_its_picture(self):
    page = "intro\n\n<!-- diagram: calls -->\n\nafter\n"
    out = _HOOK.figures(page, "page.md")
    self.assertNotIn("<!-- diagram", out)
    self.assertIn('<figure class="jtd-figure">\n<svg ', out)
    self.assertTrue(out.startswith("intro\n\n") and out.endswith("\nafter\n"))
    # A mark quoted inside a line is left as it is.
    quoted = "Write `<!-- diagram: nope -->` on a line.\n"
    self.assertEqual(_HOOK.figures(quoted, "page.md"), quoted)

  def test_a_mark_naming_no_picture_fails_the_build(self):
    if importlib.util.find_spec("mkdocs") is None:
      self.skipTest("mkdocs is not installed (pip install -e '.[docs]')")
    from mkdocs.exceptions import PluginError  # pylint: disable=g-import-not-at-top
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="x.md"))
    with self.assertRaisesRegex(PluginError,
                                r"x\.md: .*nope.* names no picture.*binding"):
      _HOOK.on_page_markdown("<!-- diagram: nope -->\n", page)

  def test_a_picture_that_does_not_render_fails_the_build(self):
    if importlib.util.find_spec("mkdocs") is None:
      self.skipTest("mkdocs is not installed (pip install -e '.[docs]')")
    from mkdocs.exceptions import PluginError  # pylint: disable=g-import-not-at-top
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="x.md"))
    pictures = _HOOK.diagrams.PICTURES
    pictures["broken"] = lambda: "<svg><text>unclosed</svg>"
    try:
      with self.assertRaisesRegex(PluginError, "'broken' does not render.*"
                                  "well-formed"):
        _HOOK.on_page_markdown("<!-- diagram: broken -->\n", page)
    finally:
      del pictures["broken"]

  def test_the_hook_is_in_mkdocs_yml_and_its_sources_are_not_pages(self):
    config = _read("mkdocs.yml")
    self.assertRegex(config, r"(?m)^hooks:\n(  - .*\n)*  - docs/_diagrams/hook\.py$")
    self.assertRegex(config, r"(?m)^exclude_docs: \|\n  /_diagrams/$")


if __name__ == "__main__":
  absltest.main()
