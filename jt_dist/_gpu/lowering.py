"""The primitive's CUDA and ROCm lowering: jaxlib's Triton custom call.

Each launch becomes a ``TritonKernelCall``; several configs still to be
tuned become a ``TritonAutotunedKernelCall``, timed on its first run. The
CUBIN (FFI target) or HSACO (ROCm) goes along where jaxlib 0.11.1+ loads it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
import zlib

import jax
from jax.interpreters import mlir
import numpy as np

from jt_dist import _compat
from jt_dist._autotune import choose as _choose
from jt_dist._core import primitive as _primitive
from jt_dist._core import wrapper as _wrapper
from jt_dist._cpu import lowering as _cpu_lowering
from jt_dist._gpu import compile as _compile
from jt_dist._gpu import export as _gpu_export
from jt_dist._gpu import proto_wire as _proto_wire
from jt_dist._backend import target as _target
from jt_dist._sharding import placement as _placement

logger = logging.getLogger("jt_dist")

FFI_TARGET = "triton_kernel_call_ffi"
LEGACY_TARGET = "triton_kernel_call"
# jax-triton 0.4's public name for the target it emits.
CUSTOM_CALL_TARGET_NAME = FFI_TARGET
_PLUGIN_ATTRIBUTE = {"cuda": "_cuda_triton", "rocm": "_hip_triton"}
_hsaco_dir: tempfile.TemporaryDirectory | None = None


@dataclasses.dataclass(frozen=True)
class ProtoChoices:
  """What the serialised call carries besides what jaxlib needs: each
  launch's host time grows by 0.04-0.17 µs per serialised KiB
  (benchmarks/dispatch_profile.py, 2x H200), so unread bytes are left out."""

  # The CUBIN, on the FFI target only (the legacy one hashes it per launch).
  module_images: bool = True
  ttir: bool = False  # jaxlib keeps the TTIR but never reads it.
  # Random bytes in a field jaxlib ignores, to price each serialised byte.
  padding_bytes: int = 0


_PADDING_FIELD = 99  # Unused by TritonAnyKernelCall; protobuf keeps it.


# Read per lowering: benchmarks and tests replace it (mock.patch.object).
proto_choices = ProtoChoices()


def plugin(platform: str):
  """jaxlib's Triton bindings for ``platform``; RuntimeError without them."""
  found = getattr(_compat.gpu_triton_module(), _PLUGIN_ATTRIBUTE[platform],
                  None)
  if not hasattr(found, "TritonKernel"):
    # jt_dist is installed from a clone, not from a package index.
    hint = ("Install JAX's CUDA plugin, cuda12 or cuda13 to match your CUDA"
            " driver: from jt_dist's clone, `pip install -e \".[cuda12]\"`"
            " (or `\".[cuda13]\"`); or, for this jax,"
            f" `pip install \"jax[cuda12]=={jax.__version__}\"`."
            if platform == "cuda"
            else "Install JAX's ROCm plugin for this jax:"
            f" `pip install \"jax-rocm7-plugin=={jax.__version__}\"`.")
    raise RuntimeError(
        f"triton_call: lowering for {platform} needs jaxlib's Triton"
        f" custom call, which comes with JAX's {platform} plugin, and the"
        f" plugin is not installed. {hint}")
  return found


def rocm_binary_inline() -> bool:
  """Whether a ROCm call carries its HSACO inline (jaxlib 0.11.1 or later);
  else it names a file, which a persistently cached executable lacks."""
  return _compat.jaxlib_takes_module_image()


def _binary_argument(compiled: _compile.CompiledKernel, platform: str) -> str:
  """The ``ptx`` field: PTX, or an HSACO's name (inline, it still keys
  jaxlib's module cache, so it names the content)."""
  if platform == "cuda":
    return compiled.binary.decode("utf-8")
  digest = hashlib.sha256(compiled.binary).hexdigest()
  if rocm_binary_inline():
    return f"jt_dist-inline-hsaco:{compiled.name}-{digest[:32]}"
  # Older jaxlibs read, then delete, the file: one per process and content.
  global _hsaco_dir
  if _hsaco_dir is None:
    _hsaco_dir = tempfile.TemporaryDirectory(prefix="jt_dist_hsaco_")
  path = os.path.join(_hsaco_dir.name, f"{compiled.name}-{digest[:16]}.hsaco")
  if not os.path.exists(path):
    with open(path, "wb") as f:
      f.write(compiled.binary)
  return path


