"""Compiling one launch with Triton: to PTX (CUDA) or HSACO (ROCm).

A launch is specialised as Triton's own launcher would
(``_backend.specialize``). Where jaxlib (0.11.1 or later) loads a CUBIN, one is assembled too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

from jt_dist._backend import cache as _cache
from jt_dist import _compat
from jt_dist import _settings
from jt_dist._backend import specialize as _specialize
from jt_dist._backend import target as _target

# The stage whose output jaxlib takes as the kernel.
_FINAL_STAGE = {"cuda": "ptx", "rocm": "hsaco"}
_OBJECT_STAGE = "cubin"
# Blackwell's tensor memory has 512 columns; Triton emits a trap instead of
# an error above it, which would hang the GPU at launch.
_TMEM_LIMIT = 512


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
  """Triton's output for one launch, as jaxlib's ``TritonKernel`` needs it."""

  name: str
  binary: bytes  # PTX text (UTF-8) on CUDA, an HSACO object on ROCm.
  ttir: str
  num_warps: int
  num_ctas: int
  shared_mem: int
  global_scratch_size: int
  global_scratch_align: int
  profile_scratch_size: int
  # The CUBIN assembled from ``binary`` where jaxlib can load one, else b"".
  object_file: bytes = b""
  # Each host TMA descriptor's metadata; empty where lowered without TMA.
  tensordesc_meta: tuple = ()

  def metadata(self) -> dict[str, Any]:
    """Everything but the binaries, as JSON-able values."""
    fields = dataclasses.asdict(self)
    del fields["binary"], fields["object_file"]
    return fields

  def to_entry(self) -> tuple[dict[str, Any], bytes]:
    """A disk cache entry: the metadata, and both binaries as one blob."""
    return ({**self.metadata(), "object_file_size": len(self.object_file)},
            self.binary + self.object_file)

  @classmethod
  def from_entry(cls, metadata: dict[str, Any], blob: bytes):
    """Rebuilds a kernel from a disk cache entry; TypeError if malformed."""
    metadata = dict(metadata)
    object_size = metadata.pop("object_file_size", None)
    fields = {f.name for f in dataclasses.fields(cls)} - {
        "binary", "object_file"}
    if set(metadata) != fields:
      raise TypeError(f"fields {sorted(metadata)} differ from {sorted(fields)}")
    if (not isinstance(object_size, int)
        or not 0 <= object_size <= len(blob)):
      raise TypeError(f"object_file_size {object_size!r} does not fit the"
                      f" {len(blob)}-byte binary")
    split = len(blob) - object_size
    metadata["tensordesc_meta"] = tuple(
        dict(m) for m in metadata.get("tensordesc_meta") or ())
    return cls(binary=blob[:split], object_file=blob[split:], **metadata)


def cache_key(jit_fn, spec_: _specialize.Specialization, options, backend,
              target: _target.Target, object_file: bool = False) -> str:
  """The content hash that identifies a compiled kernel."""
  return _cache.content_key({
      "kernel": jit_fn.cache_key,  # Source and every @triton.jit callee.
      "gluon": _compat.is_gluon(jit_fn),
      "signature": list(spec_.signature.items()),
      "constexprs": sorted((k, _specialize.value_key(v))
                           for k, v in spec_.constexprs.items()),
      "attrs": sorted((list(k), repr(v)) for k, v in spec_.attrs.items()),
      "options": options.hash(),
      "backend": _compat.backend_hash(backend),
      "target": [target.platform, str(target.arch), target.warp_size],
      "triton": _compat.triton.__version__,
      "jaxlib": _compat.jaxlib_version(),
      "env": sorted(_compat.cache_invalidating_env_vars().items()),
      # Read when compiling, though Triton's own cache key leaves it out.
      "non_constexpr_globals": bool(
          _compat.triton.knobs.compilation.allow_non_constexpr_globals),
      "format": _cache.FORMAT_VERSION,
      "object_file": object_file,
  })


def _run_stages(jit_fn, spec_, target, backend, options, object_file):
  """Runs Triton's pipeline to the final stage; returns (IRs, metadata)."""
  module, context = _compat.ast_to_ttir(
      jit_fn, backend, target.triton_target, options, spec_.signature,
      spec_.constexprs, spec_.attrs)
  irs = {"source": str(module)}
  final = _OBJECT_STAGE if object_file else _FINAL_STAGE[target.platform]
  stages, metadata = _compat.compiler_stages(
      backend, target.triton_target, options, _compat.is_gluon(jit_fn))
  for stage, run in stages.items():
    module = run(module, metadata)
    irs[stage] = module if isinstance(module, bytes) else str(module)
    if stage == final:
      break
  del context  # Kept alive until here: the modules belong to it.
  return irs, metadata


