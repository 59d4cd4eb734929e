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
import itertools
import os
import threading
from typing import Any, Callable, NamedTuple

import jax
import triton
from triton.runtime import autotuner as _autotuner
from triton.runtime import interpreter as _interpreter
from triton.runtime import jit as _jit


JITFunction = _jit.JITFunction
Autotuner = _autotuner.Autotuner
Heuristics = _autotuner.Heuristics
Config = triton.Config
InterpretedFunction = _interpreter.InterpretedFunction
InterpreterError = triton.runtime.errors.InterpreterError

# Triton's interpreter patches ``triton.language`` module-wide for the length
# of a launch, and the compiler's code generator calls that same module: a
# compile overlapping an interpreted launch in another thread would generate
# code from the interpreter's functions. Both hold this lock while they use
# the module. Reentrant: an interpreted kernel may trace a nested call.
LANGUAGE_LOCK = threading.RLock()


def jit_function_of(fn: Any) -> JITFunction:
  """Returns a ``JITFunction`` for a ``JITFunction`` or ``InterpretedFunction``.

  Kernels defined under ``TRITON_INTERPRET=1`` are ``InterpretedFunction``s;
  the GPU compiler needs a ``JITFunction`` of the same Python function. The
  result is memoized so that Triton's own per-function caches stay warm.
  """
  if isinstance(fn, JITFunction):
    return fn
  return jit_function_for(fn.fn)


def triton_launcher_scalar_type(value: Any) -> str | None:
  """The type Triton's own launcher gives an unannotated scalar argument.

  ``triton.runtime.jit.mangle_type``, native code in Triton 3.6 and 3.9.
  Triton 3.9 names bools "u1", earlier releases "i1";
  jaxlib's Triton call takes "i1", so both read "i1" here. None where the
  launcher refuses the value (an int beyond 64 bits, a NumPy int).
  jt_dist's own typing (``_types.scalar_type``) is tested against this.
  """
  try:
    mangled = _jit.mangle_type(value)
  except (OverflowError, TypeError, ValueError):
    return None
  return "i1" if mangled in ("u1", "i1") else mangled


@functools.lru_cache(maxsize=None)
def jit_function_for(python_fn) -> JITFunction:
  """A ``JITFunction`` of a plain Python function, one per function."""
  return JITFunction(python_fn)


# --- jaxlib's Triton custom call -------------------------------------------


@functools.lru_cache(maxsize=None)
def gpu_triton_module():
  """jaxlib's Triton custom-call bindings, or None without a GPU plugin."""
  # ``jax._src.lib.gpu_triton`` is an attribute bound to jaxlib's module,
  # not an importable submodule, so import_module must name jaxlib's.
  try:
    module = importlib.import_module("jaxlib.gpu_triton")
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
        if name not in manual and is_auto_axis(types.get(name))
    }
    return AxisFacts("spmd", mesh.size, mesh_devices(mesh), manual, auto,
                     mesh)
  if hasattr(axis_ctx, "num_devices"):
    devices = tuple(getattr(axis_ctx, "device_assignment", None) or ())
    return AxisFacts("sharding", axis_ctx.num_devices, devices, frozenset(), {})
  if hasattr(axis_ctx, "axis_env"):
    return AxisFacts("replica", 1, (), frozenset(), {})
  return AxisFacts("none", 1, (), frozenset(), {})


def lowering_for_export(ctx) -> bool:
  """Whether the lowering is ``jax.export``'s, whose module is serialised.

  JAX marks it in the lowering parameters of the module context (a field
  present from jax 0.4.30 on); a missing field means a plain lowering.
  """
  params = getattr(ctx.module_context, "lowering_parameters", None)
  return bool(getattr(params, "for_export", False))


def jit_cache_context(default: Any = None) -> Any:
  """A context whose value is part of JAX's tracing and lowering cache keys.

  ``jax.make_user_context`` (public since jax 0.6): a value changed inside
  ``with ctx(value):`` makes ``jit`` trace and lower again, where a plain
  context variable would let it reuse a lowering made under another value.
  """
  return jax.make_user_context(default_value=default)


