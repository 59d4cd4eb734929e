"""The static description of one kernel call: its operands, launches, options.

``binding.bind_call`` builds a ``CallSpec``; the lowerings, the batching
rule and the eager cache read it. Everything here is frozen and hashable.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jt_dist._core import pytree_args as _pytree_args
from jt_dist._core import kernel as _kernel


@dataclasses.dataclass(frozen=True)
class Operand:
  """What binds one runtime (non-constexpr) kernel parameter."""

  name: str
  kind: str  # "array", "scalar" or "output".
  index: int  # Array index among array arguments, or output index.
  value: Any  # The scalar's value; None for pointers.
  type: str  # Triton's type name, e.g. "*fp32" or "i32".
  path: tuple[int, ...] = ()  # Where in a tuple parameter, e.g. (1, 0).

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
  # On the CPU, an eager call's scalars may arrive as a runtime operand
  # after the arrays (jt_dist._cpu.scalars) rather than in ``operands``.
  runtime_scalars: bool = False
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


@dataclasses.dataclass(frozen=True)
class CallOptions:
  """The keyword options of ``triton_call`` besides kernel, outputs, grid."""

  name: str = ""
  custom_call_target_name: str | None = None
  num_warps: int | None = None
  num_stages: int | None = None
  num_ctas: int = 1
  compute_capability: int | None = None
  enable_fp_fusion: bool = True
  input_output_aliases: Mapping[int, int] | None = None
  zeroed_outputs: Sequence[int] | Callable[..., Sequence[int]] = ()
  debug: bool = False
  serialized_metadata: bytes = b""
  vmap_method: str | None = None
  sharding_rule: Any = None
  has_side_effect: bool = False
  cost_estimate: Any = None
  # The array indices of the call's ``jax.Ref`` arguments (their values are
  # passed in their place); each gets an output aliased to it.
  ref_inputs: tuple[int, ...] = ()
  # Further Triton compiler options (``_backend_options.merge``'s extra).
  backend_options: Mapping[str, Any] | None = None
  # (position in args, _tensordesc.Info) of each host-side TMA descriptor,
  # whose array stands in args in its place.
  tensor_descriptors: tuple = ()
