"""Runs a test class's eager CPU calls through XLA's host callback.

An eager call on CPU arrays launches the kernel directly
(``jt_dist._cpu.direct``); under ``jax.jit`` the same kernel runs in XLA's
host callback. Suites whose eager tests are about the callback route
itself (what an executable raises, how a launch inside it is stopped) run
with the direct launches off.
"""

from jt_dist._cpu import direct as _direct


class XlaRouteMixin:
  """Mixed in before a ``TestCase``: eager CPU calls take the executable.

  They compile and run an XLA executable, as calls under ``jax.jit`` do.
  """

  def setUp(self):
    super().setUp()
    previous = _direct.use_direct(False)
    self.addCleanup(_direct.use_direct, previous)