def platform_version(device: Any) -> str:
  """The runtime a device's backend reports (e.g. its CUDA version)."""
  try:
    return str(device.client.platform_version)
  except AttributeError:
    return "unknown"


def mesh_devices(mesh: Any) -> tuple:
  """A mesh's devices, flattened; () for None, an empty or abstract mesh.

  ``AbstractMesh.devices`` raises ``ValueError`` rather than
  ``AttributeError``, so ``getattr(mesh, "devices", None)`` is not safe on
  the meshes that ``jax.typeof`` and partially manual ``shard_map`` give.
  """
  try:
    devices = mesh.devices
  except (AttributeError, ValueError):
    return ()
  return tuple(devices.flat) if getattr(devices, "size", 0) else ()


def mesh_platform(mesh: Any) -> str | None:
  """The platform of a mesh's devices ("cpu", "cuda", ...), or None.

  An ``AbstractMesh`` (from ``jax.typeof``) has no devices, only an
  abstract device that names the platform.
  """
  devices = mesh_devices(mesh)
  if devices:
    return devices[0].platform
  return getattr(getattr(mesh, "abstract_device", None), "platform", None)


def is_auto_axis(axis_type) -> bool:
  """Whether a mesh axis type is ``AxisType.Auto`` (XLA chooses layouts)."""
  # Meshes made before axis types existed behave as Auto.
  return axis_type is None or getattr(axis_type, "name", "") == "Auto"


# =============================================================================
# --- GPU lowering: Triton's compiler and jaxlib's Triton custom call --------
# =============================================================================
# Everything below is used only when lowering for CUDA or ROCm. It wraps the
# Triton compiler APIs that moved between releases (3.6 to 3.9 are tested),
# and the parts of jaxlib's Triton bindings whose signatures differ.


def gpu_target(backend: str, arch: int | str, warp_size: int):
  """Triton's ``GPUTarget`` for a CUDA capability (int) or a gfx arch (str)."""
  from triton.backends import compiler as backend_compiler  # pylint: disable=g-import-not-at-top

  return backend_compiler.GPUTarget(backend, arch, warp_size)


def make_backend(target):
  """The Triton compiler backend (CUDA or HIP) for a ``GPUTarget``."""
  from triton.compiler import compiler as triton_compiler  # pylint: disable=g-import-not-at-top

  return triton_compiler.make_backend(target)


def backend_hash(backend) -> str:
  """The backend's own cache identity (e.g. the ptxas version and arch)."""
  return str(backend.hash())


def cache_invalidating_env_vars() -> dict[str, str]:
  """Environment variables that Triton says change what it compiles."""
  from triton._C import libtriton  # pylint: disable=g-import-not-at-top

  getter = getattr(libtriton, "get_cache_invalidating_env_vars", None)
  return dict(getter()) if getter is not None else {}


def ast_to_ttir(jit_fn, backend, target, options, signature, constexprs,
                attrs):
  """Generates the TTIR module of ``jit_fn`` (the first compiler stage).

  Returns:
    ``(module, context)``; the context must outlive the module.
  """
  from triton._C.libtriton import ir  # pylint: disable=g-import-not-at-top
  from triton.compiler import compiler as triton_compiler  # pylint: disable=g-import-not-at-top

  source_class = triton_compiler.ASTSource
  if is_gluon(jit_fn):
    # Gluon kernels carry their layouts from the source: their own AST
    # source sets the module's target attributes and skips TTIR.
    from triton.experimental.gluon import _runtime as gluon_runtime  # pylint: disable=g-import-not-at-top
    source_class = gluon_runtime.GluonASTSource
  source = source_class(jit_fn, signature, constexprs, attrs)
  context = ir.context()
  ir.load_dialects(context)
  backend.load_dialects(context)
  with LANGUAGE_LOCK:
    try:
      module = source.make_ir(
          target, options, backend.get_codegen_implementation(options),
          backend.get_module_map(), context)
    except Exception as e:  # pylint: disable=broad-except
      # Triton's code generator wraps the AttributeError it meets in a
      # CompilationError that keeps only its text.
      missing = missing_gluon_api(jit_fn, e)
      if missing is None:
        raise
      raise missing from e
  return module, context