def _nbytes(shape, dtype) -> int:
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _descriptor_parameters(lib, op, meta, platform, to_zero):
  """jaxlib's parameters for one host TMA descriptor, as Triton expands it:
  the TMA descriptor (with ``meta``) or the buffer, shape, strides and
  flags; then shape (i32) and strides. ``to_zero``: bytes of its buffer
  zeroed before the launch."""
  info = op.value
  shape_i32 = [lib.create_scalar_parameter(int(d), "i32") for d in info.shape]
  strides = [lib.create_scalar_parameter(int(s), "i64") for s in info.strides]
  if meta is not None:
    if to_zero:
      raise NotImplementedError(
          f"triton_call: parameter {op.name!r} takes a TensorDescriptor of"
          " a zeroed output, and jaxlib's TMA descriptor parameter cannot"
          " zero its buffer. Drop the output from zeroed_outputs and store"
          " zeros from the kernel, or alias a jnp.zeros input to it"
          " (input_output_aliases) and pass that input as the descriptor.")
    return [_compat.tma_parameter(lib, meta, info, platform),
            *shape_i32, *strides]
  return [lib.create_array_parameter(to_zero, 16),
          *[lib.create_scalar_parameter(int(d), "i64") for d in info.shape],
          *strides,
          *[lib.create_scalar_parameter(v, t)
            for v, t in _compat.descriptor_fallback_flags(info)],
          *shape_i32, *strides]


def _parameters(lib, spec, launch, specialization, compiled, platform):
  """jaxlib's kernel parameters, in the order the compiled kernel takes them."""
  zeroed = set(launch.zeroed_outputs)
  aliased = dict(spec.input_output_aliases)
  params = []
  metas = iter(compiled.tensordesc_meta)
  for op in specialization.launch_operands:
    if op.kind == "scalar":
      params.append(lib.create_scalar_parameter(op.value, op.type))
      continue
    # Under jax-triton 0.4's convention an aliased output binds no
    # parameter: its input's pointer is the output's buffer.
    out = (op.index if op.kind == "output"
           else aliased.get(op.index) if op.kind == "array" else None)
    to_zero = _nbytes(*spec.out_shapes[out]) if out in zeroed else 0
    if op.type.startswith("tensordesc"):
      params.extend(_descriptor_parameters(lib, op, next(metas, None),
                                           platform, to_zero))
      continue
    # 16: the divisibility the kernel was specialised for; jaxlib checks it.
    params.append(lib.create_array_parameter(to_zero, 16))
  return params


def _check_descriptors(spec, platform: str) -> None:
  """Refuses host TMA descriptors where jt_dist cannot pass them."""
  for op in spec.operands:
    if not op.type.startswith("tensordesc"):
      continue
    if platform != "cuda":
      raise NotImplementedError(
          f"triton_call: parameter {op.name!r} of kernel"
          f" {spec.info.name!r} takes a TensorDescriptor, which jt_dist"
          f" passes on CUDA GPUs and the CPU, not on {platform}. Pass the"
          " array and build the descriptor in the kernel"
          " (tl.make_tensor_descriptor).")
    _compat.check_tf32_descriptor(op.value, spec.info.name)


