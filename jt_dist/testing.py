"""Helpers for absltest suites of Triton kernels, on GPUs or the CPU.

Suites written with these helpers run unchanged on real GPUs and, through
Triton's interpreter, on virtual CPU devices: call
``configure_cpu_devices()`` before JAX starts, derive test classes from
``TestCase``, and ask for devices with ``require_devices``.
"""

from __future__ import annotations

import os
from typing import Any

from absl.testing import parameterized
import jax
import numpy as np

__all__ = ["TestCase", "configure_cpu_devices", "platform"]

_DEFAULT_CPU_DEVICES = 8


def configure_cpu_devices(count: int = _DEFAULT_CPU_DEVICES) -> None:
  """Asks JAX for ``count`` virtual CPU devices.

  Must run before JAX initialises its backends (before the first array is
  made); afterwards it has no effect. Set ``JT_DIST_CPU_DEVICES`` to override
  the count.

  Args:
    count: the number of CPU devices to create.
  """
  count = int(os.environ.get("JT_DIST_CPU_DEVICES", count))
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError:
    pass  # Backends already initialised: keep what they have.


def platform() -> str:
  """The platform tests run on: "gpu" when JAX sees GPUs, else "cpu"."""
  return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


class TestCase(parameterized.TestCase):
  """An absltest case with fresh random inputs and device requirements."""

  def setUp(self):
    super().setUp()
    # A new seed per test: kernels must be right on any input, and a fixed
    # seed would let a lucky input pass forever.
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
    values = self.np_rng.uniform(low, high, size=shape)
    return values.astype(dtype)

  def devices(self, count: int | None = None) -> list[Any]:
    """The local devices of the test platform, or skips if too few."""
    devices = jax.devices()
    if count is not None and len(devices) < count:
      kind = "GPUs" if platform() == "gpu" else f"{devices[0].platform} devices"
      self.skipTest(f"needs >={count} {kind}, found {len(devices)}")
    return devices if count is None else devices[:count]

  def assertAllClose(self, actual, expected, *, rtol=1e-5, atol=1e-5,
                     msg: str = ""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    self.assertEqual(actual.shape, expected.shape, msg)
    np.testing.assert_allclose(
        actual.astype(np.float64) if actual.dtype.kind == "V" else actual,
        expected, rtol=rtol, atol=atol,
        err_msg=f"{msg} (seed {self.seed})")
