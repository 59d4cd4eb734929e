"""Helpers for absltest suites of Triton kernels, on GPUs or the CPU.

Suites written with these helpers run unchanged on real GPUs and, through
Triton's interpreter, on virtual CPU devices: call
``configure_cpu_devices()`` before JAX starts, derive test classes from
``TestCase``, and ask for devices with ``require_devices``.

``run_processes`` starts a script as several processes joined by
``jax.distributed`` (virtual CPU devices in each, or one GPU each), and
fails with every process's output when one of them dies, raises or hangs;
the script joins with ``initialize_process()``.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import types
from typing import Any, Iterator

from absl.testing import parameterized
import jax
import numpy as np
import triton
import triton.language as tl

from jt_dist import _settings
from jt_dist._call.cache_info import clear_memory_caches
# Re-exported: tests over several processes joined by jax.distributed.
from jt_dist._tools.processes import configure_cpu_devices
from jt_dist._tools.processes import free_port
from jt_dist._tools.processes import initialize_process
from jt_dist._tools.processes import MultiProcessError
from jt_dist._tools.processes import ProcessOutput
from jt_dist._tools.processes import run_processes

__all__ = [
    "MultiProcessError",
    "ProcessOutput",
    "TestCase",
    "clear_memory_caches",
    "configure_cpu_devices",
    "free_port",
    "initialize_process",
    "isolated_caches",
    "isolated_settings",
    "kernel_launches",
    "platform",
    "run_processes",
    "tag_kernel",
]


def platform() -> str:
  """The platform tests run on: "gpu" when JAX sees GPUs, else "cpu"."""
  return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


# The custom calls a kernel launch lowers to: jt_dist's CPU target (or JAX's
# buffer callback, or pure_callback's target off the CPU), jaxlib's on GPUs.
_LAUNCH_TARGETS = {
    "cpu": r"(?:jt_dist_cpu_interpret|xla_(?:buffer|ffi)_python_cpu_callback)",
    "gpu": r"triton_kernel_call\w*",
}


def kernel_launches(text: str, platform_name: str | None = None) -> int:
  """How many kernel launches a lowered or compiled program's text holds.

  Args:
    text: ``jax.jit(f).lower(...).as_text()`` (StableHLO) or
      ``.compile().as_text()`` (HLO).
    platform_name: "cpu" or "gpu"; by default the platform tests run on.

  Returns:
    The number of jt_dist kernel launches (custom calls) in ``text``.
  """
  target = _LAUNCH_TARGETS[platform_name or platform()]
  return len(re.findall(rf"(?:custom_call @|custom_call_target=\"){target}\b",
                        text))


@contextlib.contextmanager
def isolated_settings(*, from_environment: bool = False) -> Iterator[None]:
  """Undoes, on leaving, what ``configure_cache``/``configure_autotune`` set.

  Args:
    from_environment: also set aside, for the block, what they set before
      it, so that the ``JT_DIST_*`` environment variables decide until the
      block configures something.

  Yields:
    None.
  """
  with _settings.restored(from_environment=from_environment):
    yield


@contextlib.contextmanager
def isolated_caches() -> Iterator[str]:
  """A disk cache of its own, and empty memory caches, for the block.

  On entering, the disk cache is turned on in a new temporary directory
  and what this process keeps in memory is forgotten
  (``clear_memory_caches``); on leaving, the settings are restored
  (``isolated_settings``), the memory caches emptied again and the
  directory deleted.

  Yields:
    The disk cache's directory.
  """
  with tempfile.TemporaryDirectory(prefix="jt_dist_cache_") as folder, \
      isolated_settings():
    _settings.configure_cache(disk_cache=True, cache_dir=folder)
    clear_memory_caches()
    try:
      yield folder
    finally:
      clear_memory_caches()


@triton.jit
def tag_kernel(x_ptr, n, out_ptr, tag_ptr, BLOCK: tl.constexpr,
               TAG: tl.constexpr):
  """``out = 2 * x``; program 0 also writes the constexpr ``TAG`` to ``tag``.

  Autotuned over configs that differ in ``TAG``, it shows which config ran
  on each shard (one ``tag`` element per shard), which is how the tests
  check that every shard of every process runs the same config.
  """
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2,
           mask=mask)
  if tl.program_id(0) == 0:
    tl.store(tag_ptr, TAG)


class TestCase(parameterized.TestCase):
  """An absltest case with fresh random inputs and device requirements."""

  def setUp(self):
    super().setUp()
    # A new seed per test: a fixed one would let a lucky input pass forever.
    self.seed = int.from_bytes(os.urandom(4), "little")
    self.np_rng = np.random.default_rng(self.seed)

  def random(self, shape, dtype=np.float32, low=-2.0, high=2.0) -> np.ndarray:
    """Fresh random values of ``dtype``; never all zeros."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
      return self.np_rng.random(shape) < 0.5
    if dtype.kind in "iu":
      lo = max(int(low * 50), int(np.iinfo(dtype).min))
      hi = min(int(high * 50), int(np.iinfo(dtype).max))
      return self.np_rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    return self.np_rng.uniform(low, high, size=shape).astype(dtype)

  def devices(self, count: int | None = None) -> list[Any]:
    """The local devices of the test platform, or skips if too few."""
    devices = jax.devices()
    if count is not None and len(devices) < count:
      kind = "GPUs" if platform() == "gpu" else f"{devices[0].platform} devices"
      self.skipTest(f"needs >={count} {kind}, found {len(devices)}")
    return devices if count is None else devices[:count]

  @contextlib.contextmanager
  def assertRaisesKernelError(self, error_type: type[BaseException],
                              *, jitted: bool) -> Iterator[Any]:
    """Expects a kernel's ``error_type`` out of the ``with`` block.

    Outside any trace a call raises the kernel's own exception; inside the
    caller's ``jax.jit`` the kernel runs in a host callback (on the CPU),
    and jax's error (``JaxRuntimeError``, or ``ValueError`` in some jax
    versions) carries the kernel's exception type and message. A kernel
    that fails to compile for a GPU raises its own exception under
    ``jax.jit`` too, when the call is lowered: either form is accepted.

    Args:
      error_type: the kernel's exception type.
      jitted: whether the call runs inside the caller's ``jax.jit``.

    Yields:
      An object whose ``message`` is the kernel's message, once raised.
    """
    caught = types.SimpleNamespace(message=None)
    expected = Exception if jitted else error_type
    with self.assertRaises(expected) as raised:
      yield caught
    message = str(raised.exception)
    if jitted and not isinstance(raised.exception, error_type):
      head = f"{error_type.__name__}: "
      self.assertIn(head, message)
      message = message[message.index(head) + len(head):]
    caught.message = message

  def assertAllClose(self, actual, expected, *, rtol=1e-5, atol=1e-5,
                     msg: str = ""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    self.assertEqual(actual.shape, expected.shape, msg)
    np.testing.assert_allclose(
        actual.astype(np.float64) if actual.dtype.kind == "V" else actual,
        expected, rtol=rtol, atol=atol,
        err_msg=f"{msg} (seed {self.seed})")

  def assertDotClose(self, actual, expected, *, cpu_rtol=1e-4, cpu_atol=1e-3,
                     gpu_error=1e-2):
    """Compares a result of dot products with ``expected`` (say, NumPy's).

    On the CPU element by element; on GPUs, which compute a float32
    ``tl.dot`` in TF32 (10-bit mantissa), by the relative Frobenius error.
    """
    if platform() != "gpu":
      self.assertAllClose(actual, expected, rtol=cpu_rtol, atol=cpu_atol)
      return
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    self.assertEqual(actual.shape, expected.shape)
    error = np.linalg.norm(actual - expected) / np.linalg.norm(expected)
    self.assertLess(error, gpu_error, f"(seed {self.seed})")
