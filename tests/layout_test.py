"""The code layout the developers' guide asks for: small modules, layers.

Every module under jt_dist/ stays under ``_MAX_LINES`` lines, and the layers
below the front door (``jt_dist._call``, ``jt_dist._tools``) never import
it, at module level or inside a function. The allow-lists name what is
known to break a rule today; an entry that no longer applies fails too, so
the lists only shrink.
"""

import ast
import glob
import os

from absl.testing import absltest
from absl.testing import parameterized

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MAX_LINES = 500

# Modules allowed over _MAX_LINES (none): a module that grows past it is
# split by job.
_LONG_MODULES = frozenset()

# The layers below the front door, and the packages they must not import.
_LOWER_LAYERS = ("_autotune", "_compat", "_core", "_cpu", "_gpu",
                 "_sharding", "_vmap")
_FRONT_DOOR = ("jt_dist._call", "jt_dist._tools")

# (importing file, imported module) edges allowed below the front door:
# none.
_ALLOWED_EDGES = frozenset()


def _modules() -> list[str]:
  return sorted(
      os.path.relpath(p, _ROOT).replace(os.sep, "/")
      for p in glob.glob(os.path.join(_ROOT, "jt_dist", "**", "*.py"),
                         recursive=True))


def _line_count(path: str) -> int:
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    return sum(1 for _ in f)


def _package_of(path: str) -> str:
  """The dotted package a module file belongs to (for relative imports)."""
  return ".".join(os.path.dirname(path).split("/"))


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
  """Every module ``source`` imports, anywhere in it, as (line, dotted name).

  ``from a import b`` counts as importing ``a.b``, since ``b`` may be a
  module; relative imports are resolved against ``package``.
  """
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.extend((node.lineno, alias.name) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        parent = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{parent}.{base}" if base else parent
      found.extend((node.lineno, f"{base}.{alias.name}")
                   for alias in node.names)
  return found


def front_door_imports(source: str, package: str) -> list[tuple[int, str]]:
  """The imports in ``source`` of ``jt_dist._call`` or ``jt_dist._tools``."""
  return [(line, name) for line, name in imported_modules(source, package)
          if any(name == door or name.startswith(door + ".")
                 for door in _FRONT_DOOR)]


def _front_door_module(name: str) -> str:
  """``jt_dist._call.api.triton_call`` -> ``jt_dist._call.api``."""
  return ".".join(name.split(".")[:3])


def _lower_layer_edges() -> dict[tuple[str, str], list[str]]:
  """(file, front-door module) -> "file:line imports name" for each import."""
  edges = {}
  for path in _modules():
    if path.split("/")[1] not in _LOWER_LAYERS:
      continue
    with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
      source = f.read()
    for line, name in front_door_imports(source, _package_of(path)):
      edges.setdefault((path, _front_door_module(name)), []).append(
          f"{path}:{line} imports {name}")
  return edges


class LayoutTest(parameterized.TestCase):

  def test_modules_are_short(self):
    for path in _modules():
      if path in _LONG_MODULES:
        continue
      count = _line_count(path)
      self.assertLess(
          count, _MAX_LINES,
          f"{path} has {count} lines; split it into modules of one job each"
          f" under {_MAX_LINES} lines (CONTRIBUTING.md, Code rules).")

  def test_long_module_allow_list_is_current(self):
    for path in sorted(_LONG_MODULES):
      self.assertTrue(os.path.exists(os.path.join(_ROOT, path)),
                      f"{path} is allow-listed in _LONG_MODULES but gone")
      self.assertGreaterEqual(
          _line_count(path), _MAX_LINES,
          f"{path} is under {_MAX_LINES} lines now: remove it from"
          " _LONG_MODULES")

  def test_lower_layers_do_not_import_the_front_door(self):
    found = _lower_layer_edges()
    unexpected = [where for edge, wheres in sorted(found.items())
                  if edge not in _ALLOWED_EDGES for where in wheres]
    self.assertEmpty(
        unexpected,
        "modules below the front door import jt_dist._call or"
        " jt_dist._tools:\n  " + "\n  ".join(unexpected) + "\nMove what they"
        " need into their own layer (or one below it), or pass it in.")

  def test_allowed_edges_still_exist(self):
    stale = sorted(_ALLOWED_EDGES - set(_lower_layer_edges()))
    self.assertEmpty(
        stale,
        f"these edges are gone: remove them from _ALLOWED_EDGES: {stale}")

  @parameterized.named_parameters(
      ("module_level", "from jt_dist._call import api\n", 1,
       "jt_dist._call.api"),
      ("function_level",
       "import os\n\ndef f():\n  import jt_dist._tools.doctor\n", 4,
       "jt_dist._tools.doctor"),
      ("package_attribute", "from jt_dist import _tools\n", 1,
       "jt_dist._tools"),
      ("relative", "def f():\n  from .._call import dispatch\n", 2,
       "jt_dist._call.dispatch"),
  )
  def test_the_checker_finds(self, source, line, name):
    self.assertEqual(front_door_imports(source, "jt_dist._core"),
                     [(line, name)])

  def test_the_checker_passes_other_imports(self):
    source = ("import jt_dist\nfrom jt_dist import _compat\n"
              "from jt_dist._core import types\nfrom . import grid\n"
              "import jt_dist._callbacks\n")
    self.assertEqual(front_door_imports(source, "jt_dist._core"), [])


if __name__ == "__main__":
  absltest.main()