def missing_gluon_api(fn: Any, error: Exception):
  """A clear error for a Gluon kernel using what this Triton lacks, or None.

  Gluon's API grows with each release (Triton 3.6 has no
  ``mbarrier.allocate_mbarrier``, for one); Triton reports the gap as an
  AttributeError on a ``triton.experimental.gluon`` module, from hashing
  the kernel (3.6), or as a CompilationError quoting it (generating IR).
  """
  text = str(error)
  if (not is_gluon(fn) or "has no attribute" not in text
      or "module 'triton.experimental.gluon" not in text):
    return None
  error = text.strip().splitlines()[-1]
  return NotImplementedError(
      f"triton_call: Gluon kernel {fn.fn.__name__!r} uses a Gluon API that"
      f" Triton {triton.__version__} does not have: {error}. Upgrade Triton"
      " (3.9 has the Gluon API of jax-triton 0.4's tests), or write the"
      " kernel for this Triton's Gluon.")


def is_gluon(fn: Any) -> bool:
  """Whether ``fn`` is a Gluon kernel (``triton.experimental.gluon.jit``).

  Triton 3.6 to 3.9 mark them by ``JITFunction.is_gluon()``.
  """
  marker = getattr(fn, "is_gluon", None)
  try:
    return bool(marker()) if callable(marker) else False
  except Exception:  # pylint: disable=broad-except
    return False


def compiler_stages(backend, options, gluon: bool = False) -> dict[str, Any]:
  """Triton's ordered compiler stages after source: ttir, ttgir, llir, ...

  Each stage maps ``(module, metadata) -> next module`` and fills
  ``metadata``; running them in order is what ``triton.compile`` does,
  without its launcher, its file cache and its need for a driver.
  """
  from triton.backends import compiler as backend_compiler  # pylint: disable=g-import-not-at-top

  stages: dict[str, Any] = {}
  language = getattr(backend_compiler, "Language", None)
  if language is not None:
    backend.add_stages(stages, options,
                       language.GLUON if gluon else language.TRITON)
  else:  # Releases before the Gluon frontend took no language argument.
    backend.add_stages(stages, options)
  return stages


def initial_metadata(target, options) -> dict[str, Any]:
  """The metadata the first compiler stage receives, as in triton.compile.

  ``triton.compile`` starts it with the target and every backend option;
  the HIP backend's LLIR stage reads ``num_ctas`` from it (3.6 to 3.9),
  where the CUDA stages only write to it.
  """
  return {"target": target, **options.__dict__}


def pointer_divisibility_attr(backend) -> Any:
  """The per-parameter attribute saying a pointer is 16-byte aligned."""
  return backend.parse_attr("D")


def triton_ffi_targets(platform: str) -> frozenset[str]:
  """FFI custom-call targets registered by the GPU plugin of ``platform``."""
  module = gpu_triton_module()
  plugin = None if module is None else getattr(
      module, "_cuda_triton" if platform == "cuda" else "_hip_triton", None)
  if plugin is None or not hasattr(plugin, "registrations"):
    return frozenset()
  return frozenset(plugin.registrations())


