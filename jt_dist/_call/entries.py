"""How a cached eager call runs: its ``Entry``, made once per signature.

An ``Entry`` holds the compiled ``jax.jit`` callable of a call just bound
and where its operands are among the arguments, so that a later call with
the same signature (``jt_dist._call.dispatch``) runs no binding at all.

Scalars: on the CPU, an entry passes its scalar arguments to the host
callback as a runtime operand (their 64-bit patterns), so a new value runs
the same XLA executable. On GPUs jaxlib's Triton call carries scalar
values in the custom call, so a new value needs a new executable: it reuses
the binding and the compiled Triton kernel (Triton specialises integers
only on divisibility by 16 and equality to 1), and pays only JAX's lowering
and XLA's compilation of the one custom call.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jt_dist._call import tensordesc as _tensordesc
from jt_dist._core import binding as _binding
from jt_dist._core import call_cache as _call_cache
from jt_dist._core import types as _types
from jt_dist._cpu import direct as _cpu_direct
from jt_dist._cpu import lowering as _cpu_lowering
from jt_dist._cpu import scalars as _cpu_scalars
from jt_dist._gpu import faults as _gpu_faults
from jt_dist._sharding import shard_size as _shard_size


@dataclasses.dataclass(eq=False)
class Entry:
  """How to run one signature: a compiled callable and its operands.

  Attributes:
    fn: the jitted callable for ``values``.
    spec: the call's ``CallSpec`` (for fault messages and new values).
    array_positions: where the array operands are among the arguments.
    scalar_positions: per scalar operand, its position among the arguments,
      or None for a value fixed by the signature (a ``shard_size``).
    values: the scalar operands' values ``fn`` was made for.
    runtime: whether ``fn`` takes the scalars as a runtime operand.
    put_positions / target: uncommitted arrays to move to ``device=``.
    out_tree: the structure of ``out_shape``.
    grid: a callable grid and what it returned, per launch, to check again.
    source: the kernel's Triton function and its source when bound.
    sync: whether to wait for the outputs (``JT_DIST_SYNC_LAUNCHES``).
  """

  fn: Callable[..., Any]
  spec: Any
  array_positions: tuple[int, ...]
  scalar_positions: tuple[int | None, ...]
  values: tuple
  runtime: bool
  put_positions: tuple[int, ...]
  target: Any
  out_tree: Any
  grid: Any
  grid_checks: tuple
  source: tuple
  sync: bool
  kernel: Any = None  # Held: the key has its id.
  layout: Any = None  # The scalars' struct, when ``runtime``.
  single: bool = False  # Whether out_shape is one leaf.
  # Set when there is nothing to do but pick the arrays and call ``fn``:
  # no scalars, no moves, no sync. Picks the arrays from the arguments.
  pick: Callable[[Sequence[Any]], tuple] | None = None
  # Set with ``pick`` when the operands are exactly the arguments, in order.
  direct: bool = False
  # Whether some arguments are TensorDescriptors, which stand for arrays.
  descriptors: bool = False

  def __post_init__(self):
    # Read on every hit (``_dispatch.cached``), unpacked once here.
    self.jit_fn, self.src = self.source
    # Whether ``matches`` must run: more than the source to check.
    self.checks = bool(self.grid_checks) or not hasattr(self.jit_fn, "src")

  def matches(self, grid: Any) -> bool:
    """Whether what the key cannot see is as it was when bound."""
    jit_fn, src = self.source
    if getattr(jit_fn, "src", None) is not src:
      return False
    if self.grid_checks and grid is not self.grid:
      for named, expected in self.grid_checks:
        try:
          if _evaluate(grid, named) != expected:
            return False
        except Exception:  # pylint: disable=broad-except
          return False
    return True

  def __call__(self, args: Sequence[Any]) -> Any:
    if self.pick is not None:  # The common case, with the least Python.
      try:
        outs = (self.fn(*args) if self.direct
                else self.fn(*self.pick(args)))
      except Exception as e:  # pylint: disable=broad-except
        self._raise(e)
      if self.single:
        return outs[0]
      return jax.tree_util.tree_unflatten(self.out_tree, outs)
    return self._run(args)

  def _run(self, args: Sequence[Any]) -> Any:
    """A call with scalars, moves, descriptors or a sync."""
    if self.descriptors:
      args = _tensordesc.bases(args)
    arrays = [args[i] for i in self.array_positions]
    for k in self.put_positions:
      arrays[k] = jax.device_put(arrays[k], self.target)
    fn = self.fn
    if self.scalar_positions:
      values = tuple(v if i is None else args[i] for i, v in
                     zip(self.scalar_positions, self.values))
      if self.runtime:
        arrays.append(np.frombuffer(self.layout.pack(*values), np.uint32))
      elif values != self.values:
        fn = _call_cache.executable(
            _binding.with_scalar_values(self.spec, values))
    try:
      outs = fn(*arrays)
      if self.sync:
        jax.block_until_ready(outs)
    except Exception as e:  # pylint: disable=broad-except
      self._raise(e)
    if self.single:
      return outs[0]  # One output, not in a container: no unflattening.
    return jax.tree_util.tree_unflatten(self.out_tree, outs)

  def _raise(self, e: Exception):
    """Raises a failed launch's error, in jt_dist's words where it can."""
    _cpu_lowering.raise_host_fault(e)
    if _gpu_faults.is_device_fault(e):
      raise _gpu_faults.launch_fault(e, self.spec) from e
    raise  # The handler calling this is still handling ``e``.


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple]:
  """A function of the arguments that returns those at ``positions``."""
  if len(positions) >= 2:
    return operator.itemgetter(*positions)  # Returns a tuple, in C.
  return lambda args: tuple(args[i] for i in positions)


def _evaluate(grid, named):
  return _as_tuple(grid(dict(named)))


def _on_cpu(arrays: Sequence[Any]) -> bool:
  """Whether the call runs on the CPU, judged from its placed operands.

  NumPy operands go where ``jax.jit`` puts them: with the other operands,
  or on the default device, which also runs a call with no array operand.
  """
  devices = set()
  for a in arrays:
    if isinstance(a, jax.Array):
      devices |= a.sharding.device_set
    elif type(a) is not np.ndarray:  # pylint: disable=unidiomatic-typecheck
      return False
  if not devices:
    # NumPy operands only, or none: the default device runs the call.
    return _cpu_direct.default_device_is_cpu()
  return all(d.platform == "cpu" for d in devices)


class GridRecorder:
  """A grid callable that remembers what it was given and what it returned.

  An entry evaluates the caller's grid again on each hit (an inline lambda
  is a new object each time, and may close over new values) and compares.
  """

  def __init__(self, grid):
    self.grid = grid
    self.seen = []
    # Error notes name the caller's function and line, not this wrapper.
    functools.update_wrapper(self, grid, updated=())
    if hasattr(grid, "__code__"):
      self.__code__ = grid.__code__

  def __call__(self, named):
    value = self.grid(named)
    self.seen.append((tuple(named.items()), _as_tuple(value)))
    return value


def _as_tuple(value):
  return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def make_entry(args, resolved_args, arrays, spec, out_tree, grid,
               device_target, device, descriptors=False) -> Entry:
  """The entry of an eager call just bound.

  Args:
    args: the positional arguments as bound (keyword operands merged in,
      descriptors replaced by their arrays).
    resolved_args: the same with every ``shard_size`` resolved.
    arrays: the placed array operands.
    spec: the bound ``CallSpec``.
    out_tree: the outputs' structure.
    grid: the grid as given, or its ``GridRecorder``.
    device_target: the device ``device=`` resolved to, or None.
    device: ``device=`` as given.
    descriptors: whether the call's arguments hold TensorDescriptors.
  """
  array_positions = tuple(i for i, a in enumerate(resolved_args)
                          if not _types.is_scalar(a))
  info = spec.info
  positions = [
      None if isinstance(args[i], _shard_size.ShardSize) else i
      for i, (a, param) in enumerate(zip(resolved_args, info.params))
      if _types.is_scalar(a) and not param.is_constexpr]
  values = tuple(op.value for op in spec.operands if op.kind == "scalar")
  on_cpu = _on_cpu(arrays)
  runtime = bool(values) and _cpu_scalars.supported(spec) and on_cpu
  run_spec = _cpu_scalars.runtime_spec(spec) if runtime else spec
  fn = _call_cache.executable(run_spec)
  if on_cpu and _cpu_direct.eligible(run_spec):
    fn = _cpu_direct.DirectLaunch(run_spec, arrays, fn)
  puts = () if device is None or device_target is None else tuple(
      k for k, i in enumerate(array_positions)
      if not (isinstance(args[i], jax.Array) and args[i].committed))
  recorder = grid if isinstance(grid, GridRecorder) else None
  sync = _gpu_faults.sync_launches()
  plain = not puts and not positions and not sync and not descriptors
  return Entry(
      fn=fn, spec=spec, array_positions=array_positions,
      scalar_positions=tuple(positions), values=values, runtime=runtime,
      put_positions=puts, target=device_target, out_tree=out_tree,
      grid=None if recorder is None else recorder.grid,
      grid_checks=() if recorder is None else tuple(recorder.seen),
      source=_call_cache.source_of(info), sync=sync,
      kernel=spec.kernel, pick=_picker(array_positions) if plain else None,
      direct=plain and array_positions == tuple(range(len(args))),
      descriptors=descriptors,
      layout=_cpu_scalars.layout(spec) if runtime else None,
      single=out_tree.num_leaves == 1 and out_tree.num_nodes == 1)
