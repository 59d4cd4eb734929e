"""Runs a test class's tests with the lean eager hit in Python.

Where ``jt_dist/_call/lean_hit/`` is built, eager calls take it; its
Python twin (``jt_dist._call.lean``) is the reference and the fallback
where no compiler was at hand, and the suites run both.
"""

from jt_dist._call import lean as _lean


class PythonHitMixin:
  """Mixed in before a ``TestCase``: its tests take the Python hit."""

  def setUp(self):
    super().setUp()
    _lean.use_compiled(False)
    self.addCleanup(_lean.use_compiled, True)
