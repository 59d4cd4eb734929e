"""The CPU lowering: kernels run through Triton's interpreter.

A buffer callback hands the kernel XLA's own buffers (``jax.pure_callback``
copied operands on XLA's thread pool, which deadlocked beside collectives
on jaxlib 0.10). Outputs start as on a GPU, so results and mistakes match.
What the interpreter cannot run is refused before any callback exists.
"""

from __future__ import annotations

import functools
import json
import logging
import traceback
import warnings

import jax
from jax.interpreters import mlir
from jax.experimental import io_callback
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist import _settings
from jt_dist._autotune import choose as _choose
from jt_dist._core import arguments as _arguments
from jt_dist._core import primitive as _primitive
from jt_dist._core import types as _types
from jt_dist._cpu import interpreter as _interpreter
from jt_dist._cpu import bounds as _bounds
from jt_dist._cpu import ffi_target as _ffi_target
from jt_dist._cpu import frontend as _frontend
from jt_dist._cpu import float_env as _float_env
from jt_dist._core import host_faults as _host_faults
from jt_dist._cpu import interrupts as _interrupts
from jt_dist._cpu import runtime as _interpreter_runtime
from jt_dist._sharding import placement as _placement

logger = logging.getLogger("jt_dist")

# Launches patch triton.language: none may overlap another or a GPU compile.
_INTERPRETER_LOCK = _compat.LANGUAGE_LOCK
_logged_kernels: set[str] = set()
_warned_unwritten: set[str] = set()

# Unwritten outputs come back NaN (or -1), not zeros, which hide the bug.
_POISON_BYTE = 0xFF


class _HostPointer:
  """A pointer argument: an address (tagged when checked) and a type."""

  __slots__ = ("buffer", "dtype", "address")

  def __init__(self, buffer: np.ndarray, triton_type: str, address=None):
    self.buffer = buffer
    self.dtype = triton_type.lstrip("*")
    self.address = buffer.ctypes.data if address is None else address

  def data_ptr(self) -> int:
    return self.address


def _first_time(seen: set[str], spec) -> str | None:
  """The kernel's qualified name, or None if it is in ``seen`` already."""
  fn = spec.info.python_fn
  key = f"{fn.__module__}.{fn.__qualname__}"
  with _INTERPRETER_LOCK:
    if key in seen:
      return None
    seen.add(key)
  return key


def _pointer_buffers(spec, launch, inputs, outputs):
  """Sets each output's starting bytes, in place, as jaxlib does on a GPU;
  returns the buffer behind each pointer operand, in operand order."""
  for out in outputs:
    # Through a flat view: a 0-d array cannot change its itemsize.
    out.reshape(-1).view(np.uint8)[...] = _POISON_BYTE
  for i, o in spec.input_output_aliases:
    np.copyto(outputs[o], inputs[i])
  for o in launch.zeroed_outputs:
    outputs[o][...] = 0
  aliased = dict(spec.input_output_aliases)
  defined = set(aliased.values()) | set(launch.zeroed_outputs)
  buffers = []
  for op in spec.operands:
    if op.kind == "array" and op.index in aliased:
      buffers.append(_bounds.Buffer(
          op.label, f"input {op.index}, aliased to output {aliased[op.index]}",
          outputs[aliased[op.index]]))
    elif op.kind == "array":
      buffers.append(_bounds.Buffer(op.label, f"input {op.index}",
                                    inputs[op.index]))
    elif op.kind == "output":
      out = outputs[op.index]
      written = None if op.index in defined else np.zeros(out.nbytes, bool)
      buffers.append(_bounds.Buffer(op.name, f"output {op.index}", out,
                                    written))
  return buffers


def _kernel_args(spec, buffers, checker):
  args, pointers = [], iter(enumerate(buffers))
  for op in spec.operands:
    if op.kind in ("array", "output"):
      k, buffer = next(pointers)
      address = None if checker is None else checker.tagged_address(k)
      if not op.type.startswith("tensordesc"):
        args.append(_HostPointer(buffer.array, op.type, address))
      else:
        # A host TMA descriptor: Triton's own, over the (tagged) buffer, so
        # the interpreter's descriptor accesses are checked like any other.
        args.append(_compat.interpreter_descriptor(_HostPointer(
            buffer.array, _types.pointer_type(op.value.dtype), address),
            op.value))
    else:
      args.append(_interpreter_runtime.interpreter_scalar(op.value, op.type))
  return args


