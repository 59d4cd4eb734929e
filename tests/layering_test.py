"""jt_dist's subpackages import one another in one direction only.

A call's path meets each layer once: ``_core`` (binding, call spec, the
primitive) imports no platform, each platform registers its own rules on
the primitive, and ``_sharding`` binds the primitive without reaching back
into the front door (``_call``). The graph is read from the sources.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized

import jt_dist
import layout_test

# The package the suite imports: the clone's, or an installed wheel's.
_PACKAGE = os.path.dirname(os.path.abspath(jt_dist.__file__))

# Subpackages a lower layer must never import.
_PLATFORMS = ("_cpu", "_gpu", "_vmap", "_autotune")
_FORBIDDEN = {
    "_compat": ("_core", "_backend", "_sharding", "_call", "_tools")
               + _PLATFORMS,
    "_core": ("_backend", "_sharding", "_call", "_tools") + _PLATFORMS,
    "_backend": ("_sharding", "_call", "_tools") + _PLATFORMS,
    "_sharding": ("_call", "_tools") + _PLATFORMS,
    "_cpu": ("_gpu", "_vmap", "_call", "_tools"),
    "_gpu": ("_vmap", "_call", "_tools"),
    "_vmap": ("_cpu", "_gpu", "_call", "_tools"),
    "_call": ("_tools",),
}


def _subpackages() -> list[str]:
  return sorted(d for d in os.listdir(_PACKAGE)
                if os.path.isfile(os.path.join(_PACKAGE, d, "__init__.py")))


def import_graph() -> dict[str, dict[str, str]]:
  """subpackage -> {subpackage it imports: one file that does}."""
  subpackages = set(_subpackages())
  graph = {name: {} for name in subpackages}
  for name in subpackages:
    for folder, _, files in os.walk(os.path.join(_PACKAGE, name)):
      for file in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(folder, file)
        with open(path, encoding="utf-8") as f:
          source = f.read()
        package = ".".join(["jt_dist", *os.path.relpath(
            folder, _PACKAGE).split(os.sep)])
        for _, module in layout_test.imported_modules(source, package):
          parts = module.split(".")
          if (len(parts) > 1 and parts[0] == "jt_dist"
              and parts[1] in subpackages and parts[1] != name):
            graph[name].setdefault(parts[1], os.path.relpath(path, _PACKAGE))
  return graph


def _cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
  """One cycle of ``graph`` as a path of subpackages, or None."""
  state: dict[str, str] = {}
  path: list[str] = []

  def visit(node):
    state[node] = "open"
    path.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    state[node] = "done"
    path.pop()
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


class LayeringTest(parameterized.TestCase):

  def test_the_graph_is_read(self):
    graph = import_graph()
    self.assertIn("_core", graph["_sharding"])
    self.assertIn("_sharding", graph["_call"])

  def test_subpackage_imports_are_acyclic(self):
    graph = import_graph()
    cycle = _cycle(graph)
    self.assertIsNone(cycle, "import cycle: " + " -> ".join(
        f"{a} ({graph[a][b]})" for a, b in zip(cycle or [], (cycle or [])[1:])))

  @parameterized.parameters(*sorted(_FORBIDDEN))
  def test_layer_imports_only_layers_below(self, layer):
    graph = import_graph()
    wrong = {name: where for name, where in graph[layer].items()
             if name in _FORBIDDEN[layer]}
    self.assertEqual(wrong, {}, f"{layer} imports layers above it")

  def test_only_the_interpreter_package_imports_tritons_interpreter(self):
    # Each Triton-version difference of the interpreter is fenced there.
    importers = []
    for folder, _, files in os.walk(_PACKAGE):
      for file in sorted(f for f in files if f.endswith(".py")):
        path = os.path.join(folder, file)
        with open(path, encoding="utf-8") as f:
          source = f.read()
        package = ".".join(["jt_dist", *os.path.relpath(
            folder, _PACKAGE).split(os.sep)]).rstrip(".")
        if any(module.startswith("triton.runtime.interpreter")
               for _, module in layout_test.imported_modules(source, package)):
          importers.append(os.path.relpath(path, _PACKAGE))
    self.assertNotEqual(importers, [])
    self.assertEqual(
        [p for p in importers
         if not p.startswith(os.path.join("_cpu", "interpreter") + os.sep)],
        [])

  def test_cycle_finder_finds_one(self):
    graph = {"a": {"b": "a/x.py"}, "b": {"c": "b/y.py"}, "c": {"a": "c/z.py"}}
    self.assertEqual(_cycle(graph), ["a", "b", "c", "a"])
    self.assertIsNone(_cycle({"a": {"b": "a/x.py"}, "b": {}}))


if __name__ == "__main__":
  absltest.main()