def make_triton_kernel(lib, name, num_warps, num_ctas, shared_mem, binary,
                       ttir, arch_number, scratch_size, scratch_align):
  """jaxlib's ``TritonKernel``; newer jaxlibs also take the global scratch.

  jaxlib up to 0.11 takes 7 arguments and launches with a null scratch
  pointer, so a kernel that needs scratch memory cannot run there.
  """
  args = [name, num_warps, num_ctas, shared_mem, binary, ttir, arch_number]
  if not scratch_size:
    return lib.TritonKernel(*args)
  try:
    return lib.TritonKernel(*args, scratch_size, scratch_align)
  except TypeError:
    raise NotImplementedError(
        f"triton_call: kernel {name!r} needs {scratch_size} bytes of global"
        " scratch memory (e.g. for on-device TMA descriptors), which this"
        f" jaxlib ({jaxlib_version()})"
        " cannot allocate. Upgrade jax and jaxlib to a release whose"
        " TritonKernel takes a global scratch size, or avoid the feature."
    ) from None


def jaxlib_version() -> str:
  """The installed jaxlib's version string."""
  import jaxlib  # pylint: disable=g-import-not-at-top

  return str(getattr(jaxlib, "__version__", "unknown"))


def _version_tuple(version: str) -> tuple[int, ...]:
  parts = []
  for part in version.split(".")[:3]:
    digits = "".join(itertools.takewhile(str.isdigit, part))
    if not digits:
      break
    parts.append(int(digits))
  return tuple(parts)


# jaxlib 0.11.1 added TritonKernel.module_image: machine code that jaxlib
# loads as is, where older releases only assemble the PTX themselves.
_MODULE_IMAGE_JAXLIB = (0, 11, 1)


def jaxlib_takes_module_image() -> bool:
  """Whether jaxlib's Triton proto reads a kernel's CUBIN (module_image)."""
  return _version_tuple(jaxlib_version()) >= _MODULE_IMAGE_JAXLIB


def mark_requires_devices(primitive) -> None:
  """Asks JAX to pass the device assignment to ``primitive``'s lowering.

  Without this, ``jit`` lowers device-independently and the lowering context
  names no devices, so the GPU target could only be guessed.
  """
  try:
    from jax._src import dispatch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  registry = getattr(dispatch, "prim_requires_devices_during_lowering", None)
  if registry is not None:
    registry.add(primitive)


# --- Varying manual axes (shard_map's check_vma) ---------------------------


def at_top_level() -> bool:
  """Whether a call runs eagerly: no ``jax.jit``, vmap or grad trace is on.

  JAX has no public query for this. An all-concrete call inside a trace
  (arrays closed over by a jitted function) must not take the eager fast
  path, whose executable may be lowered for another platform there. Where
  jax's trace context is not found, this answers False: the slow path is
  always right.
  """
  try:
    return bool(_trace_context().is_top_level())
  except Exception:  # pylint: disable=broad-except
    return False


@functools.cache
def _trace_context() -> Any:
  from jax._src import core as _core  # pylint: disable=g-import-not-at-top
  return _core.trace_ctx


def top_level_probe() -> Callable[[], bool]:
  """``at_top_level`` as one cheap call, for the eager fast path.

  Found once; where jax's trace context is not found, the probe answers
  False (the slow path is always right).
  """
  try:
    probe = _trace_context().is_top_level
    probe()
  except Exception:  # pylint: disable=broad-except
    return lambda: False
  return probe


def environ_reader(names: tuple[str, ...]) -> Callable[[], Any]:
  """A function returning the raw values of environment variables ``names``.

  It reads what ``os.environ.get`` reads (so a value set through
  ``os.environ`` or ``mock.patch.dict`` is seen at once) without encoding
  the name and decoding the value on every call, which the eager fast path
  would pay twice per call. The values are comparable, not decoded: one
  value (or None) for one name, else a tuple of them. Falls back to
  ``os.environ.get`` where CPython's ``os.environ`` has another shape, or
  where ``os.environ`` was replaced.
  """
  env = os.environ
  data = getattr(env, "_data", None)
  encode = getattr(env, "encodekey", None)
  if not isinstance(data, dict) or encode is None:
    if len(names) == 1:
      return functools.partial(_environ_get, names[0])
    return lambda: tuple(os.environ.get(name) for name in names)
  keys = tuple(encode(name) for name in names)
  if len(names) == 1:
    (key,), (name,) = keys, names
    return lambda: (data.get(key) if os.environ is env
                    else os.environ.get(name))
  return lambda: (tuple(map(data.get, keys)) if os.environ is env
                  else tuple(os.environ.get(name) for name in names))


