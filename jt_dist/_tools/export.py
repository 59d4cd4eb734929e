"""``jax.export`` of kernel calls: setting exports up, checking artifacts."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist._core import options as _options
from jt_dist._errors import ExportError
from jt_dist._gpu import export as _gpu_export
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist._backend import target as _target

_TARGETS = (_gpu_lowering.FFI_TARGET, _gpu_lowering.LEGACY_TARGET)


def export_safety_checks() -> list[Any]:
  """The ``jax.export`` safety checks to disable for jt_dist's kernels.

  Pass them as ``disabled_checks=`` to ``jax.export.export``. They allow
  jaxlib's Triton custom calls (the FFI ``triton_kernel_call_ffi`` and the
  legacy ``triton_kernel_call``), whose serialised form JAX does not promise
  to keep readable across jaxlib releases: run an artifact under the jaxlib
  it was made with, or check it with ``jt_dist.check_exported``.

  Without them ``jax.export.export`` raises JAX's own ``ValueError``
  ("Cannot serialize code with custom calls whose targets have no
  compatibility guarantees"), after lowering and so out of jt_dist's reach:
  jt_dist cannot see ``disabled_checks`` and does not patch JAX. The call
  that error prints carries an attribute, ``jt_dist.export``, naming this
  function; on the FFI target it comes before the kernel's binary.

  Returns:
    A list of ``jax.export.DisabledSafetyCheck``.
  """
  return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _TARGETS]


def export_options(*, compute_capability: int | str | None = None,
                   cubin: bool = False):
  """Sets how calls are compiled when ``jax.export`` lowers them.

  A context manager: the settings hold for exports inside the block, in
  this thread. A call's own ``compute_capability=`` takes precedence.

  Args:
    compute_capability: the GPU to compile for where a call names none:
      a CUDA capability (major * 10 + minor, e.g. 90 for H100/H200) or a
      ROCm arch (e.g. "gfx942"). Exporting a call without one raises
      ``jt_dist.ExportError``.
    cubin: also put each kernel's CUBIN into the call. jaxlib 0.11.1 and
      later then load it instead of assembling the PTX; a CUBIN runs only
      on the architecture it was made for, and older jaxlibs ignore it and
      use the PTX, which every call carries.

  Returns:
    A context manager.

  Raises:
    TypeError: ``compute_capability`` is not an int, or ``cubin`` not a bool.
    ValueError: ``compute_capability`` is below 1.
  """
  if isinstance(compute_capability, str) and _options.GFX_ARCH.fullmatch(
      compute_capability):
    pass  # A ROCm arch.
  elif compute_capability is not None:
    if (not isinstance(compute_capability, numbers.Integral)
        or isinstance(compute_capability, bool)):
      raise TypeError(
          f"export_options: compute_capability={compute_capability!r} of"
          f" type {type(compute_capability).__name__} must be an int, major"
          " * 10 + minor, e.g. 90 for H100/H200, or a ROCm arch such as"
          " 'gfx942'.")
    if compute_capability < 1:
      raise ValueError(
          f"export_options: compute_capability={compute_capability!r} must"
          " be at least 1, e.g. 90 for H100/H200.")
    compute_capability = int(compute_capability)
  if not isinstance(cubin, bool):
    raise TypeError(
        f"export_options: cubin={cubin!r} of type {type(cubin).__name__}"
        " must be True or False.")
  return _gpu_export.scoped(_gpu_export.ExportSettings(
      compute_capability=compute_capability, cubin=cubin))


@dataclasses.dataclass(frozen=True)
class ExportedKernelCall:
  """What one exported Triton custom call was made with.

  Attributes:
    target: jaxlib's custom-call target.
    kernels: the compiled kernels' names (several for an autotuned call).
    platform: "cuda" or "rocm".
    compute_capability: e.g. 90 on CUDA, "gfx942" on ROCm.
    binary: "ptx", "cubin" (a CUBIN besides the PTX) or "hsaco" (ROCm).
    jt_dist: the jt_dist version that lowered the call.
    jax: the jax version.
    jaxlib: the jaxlib version, whose Triton call format the call uses.
    triton: the Triton version that compiled the kernels.
  """

  target: str
  kernels: tuple[str, ...]
  platform: str
  compute_capability: int | str
  binary: str
  jt_dist: str
  jax: str
  jaxlib: str
  triton: str


def _walk(operation):
  """Yields ``operation`` and every operation nested in its regions."""
  yield operation
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield from _walk(op.operation)


def _as_call(op) -> ExportedKernelCall | None:
  """What jt_dist recorded in a custom call's frontend attributes, or None."""
  if _gpu_export.FRONTEND_ATTRIBUTES not in op.attributes:
    return None
  attrs = mlir.ir.DictAttr(op.attributes[_gpu_export.FRONTEND_ATTRIBUTES])
  prefix = _gpu_export.ATTRIBUTE_PREFIX
  named = (attrs[i] for i in range(len(attrs)))
  recorded = {a.name[len(prefix):]: mlir.ir.StringAttr(a.attr).value
              for a in named if a.name.startswith(prefix)}
  if not recorded:
    return None
  fields = {f.name: recorded[f.name]
            for f in dataclasses.fields(ExportedKernelCall)}
  gpu = fields["compute_capability"]  # "90", or "gfx942".
  return ExportedKernelCall(**{
      **fields, "kernels": tuple(k for k in fields["kernels"].split(",") if k),
      "compute_capability": int(gpu) if gpu.isdigit() else gpu})


def exported_versions(exported: Any) -> list[ExportedKernelCall]:
  """What each Triton kernel call in an exported function was made with.

  Args:
    exported: a ``jax.export.Exported`` (e.g. from
      ``jax.export.deserialize``).

  Returns:
    One ``ExportedKernelCall`` per Triton custom call, in module order;
    empty when the function calls no kernel through jt_dist.

  Raises:
    TypeError: ``exported`` is not a ``jax.export.Exported``.
    ExportError: a Triton custom call records no versions (it was exported
      by something other than jt_dist, or by an older jt_dist).
  """
  if not isinstance(exported, jax.export.Exported):
    raise TypeError(
        f"exported_versions: got {type(exported).__name__}; pass a"
        " jax.export.Exported, e.g. jax.export.deserialize(data).")
  with mlir.make_ir_context() as context:
    module = mlir.ir.Module.parse(exported.mlir_module(), context=context)
    calls = []
    for op in _walk(module.operation):
      if op.name != "stablehlo.custom_call":
        continue
      name = mlir.ir.StringAttr(op.attributes["call_target_name"]).value
      if name not in _TARGETS:
        continue
      if (call := _as_call(op)) is None:
        raise ExportError(
            f"exported_versions: the module has a {name!r} custom call that"
            " records no versions: it was not exported by this jt_dist."
            " Export it again with jt_dist to record them.")
      calls.append(call)
  return calls


def _runs_on(call: ExportedKernelCall, capability: int) -> bool:
  made_for = call.compute_capability
  if call.binary == "cubin" or made_for >= 90:
    # A CUBIN is machine code for one arch; from Hopper on Triton compiles
    # for sm_90a / sm_100a, whose PTX no other GPU takes.
    return capability == made_for
  return capability >= made_for  # Plain PTX is JIT-compiled forward.


def check_exported(exported: Any, *,
                   compute_capability: int | str | None = None) -> list[str]:
  """Checks that an exported function's kernels can run on this host's GPUs.

  Args:
    exported: a ``jax.export.Exported``.
    compute_capability: the GPU to check against, e.g. 90 or "gfx942"; by
      default every CUDA or ROCm device of this process.

  Returns:
    Notes on versions that differ from the running ones without preventing
    the run (a jaxlib or Triton other than the exporting one); empty when
    everything matches.

  Raises:
    ExportError: a kernel was compiled for a GPU unlike the one(s) it would
      run on, or no device of its platform is visible and no
      ``compute_capability`` was given, or a ROCm kernel meets a jaxlib
      before 0.11.1.
  """
  calls = exported_versions(exported)
  rocm_calls = [c for c in calls if c.platform == "rocm"]
  arch = compute_capability if isinstance(compute_capability, str) else None
  if rocm_calls:
    _check_rocm(rocm_calls, arch)
  if arch is not None:
    compute_capability = None  # A ROCm arch says nothing about CUDA GPUs.
  cuda_calls = [c for c in calls if c.platform == "cuda"]
  capabilities = ([int(compute_capability)] if compute_capability is not None
                  else sorted(set(map(_target.cuda_capability,
                                      _target.local_devices("cuda"))) - {None}))
  if cuda_calls and not capabilities:
    raise ExportError(
        "check_exported: the artifact's kernels are compiled for CUDA"
        f" (sm_{cuda_calls[0].compute_capability}), and this process sees no"
        " CUDA device. Run it on the GPU host, or pass compute_capability="
        " (e.g. 90) to check against a GPU that is not here.")
  for call in cuda_calls:
    if refused := [cc for cc in capabilities if not _runs_on(call, cc)]:
      raise ExportError(
          f"check_exported: kernel(s) {', '.join(call.kernels)} were compiled"
          f" for sm_{call.compute_capability} as {call.binary.upper()},"
          f" which does not run on sm_{refused[0]}. Export again with"
          f" compute_capability={refused[0]} (and cubin=False for code that"
          " older GPUs of the same family cannot take either).")
  return _version_notes(calls)


def _check_rocm(calls: list[ExportedKernelCall], arch: str | None) -> None:
  """Refuses ROCm kernels this jaxlib or these GPUs cannot load."""
  names = ", ".join(k for c in calls for k in c.kernels)
  if not _compat.jaxlib_takes_module_image():
    raise ExportError(
        f"check_exported: kernel(s) {names} carry their HSACO in the"
        " module, which jaxlib loads from 0.11.1 on; this is jaxlib"
        f" {_compat.jaxlib_version()}. Upgrade jax and jaxlib.")
  archs = [arch] if arch else sorted({
      a for d in _target.local_devices("rocm") if (a := _target.rocm_arch(d))})
  if not archs:
    raise ExportError(
        "check_exported: the artifact's kernels are compiled for ROCm"
        f" ({calls[0].compute_capability}), and this process sees no ROCm"
        " device. Run it on the GPU host, or pass compute_capability= (e.g."
        " 'gfx942') to check against a GPU that is not here.")
  for call in calls:
    if refused := [a for a in archs if a != call.compute_capability]:
      raise ExportError(
          f"check_exported: kernel(s) {', '.join(call.kernels)} were"
          f" compiled for {call.compute_capability}, and an HSACO runs only"
          f" on the arch it was compiled for, not on {refused[0]}. Export"
          f" again with compute_capability={refused[0]!r}.")


def _version_notes(calls: list[ExportedKernelCall]) -> list[str]:
  jaxlib, triton = _compat.jaxlib_version(), _compat.triton.__version__
  notes = []
  for call in calls:
    if call.jaxlib != jaxlib:
      notes.append(
          f"kernel(s) {', '.join(call.kernels)} were exported under jaxlib"
          f" {call.jaxlib} and run under {jaxlib}: jaxlib's Triton"
          " call format has no compatibility guarantee; if the call fails,"
          " export again under this jaxlib.")
    if call.triton != triton and call.binary == "ptx":
      notes.append(
          f"kernel(s) {', '.join(call.kernels)} carry PTX from Triton"
          f" {call.triton} (this host has {triton}); if jaxlib"
          " refuses its PTX ISA version, export again with this host's"
          " Triton.")
  return notes