def _run_triton(spec, launch, target, backend, options, spec_, jit_fn,
                object_file) -> CompiledKernel:
  """Compiles ``launch`` with Triton, bypassing every cache."""
  irs, metadata = _run_stages(jit_fn, spec_, target, backend, options,
                              object_file)
  binary = irs[_FINAL_STAGE[target.platform]]
  compiled = CompiledKernel(
      object_file=irs.get(_OBJECT_STAGE, b""),
      name=metadata["name"],
      binary=binary if isinstance(binary, bytes) else binary.encode("utf-8"),
      ttir=irs.get("ttir", irs["source"]),
      num_warps=int(metadata.get("num_warps") or options.num_warps),
      num_ctas=int(launch.config.num_ctas),
      shared_mem=int(metadata.get("shared") or 0),
      global_scratch_size=int(metadata.get("global_scratch_size") or 0),
      global_scratch_align=int(metadata.get("global_scratch_align") or 1),
      profile_scratch_size=int(metadata.get("profile_scratch_size") or 0),
      tensordesc_meta=tuple(
          dict(m) for m in metadata.get("tensordesc_meta") or ()),
  )
  if int(metadata.get("tmem_size") or 0) > _TMEM_LIMIT:
    raise ValueError(
        f"triton_call: kernel {compiled.name!r} (config:"
        f" {launch.config.label}) needs {metadata['tmem_size']} columns of"
        f" tensor memory; the GPU has {_TMEM_LIMIT}. Use smaller blocks.")
  if spec.debug:
    for stage, text in irs.items():
      if isinstance(text, bytes):
        text = f"<{len(text)} bytes of binary>"
      print(f"// ----- jt_dist: {compiled.name} {stage} -----\n{text}",
            file=sys.stdout)
  if dump_dir := _settings.dump_dir():
    _dump(dump_dir, compiled, irs, launch, target)
  return compiled


def _dump(dump_dir: str, compiled: CompiledKernel, irs, launch, target):
  """Writes the IRs and launch metadata of one kernel under ``dump_dir``."""
  digest = _cache.content_key({"irs": {k: repr(v) for k, v in irs.items()}})
  folder = os.path.join(dump_dir, f"{compiled.name}-{digest[:12]}")
  os.makedirs(folder, exist_ok=True)
  extension = {"source": "source.ttir", "amdgcn": "amdgcn"}
  for stage, content in irs.items():
    path = os.path.join(folder, f"{compiled.name}.{extension.get(stage, stage)}")
    with open(path, "wb") as f:
      f.write(content if isinstance(content, bytes) else content.encode())
  launch_metadata = {
      **compiled.metadata(), "target": target.describe(),
      "grid": list(launch.grid), "num_stages": launch.config.num_stages,
      "config": launch.config.label, "zeroed_outputs": list(launch.zeroed_outputs),
  }
  del launch_metadata["ttir"]
  with open(os.path.join(folder, f"{compiled.name}.json"), "w") as f:
    json.dump(launch_metadata, f, indent=2, sort_keys=True)


class SharedMemoryError(ValueError):
  """A compiled kernel needs more shared memory than its GPU has."""


def compiled_kernel(spec, launch, target: _target.Target,
                    object_file: bool | None = None
                    ) -> tuple[CompiledKernel, _specialize.Specialization]:
  """The compiled kernel of ``launch``, from the caches or from Triton
  (``debug=True`` and ``JT_DIST_DUMP_DIR`` bypass the caches, so the IRs are
  printed or dumped); ``object_file`` (a CUBIN too): where jaxlib loads one
  by default."""
  if object_file is None:
    object_file = (target.platform == "cuda"
                   and _compat.jaxlib_takes_module_image())
  backend = _compat.make_backend(target.triton_target)
  config = launch.config
  # backend_options first: a config's own maxnreg is more specific.
  options = backend.parse_options({
      **dict(spec.backend_options), "num_warps": config.num_warps,
      "num_stages": config.num_stages, "num_ctas": config.num_ctas,
      "enable_fp_fusion": spec.enable_fp_fusion, "debug": spec.debug,
      **({} if config.maxnreg is None else {"maxnreg": config.maxnreg})})
  # parse_options drops unknown names silently: refuse misspelt ones.
  known = {f.name for f in dataclasses.fields(options)}
  if unknown := sorted(k for k, _ in spec.backend_options if k not in known):
    raise ValueError(
        f"triton_call: backend_options {unknown} are not options of Triton's"
        f" {target.platform} backend ({type(options).__name__}, Triton"
        f" {_compat.triton.__version__}). Known options:"
        f" {', '.join(sorted(known))}.")
  spec_ = _specialize.specialize(spec, launch, backend)
  jit_fn = _compat.jit_function_of(spec.info.fn)

  def create():
    compiled = _run_triton(spec, launch, target, backend, options, spec_,
                           jit_fn, object_file)
    return (compiled, *compiled.to_entry())

  compiled = _cache.get_or_create(
      cache_key(jit_fn, spec_, options, backend, target, object_file),
      create, CompiledKernel.from_entry,
      use_cached=not (spec.debug or _settings.dump_dir()))
  limit = _target.shared_memory_limit(target)
  if limit is not None and compiled.shared_mem > limit:
    raise SharedMemoryError(
        f"triton_call: kernel {compiled.name!r} (config:"
        f" {config.label}) needs {compiled.shared_mem} bytes of shared"
        f" memory, more than the {limit} bytes a block may use on"
        f" {target.describe()}. Use smaller blocks or fewer pipeline stages"
        " (num_stages).")
  return compiled, spec_