def _environ_get(name: str) -> Any:
  return os.environ.get(name)


def varying_axes(aval) -> frozenset:
  """The manual mesh axes a value varies over inside ``shard_map``."""
  vma = getattr(aval, "vma", None)
  if vma is None:
    vma = getattr(getattr(aval, "mat", None), "varying", None)
  return frozenset(vma or ())


def vary_over(x, axes: tuple):
  """Marks ``x`` as varying over ``axes`` (a no-op at run time)."""
  if not axes:
    return x
  if hasattr(jax.lax, "pcast"):
    return jax.lax.pcast(x, axes, to="varying")
  return jax.lax.pvary(x, axes)


# --- jax.distributed's key-value store --------------------------------------


def distributed_client():
  """The client of jax.distributed's coordination service, or None.

  Its key-value store lets process 0 hand a value to the others without a
  collective, in whatever order the processes get there; JAX exposes it only
  through a private module.
  """
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return getattr(distributed.global_state, "client", None)


def key_value_set(client, key: str, value: str) -> None:
  """Sets ``key``, replacing an earlier value where jaxlib allows it."""
  try:
    client.key_value_set(key, value, allow_overwrite=True)
  except TypeError:  # Older jaxlibs take no allow_overwrite.
    client.key_value_set(key, value)


# --- Host callbacks on the CPU --------------------------------------------


@functools.lru_cache(maxsize=None)
def host_buffer_callback():
  """``jax.experimental.buffer_callback.buffer_callback``, or None.

  It hands the callback the computation's own host buffers (jax >= 0.7;
  the support floor, 0.10.2, has it). ``jax.pure_callback`` instead
  ``device_put``s every operand to CPU device 0 before calling back; on
  jaxlib 0.10 an operand of 102,400 bytes or more is then copied
  asynchronously on the thread pool that runs the devices' programs, and
  with a collective after the callback every thread of that pool can end up
  waiting (XLA aborts the process after its rendezvous timeout).

  Returns:
    The function, or None where this jax lacks it (callers fall back to
    ``jax.pure_callback``).
  """
  try:
    module = importlib.import_module("jax.experimental.buffer_callback")
  except ImportError:
    return None
  fn = getattr(module, "buffer_callback", None)
  return fn if callable(fn) else None


# --- Triton's interpreter: memory accesses ---------------------------------


# Triton's interpreter (3.6 through 3.9) reaches memory only through four
# functions of its native module, which `triton.runtime.interpreter` imports
# as `_interpreter`: load(ptrs, mask, other, dtype), store(ptrs, values,
# mask), atomic_rmw(op, ptrs, values, mask, sem) and atomic_cas(ptrs, cmp,
# values, sem). Plain, block-pointer (3.6) and tensor-descriptor (3.9) loads
# and stores all end there, so it is the one place to check addresses.
_NATIVE_MEMORY_ATTR = "_interpreter"


def interpreter_native_memory() -> Any:
  """The native module through which the interpreter touches memory."""
  return getattr(_interpreter, _NATIVE_MEMORY_ATTR)


@contextlib.contextmanager
def interpreter_native_memory_replaced(replacement: Any):
  """Routes the interpreter's memory accesses through ``replacement``.

  Only for one launch, with the caller holding the interpreter lock.
  """
  original = getattr(_interpreter, _NATIVE_MEMORY_ATTR)
  setattr(_interpreter, _NATIVE_MEMORY_ATTR, replacement)
  try:
    yield
  finally:
    setattr(_interpreter, _NATIVE_MEMORY_ATTR, original)


