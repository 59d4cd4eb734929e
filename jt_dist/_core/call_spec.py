"""The static description of one kernel call: its operands, launches, options.

``binding.bind_call`` builds a ``CallSpec``; the lowerings, the batching
rule and the eager cache read it. Everything here is frozen and hashable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import exact as _exact
from jt_dist._core import kernel as _kernel


@dataclasses.dataclass(frozen=True)
class Operand:
  """What binds one runtime (non-constexpr) kernel parameter."""

  name: str
  kind: str  # "array", "scalar" or "output".
  index: int  # Array index among array arguments, or output index.
  value: Any = dataclasses.field(compare=False)  # A scalar's; None else.
  type: str  # Triton's type name, e.g. "*fp32" or "i32".
  path: tuple[int, ...] = ()  # Where in a tuple parameter, e.g. (1, 0).
  # ``value`` as Triton tells values apart: 0.0 and -0.0 are two scalars.
  value_key: Any = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "value_key", _exact.key(self.value))

  @property
  def label(self) -> str:
    """The name for messages: ``yz[1]`` for a leaf of tuple parameter yz."""
    return _pytree_args.label(self.name, self.path)


@dataclasses.dataclass(frozen=True)
class Launch:
  """One config's launch: its constexprs, options, grid and zeroed outputs."""

  config: _kernel.Config
  grid: tuple[int, int, int]
  zeroed_outputs: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CallSpec:
  """Everything a lowering needs to launch the kernel; hashable and static."""

  kernel: Any
  name: str
  operands: tuple[Operand, ...]
  out_shapes: tuple[tuple[tuple[int, ...], np.dtype], ...]
  launches: tuple[Launch, ...]
  input_output_aliases: tuple[tuple[int, int], ...]
  compute_capability: int | None
  enable_fp_fusion: bool
  debug: bool
  serialized_metadata: bytes
  custom_call_target_name: str | None
  vmap_method: str | None
  # A _batching.Batched when this is the batched form of a user's call.
  batch: Any = None
  # The call's ShardingRule: the lowering refuses it over several devices
  # with a message about partitioning rather than misplacement.
  sharding_rule: Any = None
  # The call must run even when its outputs are unused (has_side_effect=).
  has_side_effect: bool = False
  # ``cost_estimate=`` as sorted (key, int) pairs; () when not given.
  cost_estimate: tuple[tuple[str, int], ...] = ()
  # How many trailing outputs are the new values of ``jax.Ref`` arguments:
  # each aliases its input and binds no kernel parameter of its own.
  ref_outputs: int = 0
  # Triton compiler options besides the named ones: sorted (name, value).
  backend_options: tuple[tuple[str, Any], ...] = ()

  @property
  def info(self) -> _kernel.KernelInfo:
    return _kernel.kernel_info(self.kernel)

  def __repr__(self) -> str:
    grids = sorted({launch.grid for launch in self.launches})
    batch = f", batch={self.batch.layout.sizes}" if self.batch else ""
    return (
        f"CallSpec(kernel={self.info.name}, name={self.name!r},"
        f" configs={len(self.launches)}, grids={grids}{batch})"
    )