def run_on_host(spec, *arrays):
  """The ``jax.pure_callback`` route: off the CPU, or for several platforms."""
  outputs = [np.empty(shape, dtype) for shape, dtype in spec.out_shapes]
  _launch(spec, [np.ascontiguousarray(a) for a in arrays], outputs)
  return tuple(outputs)


def _fill_buffers(spec, ctx, outputs, *inputs):
  """The buffer-callback route; inputs copied, as a store may hit them."""
  del ctx
  _launch(spec, [np.array(np.asarray(b), order="C") for b in inputs],
          [np.asarray(b) for b in outputs])


def _in_parameter_order(spec, args, kwargs):
  """Arguments by position up to the last operand (constexprs included),
  a tuple parameter's leaves nested again."""
  leaves = {}
  for op, arg in zip(spec.operands, args):
    leaves.setdefault(op.name, []).append((op.path, arg))
  by_name = {name: _arguments.nest(items) for name, items in leaves.items()}
  params = spec.info.params
  last = max((i for i, p in enumerate(params) if p.name in by_name),
             default=-1)
  ordered = [by_name[p.name] if p.name in by_name
             else kwargs.pop(p.name, p.default) for p in params[:last + 1]]
  return ordered, kwargs


def _launch(spec, inputs, outputs):
  """Runs the kernel; any fault (Ctrl-C too) is filed for the front door."""
  try:
    # From its arrival: a launch waiting behind an interrupted one belongs
    # to the same computation, and stops.
    with _interrupts.signal_kept(), _float_env.ieee_subnormals():
      _run_launch(spec, inputs, outputs)
  except BaseException as e:  # pylint: disable=broad-except
    raise _host_faults.file(e) from None


def _run_launch(spec, inputs, outputs):
  if (key := _first_time(_logged_kernels, spec)) is not None:
    logger.info(
        "jt_dist: kernel %s runs through Triton's interpreter on the CPU"
        " (%d program instances per launch); expect it to be slow.",
        key, int(np.prod(spec.launches[0].grid)))
  launch = spec.launches[0]
  buffers = _pointer_buffers(spec, launch, inputs, outputs)
  checker = (_bounds.MemoryChecker(spec.info.name, buffers)
             if _settings.bounds_check() else None)
  args, kwargs = _in_parameter_order(
      spec, _kernel_args(spec, buffers, checker), dict(launch.config.kwargs))
  with _INTERPRETER_LOCK:
    _interrupts.check()
    try:
      _interpreter_runtime.run(spec.info.python_fn, launch.grid, args,
                               kwargs, checker=checker, debug=spec.debug)
    except (_compat.InterpreterError, _errors.KernelAssertionError,
            _errors.KernelTypeError) as e:
      _name_the_kernel(e, spec)  # An InterpreterError's message only.
      _errors.raise_if_scalar_pointer(e, spec, [a.shape for a in inputs])
      raise
  if checker is not None:
    _check_all_written(spec, checker)


def _check_all_written(spec, checker) -> None:
  """Warns once per kernel of unwritten outputs (raises with ``debug``)."""
  if not (unwritten := checker.unwritten_outputs()):
    return
  message = " ".join(checker.unwritten_message(k, elements)
                     for k, elements in unwritten)
  if spec.debug:
    raise _errors.UnwrittenOutputReadError(message)
  if _first_time(_warned_unwritten, spec) is not None:
    warnings.warn(message + " Pass debug=True to raise instead; this warning"
                  " is shown once per kernel.", RuntimeWarning, stacklevel=2)


def _name_the_kernel(error, spec) -> None:
  """Prefixes Triton's bare message with the kernel, program id and line."""
  message = getattr(error, "error_message", None)
  if not isinstance(message, str):
    return
  cause = error.__cause__ or error
  where = _bounds.kernel_location(traceback.walk_tb(cause.__traceback__))
  pid = _interpreter.program_id()
  error.error_message = (
      f"kernel {spec.info.name!r}, program id {pid}"
      f"{', at ' + where if where else ''}: {message}")