def _fitting_calls(lib, spec, target, object_file):
  """``(TritonKernelCall, launch, compiled)`` of each launch that fits: as
  in Triton's autotuner, one short of shared memory is dropped if not alone."""
  _check_descriptors(spec, target.platform)
  calls, errors = [], []
  for launch in spec.launches:
    try:
      compiled, specialization = _compile.compiled_kernel(
          spec, launch, target, object_file)
    except _compile.SharedMemoryError as e:
      if len(spec.launches) == 1:
        raise
      errors.append(e)
      logger.warning("jt_dist: dropping autotuning config: %s", e)
      continue
    if compiled.profile_scratch_size:
      raise NotImplementedError(
          f"triton_call: kernel {compiled.name!r} was compiled with profiling"
          " instrumentation (Proton), which needs a profile scratch buffer"
          " that jaxlib does not allocate. Turn the instrumentation off.")
    kernel = _compat.make_triton_kernel(
        lib, compiled.name, compiled.num_warps, compiled.num_ctas,
        compiled.shared_mem, _binary_argument(compiled, target.platform),
        compiled.ttir if proto_choices.ttir else "", target.arch_number,
        compiled.global_scratch_size, compiled.global_scratch_align)
    params = _parameters(lib, spec, launch, specialization, compiled,
                         target.platform)
    calls.append((lib.TritonKernelCall(kernel, *launch.grid, params), launch,
                  compiled))
  if not calls:
    raise errors[0]
  return calls


def _autotuned_call(lib, spec, calls, ctx, order):
  scalars = {op.name: op.value for op in spec.operands if op.kind == "scalar"}
  description = f"{spec.name} ({spec.info.name}) {scalars}"
  # Output indices as the custom call's results are ordered (result_order).
  aliases_with_sizes = tuple(
      (i, order.index(o), _nbytes(ctx.avals_in[i].shape, ctx.avals_in[i].dtype))
      for i, o in spec.input_output_aliases)
  configs = [(call, launch.config.label) for call, launch, _ in calls]
  return lib.TritonAutotunedKernelCall(description, configs, aliases_with_sizes)


# Whether CUDA calls default to the legacy target where nothing needs FFI:
# on one H100 (benchmarks/results/h100x1/dispatch.json) a jitted add took
# ~2 us (2%) less on it. ROCm keeps FFI (never measured there).
PREFER_LEGACY_TARGET = True


def default_target(has_ffi: bool, *, exporting: bool, cost_estimate: bool,
                   prefer_legacy: bool | None = None) -> str:
  """The target of a call naming none: FFI where something needs it
  (``jax.export``'s CUBIN, a ``cost_estimate``, CUDA graphs, which capture
  only the FFI handler), else as ``prefer_legacy`` says."""
  if prefer_legacy is None:
    prefer_legacy = PREFER_LEGACY_TARGET
  needs_ffi = exporting or cost_estimate or not prefer_legacy
  return FFI_TARGET if has_ffi and needs_ffi else LEGACY_TARGET


def custom_call_target(spec, lib, platform: str, exporting: bool) -> str:
  """The custom-call target to emit; ValueError for an unknown name."""
  requested = spec.custom_call_target_name
  if requested not in (None, FFI_TARGET, LEGACY_TARGET):
    raise ValueError(
        f"triton_call: custom_call_target_name={requested!r} is not a Triton"
        f" target of jaxlib; pass {FFI_TARGET!r}, {LEGACY_TARGET!r}, or None"
        " for the default.")
  has_ffi = FFI_TARGET in _compat.triton_ffi_targets(lib)
  if requested == FFI_TARGET and not has_ffi:
    raise ValueError(
        f"triton_call: custom_call_target_name={FFI_TARGET!r}, but the"
        f" installed jaxlib ({_compat.jaxlib_version()}) does not register"
        f" it for {platform}. Upgrade jax and its plugin, or pass"
        f" {LEGACY_TARGET!r}.")
  if requested is not None:
    return requested
  return default_target(has_ffi, exporting=exporting,
                        cost_estimate=bool(spec.cost_estimate),
                        prefer_legacy=(PREFER_LEGACY_TARGET
                                       and platform == "cuda"))


