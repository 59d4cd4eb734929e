"""Exception types raised by jt_dist.

Every error subclasses a builtin (``ValueError``, ``TypeError`` or
``NotImplementedError``) so that callers who catch the builtin keep working.
"""

from __future__ import annotations

import jax

__all__ = [
    "AutotuneError",
    "DevicePlacementError",
    "KernelBindingError",
    "ShardingSpecError",
]


class KernelBindingError(TypeError):
  """The arguments of a call do not bind the kernel's parameters.

  Raised when positional arguments, outputs and metaparams do not bind every
  kernel parameter exactly once, or a metaparam names no kernel parameter.
  """


class DevicePlacementError(ValueError):
  """The array arguments of a call do not live where the kernel can run.

  A Triton kernel sees raw pointers into one device's memory. Inputs that are
  sharded or replicated over several devices, or that sit on different
  devices, have to go through ``jt_dist.sharded_triton_call`` or
  ``jax.shard_map`` instead.
  """


class ShardingSpecError(ValueError):
  """The partition specs or mesh given to ``sharded_triton_call`` are invalid."""


class AutotuneError(RuntimeError):
  """jt_dist could not choose one autotuning config for every shard.

  Raised when no config of an autotuned kernel runs, or when a process of a
  multi-process run waits in vain for process 0's choice.
  """


def process_note() -> str:
  """Which process speaks, for messages only one process may see.

  Returns:
    ``" (in process 1 of 2)"`` in a multi-process run, else ``""``.
  """
  if jax.process_count() == 1:
    return ""
  return f" (in process {jax.process_index()} of {jax.process_count()})"
