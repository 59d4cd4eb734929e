"""Pytest start-up: 8 virtual CPU devices, set before JAX initialises.

Where JAX's ROCm plugin is installed without ROCm, a stub HIP runtime is
loaded first (tests/hip_stub.py), so that jaxlib's ROCm Triton bindings
import and tests/rocm_lowering_test.py can cross-lower for AMD GPUs.

The suites run in 2 pytest-xdist workers (pyproject's ``addopts``:
``--numprocesses=2 --dist=loadscope``): each test class goes whole to the
next free worker, so that a ``setUpClass`` runs once. ``-n 0`` runs them in
this process. Without pytest-xdist (the ``test`` extra installs it) those two
options are accepted and ignored, and the suites run in this process. The
process that hands the tests to the workers imports neither jax nor jt_dist.
"""

import atexit
import gc
import os
import sys

# Each xdist worker is a JAX process of its own: on a GPU host, two that
# each preallocated most of a GPU's memory would starve each other.
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "tests"))

_NO_XDIST = ("pytest-xdist is not installed or not loaded (the test extra"
             " installs it): the tests run in this process")


def pytest_addoption(parser, pluginmanager):
  # pyproject's addopts pass --numprocesses and --dist; without xdist they
  # would be unknown options and pytest would refuse to start.
  if pluginmanager.hasplugin("xdist"):
    return
  parser.addoption("--numprocesses", dest="numprocesses", default=None,
                   help=f"ignored: {_NO_XDIST}")
  parser.addoption("--dist", dest="dist", default="no",
                   help=f"ignored: {_NO_XDIST}")


def _distributes(config) -> bool:
  """Whether this process is pytest-xdist's controller, which runs no test.

  As xdist decides (its ``pytest_configure``): a distribution mode and
  workers to start, unless pytest only collects (then this process does).
  """
  return (not os.environ.get("PYTEST_XDIST_WORKER")
          and config.pluginmanager.hasplugin("xdist")
          and not config.getoption("collectonly")
          and config.getoption("dist", "no") != "no"
          and bool(config.getoption("tx", None)))


def pytest_configure(config):
  # The controller only hands tests to the workers: it never imports jax
  # (about a second, before the workers start). Everywhere else the stub
  # HIP runtime and the CPU device count must precede jax's import, which
  # the test modules' collection does.
  if _distributes(config):
    return
  import hip_stub  # pylint: disable=g-import-not-at-top
  hip_stub.load_if_needed()
  from jt_dist import testing  # pylint: disable=g-import-not-at-top
  testing.configure_cpu_devices()


def pytest_report_header(config):
  if not config.pluginmanager.hasplugin("xdist"):
    return _NO_XDIST
  return None


def pytest_collection_finish(session):
  # What the collection imported (jax, Triton, the test modules: about
  # 175,000 objects) lives until the end. Frozen, it is no longer walked by
  # each full collection: in one run, the two workers' full collections
  # took 1.0 s instead of 2.8 s. Frozen objects are never collected, and at
  # exit nanobind would report jaxlib's objects among them as leaked: they
  # thaw at exit, not at the session's end, where pytest's own last
  # collections (for unraisable exceptions) would walk them all again.
  del session
  gc.collect()
  gc.freeze()
  atexit.register(gc.unfreeze)