def gpu_lowering(ctx, *args, spec, platform: str):
  """Lowers one ``triton_call`` to jaxlib's Triton custom call."""
  if _compat.is_interpreted(spec.info.fn):
    # A kernel made under TRITON_INTERPRET=1 is interpreted on GPUs too.
    return _cpu_lowering.cpu_lowering(ctx, *args, spec=spec)
  exporting = _compat.lowering_for_export(ctx)
  capability = (_gpu_export.export_capability(spec, platform) if exporting
                else spec.compute_capability)
  lib = plugin(platform)
  name = custom_call_target(spec, lib, platform, exporting)
  cubin = (_gpu_export.wants_cubin(name, FFI_TARGET)
           if exporting and platform == "cuda" else None)
  target = _target.resolve_target(ctx, platform, capability)
  for launch in spec.launches:
    _target.check_num_ctas(target, launch.config.num_ctas, launch.config.label)
  try:
    calls = _fitting_calls(lib, spec, target, cubin or None)
  except Exception as e:  # pylint: disable=broad-except
    _wrapper.raise_compile_error(e, spec, [a.shape for a in ctx.avals_in])
  order = result_order(spec)
  call = (calls[0][0] if len(calls) == 1
          else _autotuned_call(lib, spec, calls, ctx, order))
  kernels = [compiled for _, _, compiled in calls]
  serialized = call.to_proto(spec.name, spec.serialized_metadata)
  with_images = (rocm_binary_inline() if platform == "rocm"
                 else cubin if exporting
                 else (proto_choices.module_images and name == FFI_TARGET
                       and bool(kernels[0].object_file)))
  if with_images:
    # The machine code jaxlib loads as is: the CUBIN, or the HSACO.
    serialized = _proto_wire.with_module_images(serialized, [
        _proto_wire.ModuleImage(k.name, k.shared_mem, k.binary
                                if platform == "rocm" else k.object_file)
        for k in kernels])
  if proto_choices.padding_bytes:
    serialized += _proto_wire.length_delimited(
        _PADDING_FIELD, os.urandom(proto_choices.padding_bytes))
  results = _emit(ctx, args, spec, name, zlib.compress(serialized), order)
  if exporting:
    binary = ("hsaco" if platform == "rocm"
              else "cubin" if with_images else "ptx")
    _gpu_export.record(results, target, name, kernels, binary)
  return results


def result_order(spec) -> tuple[int, ...]:
  """The custom call's results, as output indices, in jaxlib's order: the
  outputs that bind a parameter first (an aliased one binds none)."""
  bound = tuple(op.index for op in spec.operands if op.kind == "output")
  return bound + tuple(i for i in range(len(spec.out_shapes))
                       if i not in bound)


def _emit(ctx, args, spec, name: str, opaque: bytes, order: tuple[int, ...]):
  """The custom call on ``name``; its results in ``order``, returned sorted."""
  position = {out: k for k, out in enumerate(order)}
  aliases = {i: position[o] for i, o in spec.input_output_aliases} or None
  ctx = ctx.replace(avals_out=[ctx.avals_out[i] for i in order])
  if spec.cost_estimate and name != FFI_TARGET:
    raise ValueError(
        f"triton_call: kernel {spec.info.name!r} has cost_estimate="
        f"{dict(spec.cost_estimate)!r}, which only the FFI custom call"
        f" ({FFI_TARGET!r}) can carry, but custom_call_target_name={name!r}"
        " was chosen. Drop cost_estimate, or use the FFI target.")
  attributes, legacy = {"opaque": opaque}, {}
  if name != FFI_TARGET:
    attributes, legacy = {}, {"backend_config": opaque}
  elif spec.cost_estimate:
    # The key and JSON form jax-triton 0.4 gives XLA.
    attributes["cost_estimate_json"] = json.dumps(dict(spec.cost_estimate))
  rule = jax.ffi.ffi_lowering(
      name, api_version=2 if legacy else 4, operand_output_aliases=aliases,
      has_side_effect=spec.has_side_effect, **legacy)
  results = rule(ctx, *args, **attributes)
  return [results[position[i]] for i in range(len(order))]


for _platform in ("cuda", "rocm"):
  mlir.register_lowering(
      _primitive.triton_call_p,
      _placement.checked(
          functools.partial(gpu_lowering, platform=_platform),
          _choose.for_lowering, _platform),
      platform=_platform)
# The GPU target is read from the lowering devices, named only on request.
_compat.mark_requires_devices(_primitive.triton_call_p)
