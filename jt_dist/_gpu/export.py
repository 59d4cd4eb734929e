"""What the GPU lowering does differently under ``jax.export``.

An exported module may run later on another host and jaxlib: the call is
compiled for a GPU named explicitly, carries PTX unless a CUBIN is asked for,
and records its versions as frontend attributes, which survive serialisation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Sequence

import jax
from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist._errors import ExportError

# Read back by jt_dist._tools.export.
ATTRIBUTE_PREFIX = "jt_dist_"
FRONTEND_ATTRIBUTES = "mhlo.frontend_attributes"

# jax.export's refusal of a Triton call prints its attributes in name order:
# this one (ignored by XLA) comes before the binary, so users read the fix.
SAFETY_CHECKS_ATTRIBUTE = "jt_dist.export"
SAFETY_CHECKS_NOTE = (
    "jax.export.export takes this Triton call only with"
    " disabled_checks=jt_dist.export_safety_checks()")


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  """How calls lowered by ``jax.export`` are compiled (``export_options``)."""

  # The GPU of calls that name none: 90 (CUDA) or "gfx942" (ROCm).
  compute_capability: int | str | None = None
  cubin: bool = False  # A CUBIN in the call besides the PTX.


# Created on first use, not at import: it registers state with JAX.
_context: Any = None
_context_lock = threading.Lock()


def current() -> ExportSettings:
  """The settings in force in this thread."""
  return (_context is not None and _context.value) or ExportSettings()


@contextlib.contextmanager
def scoped(settings: ExportSettings):
  """Puts ``settings`` in force inside the block (part of JAX's cache keys)."""
  global _context
  with _context_lock:
    if _context is None:
      _context = _compat.jit_cache_context(None)
  with _context(settings):
    yield settings


def export_capability(spec, platform: str) -> int | str:
  """The call's own ``compute_capability``, else the export settings' one."""
  if platform != "cuda" and not _compat.jaxlib_takes_module_image():
    raise NotImplementedError(
        f"triton_call: kernel {spec.info.name!r} cannot be exported with"
        f" jax.export for {platform} under jaxlib"
        f" {_compat.jaxlib_version()}: jaxlib before 0.11.1 loads a ROCm"
        " kernel from a file on the host that lowered it, which a"
        " serialised module cannot carry. Upgrade jax and jaxlib to 0.11.1"
        " or later (the kernel then travels in the module), export for"
        " CUDA (platforms=['cuda'] with compute_capability=), or lower and"
        " run on the ROCm host without exporting.")
  capability = (current().compute_capability
                if spec.compute_capability is None
                else spec.compute_capability)
  if capability is None:
    example, note = (("compute_capability='gfx942'", "gfx942: MI300")
                     if platform == "rocm"
                     else ("compute_capability=90", "90: H100/H200"))
    raise ExportError(
        f"triton_call: kernel {spec.info.name!r} is being exported with"
        f" jax.export for {platform}, but no compute_capability was given."
        " An exported kernel is compiled for one GPU, which must be named,"
        " not taken from whatever GPU (if any) this host has. Pass"
        " compute_capability= to triton_call / sharded_triton_call, or"
        f" export inside `with jt_dist.export_options({example}):`"
        f" ({note}).")
  return capability


def wants_cubin(target_name: str, ffi_target: str) -> bool:
  """Whether an exported call carries CUBINs; ExportError where it cannot."""
  if not current().cubin:
    return False
  if target_name != ffi_target:
    raise ExportError(
        f"jt_dist.export_options(cubin=True): CUBINs go only into jaxlib's"
        f" FFI target {ffi_target!r}, and this call uses {target_name!r}"
        " (custom_call_target_name, or a jaxlib without the FFI target)."
        " Export with cubin=False (PTX), or use the FFI target.")
  return True


def record(results: Sequence[Any], target, target_name: str,
           kernels: Sequence[Any], binary: str) -> None:
  """Records the versions, GPU and binary kind (and the safety checks'
  note) on the custom call, if it has results."""
  from jt_dist import __version__  # pylint: disable=g-import-not-at-top

  if not results:
    return
  recorded = {
      "jt_dist": __version__,
      "jax": jax.__version__,
      "jaxlib": _compat.jaxlib_version(),
      "triton": _compat.triton.__version__,
      "platform": target.platform,
      "compute_capability": str(target.arch),
      "binary": binary,
      "target": target_name,
      "kernels": ",".join(k.name for k in kernels),
  }
  op = results[0].owner
  op = getattr(op, "operation", op)
  attributes = {}
  if FRONTEND_ATTRIBUTES in op.attributes:
    existing = mlir.ir.DictAttr(op.attributes[FRONTEND_ATTRIBUTES])
    attributes = {existing[i].name: existing[i].attr
                  for i in range(len(existing))}
  for key, value in recorded.items():
    attributes[ATTRIBUTE_PREFIX + key] = mlir.ir.StringAttr.get(value)
  op.attributes[FRONTEND_ATTRIBUTES] = mlir.ir.DictAttr.get(attributes)
  op.attributes[SAFETY_CHECKS_ATTRIBUTE] = mlir.ir.StringAttr.get(
      SAFETY_CHECKS_NOTE)
