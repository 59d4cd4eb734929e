"""Triton's compiler stages (GPU lowering), as Triton 3.6 to 3.9 call them."""

from __future__ import annotations

import re
from typing import Any

import triton

from jt_dist._compat.triton_api import LANGUAGE_LOCK


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
  return dict(libtriton.get_cache_invalidating_env_vars())


def ast_to_ttir(jit_fn, backend, target, options, signature, constexprs,
                attrs):
  """The TTIR module of ``jit_fn`` and its context, which must outlive it."""
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
      if (missing := missing_gluon_api(jit_fn, e)) is not None:
        raise missing from e
      if (note := static_assert_note(e)) is not None:
        e.add_note(note)
      raise
  return module, context


def static_assert_note(error: Exception) -> str | None:
  """Names the failing ``tl.static_assert`` behind ``error``, or None:
  Triton 3.6-3.9 report one in a callee at the kernel's line."""
  from triton.compiler import errors  # pylint: disable=g-import-not-at-top
  inner = error
  while inner.__cause__ is not None:
    inner = inner.__cause__
  if inner is error or not isinstance(inner,
                                      errors.CompileTimeAssertionFailure):
    return None
  src = getattr(inner, "src", None) or ""
  lineno = getattr(getattr(inner, "node", None), "lineno", 0)
  lines = src.splitlines()
  source = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
  name = re.search(r"def\s+(\w+)", src)
  message = getattr(inner, "error_message", None) or "(no message)"
  return (f"jt_dist: tl.static_assert failed in"
          f" {name[1] if name else 'a function the kernel calls'}, line"
          f" {lineno} of its source (`{source}`): {message}")


def missing_gluon_api(fn: Any, error: Exception):
  """A clear error for a Gluon kernel using what this Triton lacks, or None
  (an AttributeError on a gluon module where Triton 3.6 hashes the kernel,
  or a CompilationError quoting one from generating IR)."""
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
  """Whether ``fn`` is a Gluon kernel: ``JITFunction.is_gluon()`` (3.6-3.9)."""
  marker = getattr(fn, "is_gluon", None)
  try:
    return bool(marker()) if callable(marker) else False
  except Exception:  # pylint: disable=broad-except
    return False


def compiler_stages(backend, target, options, gluon: bool):
  """Triton's ordered stages after source, and their starting metadata:
  ``triton.compile`` without launcher, file cache or driver. The metadata
  holds every option (the HIP LLIR stage reads ``num_ctas`` there, Triton
  3.6 to 3.9)."""
  from triton.backends import compiler as backend_compiler  # pylint: disable=g-import-not-at-top
  metadata = {"target": target, **options.__dict__}
  stages: dict[str, Any] = {}
  language = backend_compiler.Language
  backend.add_stages(stages, options,
                     language.GLUON if gluon else language.TRITON)
  return stages, metadata


def pointer_divisibility_attr(backend) -> Any:
  """The per-parameter attribute saying a pointer is 16-byte aligned."""
  return backend.parse_attr("D")


def loaded_registers(name: str, binary: bytes, shared: int, device: int):
  """``(n_regs, n_spills)`` of a kernel binary (a CUBIN or an HSACO) loaded
  by Triton's driver on GPU ``device``, as ``CompiledKernel._init_handles``
  reads them in Triton 3.6 to 3.9; ``(None, None)`` without a driver."""
  try:
    from triton.runtime import driver  # pylint: disable=g-import-not-at-top
    loaded = driver.active.utils.load_binary(name, binary, shared, device)
  except Exception:  # pylint: disable=broad-except
    # No GPU driver Triton can use here (e.g. only jaxlib's plugin).
    return None, None
  return int(loaded[2]), int(loaded[3])