def _host_call(*arrays, spec, platform):
  result_shapes = [jax.ShapeDtypeStruct(s, d) for s, d in spec.out_shapes]
  # A call with side effects is kept by XLA when its results are unused.
  if platform == "cpu":
    return _compat.host_buffer_callback()(
        functools.partial(_fill_buffers, spec), result_shapes,
        has_side_effect=spec.has_side_effect)(*arrays)
  callback = functools.partial(run_on_host, spec)
  if spec.has_side_effect:
    return io_callback(callback, result_shapes, *arrays, ordered=False)
  return jax.pure_callback(callback, result_shapes, *arrays)


def cpu_lowering(ctx, *args, spec):
  """The primitive's CPU lowering: a host callback into the interpreter."""
  platforms = tuple(getattr(ctx.module_context, "platforms", ()) or ())
  if _compat.lowering_for_export(ctx):
    raise NotImplementedError(
        f"triton_call: kernel {spec.info.name!r} cannot be exported with"
        f" jax.export for the CPU (platforms: {', '.join(platforms)}): on"
        " the CPU it runs through Triton's interpreter in a host callback"
        " into this process, which JAX cannot serialise. Export for the GPU"
        " instead:"
        " jax.export.export(fn, platforms=['cuda'],"
        " disabled_checks=jt_dist.export_safety_checks()) with"
        " compute_capability= (e.g. 90) on the call or in"
        " jt_dist.export_options; a kernel made under TRITON_INTERPRET=1"
        " is interpreted on GPUs too and cannot be exported either.")
  _check_supported(spec)
  _frontend.check(spec, [a.shape for a in ctx.avals_in])
  _interrupts.watch_interrupts()
  platform = platforms[0] if len(platforms) == 1 else None
  # jt_dist's own target where it registers: it carries cost_estimate_json,
  # and a fault under a caller's jax.jit reads as jt_dist's error first
  # (a buffer callback's error opens with its traceback).
  if platform == "cpu" and _ffi_target.ensure_registered():
    return _own_target_call(ctx, *args, spec=spec)
  return mlir.lower_fun(
      functools.partial(_host_call, spec=spec, platform=platform),
      multiple_results=True)(ctx, *args)


def _check_supported(spec) -> None:
  """Refuses Gluon, clusters and TF32 descriptors the interpreter lacks."""
  name = spec.info.name
  if _compat.is_gluon(spec.info.fn):
    raise NotImplementedError(
        f"triton_call: kernel {name!r} is a Gluon kernel"
        " (@triton.experimental.gluon.jit), and Triton's interpreter cannot"
        " run Gluon: its layouts and shared-memory operations exist only"
        " on GPUs. Run the call on a GPU (jax.jit(...).lower(...,"
        " lowering_platforms=('cuda',)) compiles it here without one), or"
        " write a @triton.jit version of the kernel for the CPU.")
  for op in spec.operands:
    if op.type.startswith("tensordesc"):
      _compat.check_tf32_descriptor(op.value, name)
  for launch in spec.launches:
    if launch.config.num_ctas > 1:
      raise ValueError(
          f"triton_call: kernel {name!r} asks for num_ctas="
          f"{launch.config.num_ctas} (config: {launch.config.label}), a"
          " cluster of thread blocks; clusters are not available on the CPU"
          " (Triton's interpreter runs one program at a time), only on CUDA"
          " GPUs from Hopper (sm_90). Pass num_ctas=1 on the CPU.")


def _own_target_call(ctx, *args, spec):
  """jt_dist's own FFI target, carrying any ``cost_estimate_json``."""
  index = _ffi_target.add_call(
      lambda inputs, outputs: _fill_buffers(spec, None, outputs, *inputs),
      ctx.avals_in, ctx.avals_out, ctx.module_context)
  rule = jax.ffi.ffi_lowering(_ffi_target.TARGET, api_version=4,
                              has_side_effect=spec.has_side_effect)
  estimate = ({"cost_estimate_json": json.dumps(dict(spec.cost_estimate))}
              if spec.cost_estimate else {})
  return rule(ctx, *args, index=np.uint64(index), **estimate)


mlir.register_lowering(
    _primitive.triton_call_p,
    _placement.checked(cpu_lowering, _choose.for_lowering, "cpu"),
    platform="cpu")
