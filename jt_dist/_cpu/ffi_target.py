"""jt_dist's own CPU custom-call target: an XLA FFI handler made with ctypes.

JAX's buffer callback cannot carry ``cost_estimate_json``; a call with a
``cost_estimate`` lowers to this target, running the same host function.
It registers from the lowering rule, once the CPU backend exists, so a
failure is caught and the call keeps the buffer callback (a bad registration
replayed at client creation would break the backend).
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import math
import threading
import traceback
import weakref

import jax
import numpy as np

from jt_dist._compat import xla_ffi as _ffi
from jt_dist._core import host_faults as _host_faults

logger = logging.getLogger("jt_dist")

TARGET = "jt_dist_cpu_interpret"
_LOCK = threading.Lock()
# XLA keeps the trampoline's address for life: never freed nor replaced.
_HANDLER = None
_REGISTERED: bool | None = None  # None: not tried yet.
# Custom call's index attribute -> its call, alive while an executable is.
_CALLS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_NEXT_INDEX = itertools.count(1)


def ensure_registered() -> bool:
  """Registers the target once per process; returns whether it is usable."""
  global _HANDLER, _REGISTERED
  with _LOCK:
    if _REGISTERED is None:
      handler = _HANDLER or _ffi.HANDLER(_handle)
      try:
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(handler),
                                    platform="cpu", api_version=1)
        _REGISTERED = True
      except Exception as e:  # pylint: disable=broad-except
        logger.debug("jt_dist: CPU FFI target %s not registered (%s: %s);"
                     " CPU calls keep JAX's buffer callback.", TARGET,
                     type(e).__name__, e)
        _REGISTERED = False
      _HANDLER = handler
    return _REGISTERED


def add_call(fn, in_avals, out_avals, module_context) -> int:
  """Records ``fn(inputs, outputs)`` for one custom call; returns its index
  attribute. A host callback of the module lives with the executable (a
  keepalive did not)."""
  ins, outs = ([(tuple(a.shape), np.dtype(a.dtype)) for a in avals]
               for avals in (in_avals, out_avals))

  def call(args, rets):
    fn(_views(args, ins, "operand"), _views(rets, outs, "result"))

  module_context.add_host_callback(call)
  with _LOCK:
    index = next(_NEXT_INDEX)
    _CALLS[index] = call
  return index


def _handle(frame_pointer):
  """``XLA_FFI_Error* handler(XLA_FFI_CallFrame*)``; never raises."""
  try:
    frame = frame_pointer.contents
    if _ffi.answer_metadata(frame):
      return None
    if not _ffi.frame_is_readable(frame):
      # api precedes every field a frame of any FFI version has.
      return _ffi.make_error(
          frame.api,
          f"jt_dist: XLA FFI call frame of {frame.struct_size} bytes or API"
          " version not understood (jt_dist reads FFI API major version 0,"
          f" call frames of at least {_ffi.MIN_CALL_FRAME_SIZE} bytes);"
          " update jt_dist or remove cost_estimate= from the CPU call.",
          _ffi.ERRC_INVALID_ARGUMENT)
    if frame.stage != _ffi.STAGE_EXECUTE:
      return None
  except BaseException:  # pylint: disable=broad-except
    return None  # Nothing readable to report through.
  try:
    index = _index_attribute(frame.attrs)
    if (call := _CALLS.get(index)) is None:
      raise RuntimeError(
          f"jt_dist: no CPU kernel for custom call index {index}: the"
          " executable was not lowered in this process (a deserialized CPU"
          " executable cannot run a triton_call); lower it again.")
    call(frame.args, frame.rets)
    return None
  except BaseException as e:  # pylint: disable=broad-except
    # An exception leaving a ctypes callback would read as success to XLA.
    # A kernel's fault is its own first line: type, kernel, fault, token.
    text = (str(e) if isinstance(e, _host_faults.HostFault) else "".join(
        traceback.format_exception_only(type(e), e)).strip())
    return _ffi.make_error(frame.api, text)


def _index_attribute(attrs) -> int:
  for i in range(attrs.size):
    name = attrs.names[i].contents
    if ctypes.string_at(name.ptr, name.len) != b"index":
      continue
    scalar = _ffi.Scalar.from_address(attrs.attrs[i])
    if attrs.types[i] != _ffi.ATTR_SCALAR or scalar.dtype != _ffi.DTYPE_U64:
      break
    return ctypes.c_uint64.from_address(scalar.value).value
  raise RuntimeError("jt_dist: CPU custom call without a uint64 'index'.")


def _views(operands, avals, what):
  """NumPy views (no copy) of XLA's buffers, typed from the lowering."""
  if operands.size != len(avals):
    raise RuntimeError(f"jt_dist: CPU custom call got {operands.size}"
                       f" {what}s, lowered with {len(avals)}.")
  views = []
  for k, (shape, dtype) in enumerate(avals):
    if operands.types[k] != _ffi.TYPE_BUFFER:
      raise RuntimeError(f"jt_dist: CPU custom call {what} {k} is not a"
                         " buffer.")
    buffer = _ffi.Buffer.from_address(operands.items[k])
    dims = tuple(buffer.dims[i] for i in range(buffer.rank))
    if dims != shape:
      raise RuntimeError(f"jt_dist: CPU custom call {what} {k} has shape"
                         f" {dims}, lowered as {shape}.")
    nbytes = math.prod(shape) * dtype.itemsize
    # An empty buffer's data pointer may be null.
    raw = (ctypes.c_char * nbytes).from_address(buffer.data) if nbytes else (
        bytearray())
    views.append(np.frombuffer(raw, dtype=dtype).reshape(shape))
  return views