def interpreter_program_id() -> tuple[int, int, int] | None:
  """The program instance the interpreter is running, as (x, y, z)."""
  builder = getattr(_interpreter, "interpreter_builder", None)
  grid_idx = getattr(builder, "grid_idx", None)
  return None if grid_idx is None else tuple(int(i) for i in grid_idx)


# --- Host-side TMA descriptors ---------------------------------------------


def descriptors_round_to_tf32() -> bool:
  """Whether Triton's host descriptors take ``round_f32_to_tf32`` (3.9)."""
  from triton.tools import tensor_descriptor  # pylint: disable=g-import-not-at-top
  fields = getattr(tensor_descriptor.TensorDescriptor,
                   "__dataclass_fields__", {})
  return "round_f32_to_tf32" in fields


def check_tf32_descriptor(info, kernel: str) -> None:
  """Refuses ``round_f32_to_tf32`` where the installed Triton lacks it.

  Raises:
    NotImplementedError: Triton before 3.9 (3.6 has no such option).
  """
  if info.round_f32_to_tf32 and not descriptors_round_to_tf32():
    raise NotImplementedError(
        f"triton_call: kernel {kernel!r} takes a TensorDescriptor with"
        " round_f32_to_tf32=True, which Triton"
        f" {triton.__version__} does not support (Triton 3.9 does). Round"
        " the array first, e.g. with jax.lax.reduce_precision(x, 8, 10), or"
        " upgrade Triton.")


def interpreter_descriptor(base, info):
  """Triton's host descriptor over ``base`` (a ``data_ptr`` object).

  Triton's constructor validates a torch-like tensor (``dtype.itemsize``);
  ``base`` is jt_dist's host pointer, and ``_tensordesc`` has already
  checked the same rules, so the fields are set directly.
  """
  from triton.tools import tensor_descriptor  # pylint: disable=g-import-not-at-top
  cls = tensor_descriptor.TensorDescriptor
  desc = cls.__new__(cls)
  fields = {"base": base, "shape": list(info.shape),
            "strides": list(info.strides),
            "block_shape": list(info.block_shape), "padding": info.padding,
            "round_f32_to_tf32": info.round_f32_to_tf32}
  for name in getattr(cls, "__dataclass_fields__", fields):
    setattr(desc, name, fields[name])
  return desc


def descriptor_fallback_flags(info) -> list[tuple[Any, str]]:
  """The flags after a lowered descriptor's shape and strides.

  Where Triton lowers a host descriptor to pointer arithmetic (no TMA:
  before Hopper), the kernel takes the base pointer, shape and strides
  (i64), then ``padding == "nan"`` (i1), then on Triton 3.9
  ``round_f32_to_tf32`` (i1), then the shape (i32) and strides (i64) again.
  """
  flags = [(info.padding == "nan", "i1")]
  if descriptors_round_to_tf32():
    flags.append((bool(info.round_f32_to_tf32), "i1"))
  return flags


def tma_parameter(lib, meta, info, platform: str):
  """jaxlib's TMA descriptor parameter for ``info``, per Triton's ``meta``.

  Raises:
    NotImplementedError: the installed jaxlib's Triton call takes no host
      TMA descriptors (jax-triton 0.4 needs a jaxlib newer than 0.11.0), or
      the descriptor is an im2col or fp4-padded one.
  """
  make = getattr(lib, "create_tma_descriptor_parameter", None)
  if make is None or platform != "cuda":
    raise NotImplementedError(
        "triton_call: a TensorDescriptor compiled to a TMA descriptor needs"
        " jaxlib's Triton call to build it at launch"
        " (create_tma_descriptor_parameter), which the installed jaxlib"
        f" ({jaxlib_version()}, {platform}) lacks; jaxlib 0.11.2 has it."
        " Upgrade jax and its CUDA plugin, or pass the array itself and"
        " build the descriptor inside the kernel (tl.make_tensor_descriptor).")
  if meta.get("is_im2col") or meta.get("fp4_padded"):
    raise NotImplementedError(
        "triton_call: im2col and fp4-padded TMA descriptors are not"
        " supported; pass a tiled descriptor.")
  from triton.backends.nvidia import driver  # pylint: disable=g-import-not-at-top
  elem_type = meta["elem_type"]
  if info.round_f32_to_tf32:
    elem_type = driver.TMA_TF32
  return make(elem_type=driver.TMA_DTYPE_DEVICE_TO_HOST[elem_type],
              swizzle=meta["swizzle"], shape=list(info.shape),
              strides=list(info.strides), block_shape=list(meta["block_size"]),
              oob_fill=1 if info.padding == "nan" else 0)


