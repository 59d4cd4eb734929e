"""Every Triton- and jaxlib-version difference jt_dist depends on.

Triton's Python API is not stable between releases, and breakage with new
Triton releases is what hurts users of Triton bindings most. All code that
touches a version-dependent Triton or jaxlib detail goes through this module,
so that supporting a new release means editing one file. Nothing here runs at
import time beyond reading version numbers and importing classes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any, NamedTuple

import jax
import triton
from triton.runtime import autotuner as _autotuner
from triton.runtime import interpreter as _interpreter
from triton.runtime import jit as _jit


def _version_tuple(text: str) -> tuple[int, ...]:
  parts = []
  for piece in text.split("+")[0].split(".")[:3]:
    digits = "".join(ch for ch in piece if ch.isdigit())
    parts.append(int(digits) if digits else 0)
  return tuple(parts)


TRITON_VERSION: tuple[int, ...] = _version_tuple(triton.__version__)
JAX_VERSION: tuple[int, ...] = _version_tuple(jax.__version__)
MIN_TRITON_VERSION = (3, 6)

JITFunction = _jit.JITFunction
Autotuner = _autotuner.Autotuner
Heuristics = _autotuner.Heuristics
Config = triton.Config
InterpretedFunction = _interpreter.InterpretedFunction
InterpreterError = triton.runtime.errors.InterpreterError


def jit_function_of(fn: Any) -> JITFunction:
  """Returns a ``JITFunction`` for a ``JITFunction`` or ``InterpretedFunction``.

  Kernels defined under ``TRITON_INTERPRET=1`` are ``InterpretedFunction``s;
  the GPU compiler needs a ``JITFunction`` of the same Python function. The
  result is memoized so that Triton's own per-function caches stay warm.
  """
  if isinstance(fn, JITFunction):
    return fn
  return _jit_function_for_python_fn(fn.fn)


@functools.lru_cache(maxsize=None)
def _jit_function_for_python_fn(python_fn) -> JITFunction:
  return JITFunction(python_fn)


def python_function_of(fn: Any):
  """The plain Python function behind a JIT or interpreted Triton function."""
  return fn.fn


# --- The interpreter -------------------------------------------------------


class _HostBufferExecutor(_interpreter.GridExecutor):
  """Triton's grid executor, fed host buffers instead of torch tensors.

  Upstream copies torch device tensors to the host before the launch and back
  after it. jt_dist hands the interpreter NumPy buffers that already live on
  the host, so both copies are identities.
  """

  def _init_args_hst(self, args_dev, kwargs):
    return list(args_dev), dict(kwargs)

  def _restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
    del args_dev, args_hst, kwargs, kwargs_hst


def interpreted_python_fn(python_fn):
  """The interpreter's AST-rewritten version of a kernel's Python function."""
  return InterpretedFunction(python_fn).rewrite()


def run_interpreted(python_fn, grid: tuple[int, int, int], args, kwargs):
  """Runs ``python_fn`` over ``grid`` through Triton's interpreter.

  The caller must hold the interpreter lock: the interpreter patches
  ``triton.language`` globally for the duration of the launch.
  """
  fn = interpreted_python_fn(python_fn)
  arg_names = list(_jit.inspect.signature(python_fn).parameters)
  executor = _HostBufferExecutor(fn, arg_names, tuple(grid))
  with _helpers_run_interpreted():
    executor(*args, **kwargs)


@contextlib.contextmanager
def _helpers_run_interpreted():
  """Lets a kernel call ``@triton.jit`` helpers while it is interpreted.

  Outside ``TRITON_INTERPRET=1`` the helpers are ``JITFunction``s, whose
  ``__call__`` refuses to run outside a compiled kernel. For the duration of
  one interpreted launch (the caller holds the interpreter lock) the call is
  routed to the helper's interpreted form; ``triton.language`` is already
  patched by the enclosing launch, so the helper needs no patching of its own.
  """
  original = JITFunction.__call__

  def call_interpreted(self, *args, **kwargs):
    return interpreted_python_fn(self.fn)(*args, **kwargs)

  JITFunction.__call__ = call_interpreted
  try:
    yield
  finally:
    JITFunction.__call__ = original


# --- jaxlib's Triton custom call -------------------------------------------


@functools.lru_cache(maxsize=None)
def gpu_triton_module():
  """jaxlib's Triton custom-call bindings, or None without a GPU plugin."""
  try:
    module = importlib.import_module("jax._src.lib.gpu_triton")
  except ImportError:
    return None
  if not hasattr(module, "TritonKernel"):
    return None
  return module


