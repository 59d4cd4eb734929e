"""MkDocs hook: each line ``<!-- diagram: NAME -->`` becomes picture NAME.

mkdocs.yml lists this file among its hooks. The pictures are drawn when the
site builds, from the code in this folder, as inline SVG (so that they take
the page's fonts and its light or dark palette). A mark naming no picture,
or a picture that does not render, fails the build.

    python docs/_diagrams/hook.py DIR    # writes every picture to DIR
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
MARK = re.compile(r"^<!--\s*diagram:\s*([\w.-]+)\s*-->[ \t]*$", re.M)


def _load():
  """This folder as the package ``_diagrams`` (its modules import each
  other relatively; a hook is loaded as a lone file)."""
  if "_diagrams" in sys.modules:
    return sys.modules["_diagrams"]
  spec = importlib.util.spec_from_file_location(
      "_diagrams", os.path.join(_HERE, "__init__.py"),
      submodule_search_locations=[_HERE])
  module = importlib.util.module_from_spec(spec)
  sys.modules["_diagrams"] = module
  spec.loader.exec_module(module)
  return module


diagrams = _load()


class DiagramError(Exception):
  """A mark names no picture, or a picture does not render."""


def figures(markdown: str, where: str) -> str:
  """``markdown`` with each mark replaced by its picture in a ``<figure>``."""
  def figure(match):
    name = match.group(1)
    try:
      svg = diagrams.render(name)
    except KeyError:
      raise DiagramError(
          f"{where}: `<!-- diagram: {name} -->` names no picture; the"
          f" pictures are {', '.join(sorted(diagrams.PICTURES))}"
          " (docs/_diagrams/__init__.py).") from None
    except Exception as e:  # pylint: disable=broad-except
      raise DiagramError(f"{where}: picture {name!r} does not render: {e}"
                         ) from e
    return f'<figure class="jtd-figure">\n{svg}\n</figure>'
  return MARK.sub(figure, markdown)


def on_page_markdown(markdown, page, **kwargs):  # pylint: disable=unused-argument
  from mkdocs.exceptions import PluginError  # pylint: disable=g-import-not-at-top
  try:
    return figures(markdown, page.file.src_uri)
  except DiagramError as e:
    raise PluginError(str(e)) from e


def main(argv) -> None:
  if len(argv) != 2:
    raise SystemExit(f"usage: python {argv[0]} DIR")
  os.makedirs(argv[1], exist_ok=True)
  for name in sorted(diagrams.PICTURES):
    path = os.path.join(argv[1], f"{name}.svg")
    with open(path, "w", encoding="utf-8") as f:
      f.write(diagrams.render(name) + "\n")
    print(path)


if __name__ == "__main__":
  main(sys.argv)