def interpreter_block_pointer(base, shape, strides, offsets, block_shape,
                              order) -> Any:
  """A block pointer handle of Triton's interpreter (Triton 3.6 has them)."""
  cls = getattr(_interpreter, "BlockPointerHandle", None)
  if cls is None:
    raise NotImplementedError(
        f"Triton {triton.__version__}'s interpreter has no block pointers")
  return cls(base, shape, strides, offsets, block_shape, order)


def is_ref(x: Any) -> bool:
  """Whether ``x`` is a ``jax.Ref`` (``jax.new_ref``), concrete or traced.

  jax 0.10.2 and 0.12 both export ``jax.Ref``, and a tracer of a Ref is an
  instance of it; a Ref view (``ref.at[...]``) is not.
  """
  ref_type = getattr(jax, "Ref", None)
  return ref_type is not None and isinstance(x, ref_type)


def is_ref_view(x: Any) -> bool:
  """Whether ``x`` is a view of a Ref (``ref.at[...]``): jax's TransformedRef.

  jax has no public name for it, so it is recognised by its class name and
  its ``ref`` attribute, both of which jax 0.10.2 and 0.12 have.
  """
  if type(x).__name__ != "TransformedRef":
    return False
  try:
    return is_ref(x.ref)
  except Exception:  # pylint: disable=broad-except
    return False


def register_dce_rule(primitive, keep: Callable[[Any], bool]) -> None:
  """jax's dead-code elimination of ``primitive``'s equations.

  An equation with no used output is dropped unless ``keep(eqn)``; one that
  is kept keeps all its inputs. ``jax.interpreters.partial_eval.dce_rules``
  is the registry; its rules take ``(used_outputs, eqn)`` on jax 0.10 and
  ``(used_outputs, live_inputs, eqn)`` on jax 0.12, the equation last in both.
  """
  from jax.interpreters import partial_eval  # pylint: disable=g-import-not-at-top

  def rule(used_outputs, *rest):
    eqn = rest[-1]
    if not any(used_outputs) and not keep(eqn):
      return [False] * len(eqn.invars), None
    return [True] * len(eqn.invars), eqn

  partial_eval.dce_rules[primitive] = rule


@functools.cache
def kernel_side_effect() -> Any:
  """The effect of a call marked ``has_side_effect=True``, registered once.

  An equation with an effect is kept by every enclosing jaxpr's dead-code
  elimination (a nested ``jax.jit``, ``shard_map``, ``cond``), which a DCE
  rule of the primitive alone cannot do. It is unordered: calls need no
  tokens. jax has no public registry of effects, so ``jax._src.effects``'
  sets are used, on jax 0.10.2 and 0.12 alike.
  """
  from jax._src import effects  # pylint: disable=g-import-not-at-top
  from jax.extend import core as jex_core  # pylint: disable=g-import-not-at-top

  class KernelSideEffect(jex_core.Effect):
    """A Triton kernel call that does more than write its outputs."""

    def __repr__(self) -> str:
      return "TritonKernelSideEffect"

  for registry in (effects.lowerable_effects,
                   effects.control_flow_allowed_effects,
                   effects.custom_derivatives_allowed_effects,
                   effects.remat_allowed_effects):
    registry.add_type(KernelSideEffect)
  return KernelSideEffect()
