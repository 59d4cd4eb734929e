"""The CPU platform: kernels run through Triton's interpreter.

The primitive's CPU lowering is a host callback. On the host the inputs
arrive as NumPy buffers; the kernel reads and writes them through raw
pointers exactly as it would device memory, one program instance at a time.
Aliased and zeroed outputs are prepared as jaxlib prepares them on a GPU, so
a kernel gives the same results (and the same mistakes) on both.
"""

from __future__ import annotations

import functools
import logging

import jax
from jax.interpreters import mlir
import numpy as np

from jt_dist import _compat
from jt_dist._cpu import runtime as _interpreter_runtime

logger = logging.getLogger("jt_dist")

# Triton's interpreter patches triton.language module-wide during a launch,
# so two launches must never overlap, whichever devices they belong to, nor
# overlap a GPU compile (which reads the module): one lock for both.
_INTERPRETER_LOCK = _compat.LANGUAGE_LOCK
_logged_kernels: set[str] = set()

# Outputs the kernel does not write come back as this byte pattern (NaN for
# floats, -1 for signed ints) rather than zeros, which would hide the bug.
_POISON_BYTE = 0xFF


class _HostPointer:
  """What the interpreter needs of a tensor: an address and an element type."""

  __slots__ = ("buffer", "dtype")

  def __init__(self, buffer: np.ndarray, triton_type: str):
    self.buffer = buffer
    self.dtype = triton_type.lstrip("*")

  def data_ptr(self) -> int:
    return self.buffer.ctypes.data


def _log_once(spec) -> None:
  fn = spec.info.python_fn
  key = f"{fn.__module__}.{fn.__qualname__}"
  with _INTERPRETER_LOCK:
    if key in _logged_kernels:
      return
    _logged_kernels.add(key)
  logger.info(
      "jt_dist: kernel %s runs through Triton's interpreter on the CPU"
      " (%d program instances per launch); expect it to be slow.",
      key, int(np.prod(spec.launches[0].grid)),
  )


def _prepare_outputs(spec, launch, inputs):
  outputs = []
  for shape, dtype in spec.out_shapes:
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = _POISON_BYTE
    outputs.append(out)
  for i, o in spec.input_output_aliases:
    np.copyto(outputs[o], inputs[i])
  for o in launch.zeroed_outputs:
    outputs[o][...] = 0
  return outputs


def _kernel_args(spec, inputs, outputs):
  aliased = {i: o for i, o in spec.input_output_aliases}
  args = []
  for op in spec.operands:
    if op.kind == "array":
      buffer = (outputs[aliased[op.index]] if op.index in aliased
                else inputs[op.index])
      args.append(_HostPointer(buffer, op.type))
    elif op.kind == "output":
      args.append(_HostPointer(outputs[op.index], op.type))
    elif op.type in ("fp32", "fp64", "i1"):
      args.append(_interpreter_runtime.interpreter_scalar(op.value, op.type))
    else:
      args.append(op.value)
  return args


def run_on_host(spec, *arrays):
  """Launches the kernel on host buffers; returns the output buffers.

  An autotuned call arrives with the one config ``jt_dist._autotune`` chose
  (on the CPU the first, unless ``JT_DIST_AUTOTUNE_CPU=time`` or a pin says
  otherwise); a spec with several runs its first.
  """
  _log_once(spec)
  launch = spec.launches[0]
  inputs = [np.ascontiguousarray(a) for a in arrays]
  outputs = _prepare_outputs(spec, launch, inputs)
  args = _kernel_args(spec, inputs, outputs)
  with _INTERPRETER_LOCK:
    _interpreter_runtime.run(
        spec.info.python_fn, launch.grid, args, dict(launch.config.kwargs)
    )
  return tuple(outputs)


def _host_call(*arrays, spec):
  result_shapes = [jax.ShapeDtypeStruct(s, d) for s, d in spec.out_shapes]
  return jax.pure_callback(
      functools.partial(run_on_host, spec), result_shapes, *arrays
  )


def cpu_lowering(ctx, *args, spec):
  """The primitive's CPU lowering: a host callback into the interpreter."""
  rule = mlir.lower_fun(
      functools.partial(_host_call, spec=spec), multiple_results=True
  )
  return rule(ctx, *args)