# --- Abstract values -------------------------------------------------------


def output_avals(in_avals, out_shapes):
  """Abstract values of a kernel call's outputs.

  Outside ``shard_map`` outputs are plain shaped arrays. Inside, they must
  carry the mesh and the manual axes they vary over, or ``shard_map``'s
  ``check_vma`` rejects them; how an aval records that differs between JAX
  releases, so outputs are derived from an input aval with ``update``, which
  keeps whatever the running release records.
  """
  template = None
  for aval in in_avals:
    mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    if mesh is not None and not mesh.empty:
      template = aval
      break
  if template is None:
    return [jax.core.ShapedArray(shape, dtype) for shape, dtype in out_shapes]
  sharding = jax.sharding.NamedSharding(
      template.sharding.mesh, jax.sharding.PartitionSpec()
  )
  return [
      template.update(shape=shape, dtype=dtype, weak_type=False,
                      sharding=sharding)
      for shape, dtype in out_shapes
  ]


def interpreter_float(value: float, triton_type: str):
  """A float scalar typed as the compiled kernel would type it.

  The interpreter treats a bare Python float as a weakly typed constant, so
  ``x_fp16 * alpha`` would stay fp16; a compiled kernel receives an fp32 (or
  fp64) parameter and promotes. Passing a typed tensor keeps the two alike.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import triton.language as tl  # pylint: disable=g-import-not-at-top

  np_dtype, tl_dtype = {
      "fp32": (np.float32, tl.float32),
      "fp64": (np.float64, tl.float64),
  }[triton_type]
  handle = _interpreter.TensorHandle(np.array([value], dtype=np_dtype), tl_dtype)
  return tl.tensor(handle, tl_dtype)


# --- Lowering-context facts ------------------------------------------------


class AxisFacts(NamedTuple):
  """What the lowering context says about the devices a call runs on.

  kind is "sharding" (plain jit over num_devices), "spmd" (inside
  shard_map), "replica" (pmap) or "none" (no partitioning information).
  """

  kind: str
  num_devices: int
  devices: tuple
  manual_axes: frozenset
  auto_axis_sizes: dict
  mesh: Any = None


def lowering_axis_facts(ctx) -> AxisFacts:
  """Reads the lowering context's axis context without naming its classes.

  The classes live in a private JAX module and their names have changed
  between releases, so only their documented attributes are read.
  """
  axis_ctx = ctx.module_context.axis_context
  if hasattr(axis_ctx, "manual_axes") and hasattr(axis_ctx, "mesh"):
    mesh = axis_ctx.mesh
    manual = frozenset(axis_ctx.manual_axes)
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
    auto = {
        name: size for name, size in mesh.shape.items()
        if name not in manual and _is_auto(types.get(name))
    }
    try:
      devices = tuple(mesh.devices.flat)
    except (AttributeError, ValueError):  # An AbstractMesh has no devices.
      devices = ()
    return AxisFacts("spmd", mesh.size, devices, manual, auto, mesh)
  if hasattr(axis_ctx, "num_devices"):
    devices = tuple(getattr(axis_ctx, "device_assignment", None) or ())
    return AxisFacts("sharding", axis_ctx.num_devices, devices, frozenset(), {})
  if hasattr(axis_ctx, "axis_env"):
    return AxisFacts("replica", 1, (), frozenset(), {})
  return AxisFacts("none", 1, (), frozenset(), {})


def _is_auto(axis_type) -> bool:
  # Meshes made before axis types existed behave as Auto.
  return axis_type is None or getattr(axis_type, "name", "") == "Auto"
