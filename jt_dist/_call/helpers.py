"""jax-triton's small public helpers (``cdiv``, ``next_power_of_2``,
``strides_from_shape``, ``get_compute_capability``), so that programs that
``import jt_dist as jt`` in place of ``jax_triton`` keep working."""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import jax

from jt_dist._backend import target as _target


def _check_int(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"{name}={value!r} of type {type(value).__name__} must be"
                    f" an int, e.g. {max(minimum, 1)}.")
  if value < minimum:
    raise ValueError(f"{name}={value!r} must be at least {minimum}.")
  return int(value)


def cdiv(x: int, y: int) -> int:
  """Integer division rounded up, for grid sizes.

  Args:
    x: the size to cover, a non-negative int.
    y: the block size, a positive int.

  Returns:
    ``ceil(x / y)``, e.g. ``cdiv(1000, 128) == 8``.

  Raises:
    TypeError: an argument is not an int.
    ValueError: ``x`` is negative or ``y`` is not positive.
  """
  x = _check_int("cdiv: x", x, 0)
  y = _check_int("cdiv: y", y, 1)
  return -(-x // y)


def next_power_of_2(x: int) -> int:
  """The smallest power of two at least ``x`` (1 for 0), for block sizes.

  Args:
    x: a non-negative int.

  Returns:
    e.g. ``next_power_of_2(100) == 128``, ``next_power_of_2(128) == 128``.

  Raises:
    TypeError: ``x`` is not an int.
    ValueError: ``x`` is negative.
  """
  x = _check_int("next_power_of_2: x", x, 0)
  return 1 if x <= 1 else 1 << (x - 1).bit_length()


def strides_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
  """The row-major strides, in elements, of an array of ``shape``.

  Args:
    shape: the array's dimensions, non-negative ints.

  Returns:
    One stride per dimension, e.g. ``strides_from_shape((4, 3, 2))`` is
    ``(6, 2, 1)``; ``()`` for a scalar.

  Raises:
    TypeError: ``shape`` is not a sequence of ints.
    ValueError: a dimension is negative.
  """
  if not isinstance(shape, Sequence) or isinstance(shape, str):
    raise TypeError(f"strides_from_shape: shape={shape!r} of type"
                    f" {type(shape).__name__} must be a tuple of ints, e.g."
                    " x.shape.")
  dims = [_check_int(f"strides_from_shape: shape[{i}]", d, 0)
          for i, d in enumerate(shape)]
  return tuple(math.prod(dims[k + 1:]) for k in range(len(dims)))


def get_compute_capability(device: int | jax.Device = 0) -> int:
  """A local CUDA GPU's compute capability as an int, e.g. 90 for sm_90.

  Args:
    device: an index into ``jax.local_devices()``, or a ``jax.Device``.

  Returns:
    The compute capability, major times 10 plus minor.

  Raises:
    TypeError: ``device`` is neither an int nor a ``jax.Device``.
    ValueError: the index is out of range, or the device is not a CUDA GPU
      (on the CPU, Triton's interpreter has no compute capability; on ROCm,
      the GPU is named by its gfx arch instead).
  """
  if isinstance(device, jax.Device):
    found = device
  else:
    devices = jax.local_devices()
    index = _check_int("get_compute_capability: device", device, 0)
    if index >= len(devices):
      raise ValueError(
          f"get_compute_capability: device={index} is out of range: this"
          f" process has {len(devices)} local device(s) {devices}. Pass an"
          " index below that, or a jax.Device.")
    found = devices[index]
  capability = _target.cuda_capability(found)
  if capability is None or found.platform not in ("gpu", "cuda"):
    raise ValueError(
        f"get_compute_capability: {found} (platform {found.platform!r}) is"
        " not a CUDA GPU, so it has no compute capability. On a host without"
        " GPUs, pass compute_capability= to triton_call (e.g. 90) to lower"
        " for a GPU; on ROCm, the GPU is named by its arch, e.g. 'gfx942'.")
  return capability
