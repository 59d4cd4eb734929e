"""Eager CPU launches without an XLA executable.

An eager call on CPU arrays is one host callback and nothing else, so
lowering it with JAX and compiling it with XLA (about 15 ms on a 2-core
host, per new signature) buys nothing: the kernel runs through the same
interpreter on the same host memory either way. An eager entry on the CPU
(``jt_dist._call.entries``) therefore launches directly: it reads the
operands' host buffers, runs the launch the host callback would run
(``jt_dist._cpu.lowering``), and puts the outputs where ``jax.jit`` would
have put them.

What differs from the callback route, on purpose: the launch is synchronous
(it returns when the kernel has finished, so an error is raised by the call
itself), and reading the operands waits for them. Whatever this route
cannot reproduce exactly takes the jitted callable instead: operands on
several devices or sharded, a non-``jax.Array`` operand, an autotuned spec
with several configs left to choose among.

A repeated call is a little dearer this way than through the executable
(wrapping each output as a ``jax.Array`` costs tens of microseconds after a
launch, where XLA hands the kernel its own buffers), so an entry called
``PROMOTE_AFTER`` times compiles its executable and uses it from then on:
a loop pays one compilation, a few calls pay none.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from jt_dist._cpu import lowering as _lowering
from jt_dist._cpu import unsupported as _unsupported

# Direct launches an entry makes before it compiles its executable: past
# this, the executable's cheaper repeated calls repay its compilation.
PROMOTE_AFTER = 256
# Switched off by tests that need the XLA route for eager calls too (the
# host callback's own behaviour). Not a user setting: results are the same.
_enabled = [True]


def use_direct(on: bool) -> bool:
  """Turns direct eager CPU launches on or off; returns the previous state."""
  previous = _enabled[0]
  _enabled[0] = bool(on)
  return previous


def eligible(spec) -> bool:
  """Whether an eager call of ``spec`` on CPU arrays can launch directly.

  Raises:
    NotImplementedError, ValueError: what the CPU lowering would refuse
      (``jt_dist._cpu.unsupported.check``), raised here as it would have
      been when the call was first compiled.
  """
  if not _enabled[0] or len(spec.launches) != 1:
    return False
  _unsupported.check(spec)
  return True


def default_device_is_cpu() -> bool:
  """Whether ``jax.jit`` runs a call with no committed operand on a CPU.

  That is ``jax.default_device`` where one is set, else the default
  backend's first device.
  """
  default = jax.config.jax_default_device
  if default is None:
    return jax.default_backend() == "cpu"
  if isinstance(default, str):
    return default == "cpu"
  return default.platform == "cpu"


def _placement(operands, avals):
  """Where the outputs go, ``(device, committed)``; None: the jitted route.

  ``device`` is the one CPU device the ``jax.Array`` operands share (None
  if there are none), and ``committed`` whether any of them is committed.
  A NumPy operand is taken as ``jax.jit`` would take it only where it
  needs no conversion: the shape and dtype the call was bound for. With
  nothing committed, jit runs the call on the default device, which must
  then be a CPU.
  """
  device, committed = None, False
  for a, (shape, dtype) in zip(operands, avals):
    if type(a) is np.ndarray:  # pylint: disable=unidiomatic-typecheck
      if a.shape != shape or a.dtype != dtype:
        return None
      continue
    if not isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer):
      return None
    devices = a.sharding.device_set
    if len(devices) != 1:
      return None
    (here,) = devices
    if here.platform != "cpu" or (device is not None and here != device):
      return None
    device = here
    committed = committed or a.committed
  if not committed and not default_device_is_cpu():
    return None
  return device, committed


class DirectLaunch:
  """Runs one eager spec on the host; a drop-in for its jitted callable.

  Called with the spec's operands (and, for a spec with runtime scalars,
  their packed words last), as the jitted callable is; returns the outputs
  as a tuple of ``jax.Array``.
  """

  def __init__(self, spec, arrays, fallback: Callable[..., Any]):
    """The direct launch of ``spec``, with its jitted callable to fall back on.

    Args:
      spec: the call's ``CallSpec``, as the jitted callable runs it.
      arrays: the array operands it was bound for (their shapes and
        dtypes).
      fallback: the jitted callable, for calls this route cannot take.
    """
    self.spec = spec
    self.fallback = fallback
    # The packed scalars, a NumPy operand of the entry's own making, come
    # after these and are not checked.
    self._avals = tuple((tuple(a.shape), np.dtype(a.dtype)) for a in arrays)
    # Counted without a lock: a few calls more or less before promotion
    # change nothing.
    self.launches = 0

  def __call__(self, *operands):
    if self.launches >= PROMOTE_AFTER:
      return self.fallback(*operands)
    placed = _placement(operands, self._avals)
    if placed is None:
      return self.fallback(*operands)
    self.launches += 1
    device, committed = placed
    if _guarded():
      # Reading a CPU array's buffer is no transfer a guard should stop:
      # the jitted route reads the same memory.
      with jax.transfer_guard("allow"):
        return self._launch(operands, device if committed else None)
    return self._launch(operands, device if committed else None)

  def _launch(self, operands, device):
    # Copies: a kernel that stores through an input pointer (a bug the GPU
    # would not catch either) must not change the caller's array.
    inputs = [np.array(a, order="C") for a in operands]
    outputs = [np.empty(shape, dtype) for shape, dtype in self.spec.out_shapes]
    _lowering.launch_on_host(self.spec, inputs, outputs)
    # Where jax.jit puts them: on the operands' device, committed if an
    # operand was (``device``), else on the default device, uncommitted.
    # One call for all of them: jax places a list in one batch.
    return tuple(jax.device_put(outputs, device))


def _guarded() -> bool:
  """Whether a transfer guard other than "allow" is in force."""
  config = jax.config
  return any(level not in (None, "allow") for level in (
      config.jax_transfer_guard_device_to_host,
      config.jax_transfer_guard_host_to_device))
