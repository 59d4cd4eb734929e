"""Triton's code generator as the judge of what the CPU runs.

Before a kernel's specialization first runs on the CPU, Triton's own code
generator lowers it to TTIR for a CUDA GPU (the call's
``compute_capability``, else Hopper's), which needs no GPU. What it refuses
(a list comprehension, a global that is not a ``tl.constexpr``, a name
assigned only inside a loop and read after it, a dtype called as a
function, ``del``), the CPU refuses with Triton's own error, as every GPU
would. Refusals of operand types or of one target's features are left to
the interpreter's own checks, which name the program and the operation. A
verdict is kept in the compile cache's memory for the process.
"""

from __future__ import annotations

import functools

from jt_dist import _compat
from jt_dist._backend import cache as _cache
from jt_dist._backend import specialize as _specialize
from jt_dist._core import wrapper as _wrapper

# What a CPU launch is judged as where the call names no GPU.
DEFAULT_CAPABILITY = 90


@functools.lru_cache(maxsize=None)
def _backend(capability: int):
  target = _compat.gpu_target("cuda", capability, 32)
  return target, _compat.make_backend(target)


def check(spec, shapes) -> None:
  """Raises Triton's compile error for a launch of ``spec`` that a GPU
  would refuse; ``shapes``: the operands' shapes, for the error."""
  if _compat.is_interpreted(spec.info.fn) or _compat.is_gluon(spec.info.fn):
    return  # Interpreted on GPUs too; Gluon is refused on the CPU first.
  capability = spec.compute_capability or DEFAULT_CAPABILITY
  target, backend = _backend(capability)
  jit_fn = _compat.jit_function_of(spec.info.fn)
  for launch in spec.launches:
    specialization = _specialize.specialize(spec, launch, backend)
    config = launch.config
    options = backend.parse_options({
        "num_warps": config.num_warps, "num_stages": config.num_stages,
        "debug": spec.debug, "enable_fp_fusion": spec.enable_fp_fusion})
    key = _cache.content_key({
        "frontend": jit_fn.cache_key, "capability": capability,
        "signature": repr(sorted(specialization.signature.items())),
        "constexprs": sorted((k, _specialize.value_key(v))
                             for k, v in specialization.constexprs.items()),
        "options": options.hash(), "triton": _compat.triton.__version__,
        "env": sorted(_compat.cache_invalidating_env_vars().items()),
        # Read when compiling, though Triton's cache key leaves it out.
        "non_constexpr_globals": bool(
            _compat.triton.knobs.compilation.allow_non_constexpr_globals)})
    if key in _cache.memory_cache:
      continue
    try:
      _compat.ast_to_ttir(jit_fn, backend, target, options,
                          specialization.signature,
                          specialization.constexprs, specialization.attrs)
    except Exception as e:  # pylint: disable=broad-except
      if _refused_by_every_gpu(e):
        _wrapper.raise_compile_error(e, spec, shapes)
      # Types and targets: the interpreter's own checks name the program.
    _cache.memory_cache.put(key, True)


def _refused_by_every_gpu(error: BaseException) -> bool:
  """Whether Triton's ``error`` refuses the kernel's Python itself (a
  construct the language lacks, a name it cannot bind, a call of what is no
  function), whatever the GPU; refusals of types or of one target's
  features are left to the interpreter's own checks."""
  from triton.compiler import errors  # pylint: disable=g-import-not-at-top
  while error.__cause__ is not None:
    error = error.__cause__
  if isinstance(error, (NameError, NotImplementedError,
                        errors.UnsupportedLanguageConstruct)):
    return True
  # The code generator keeps only the repr of what it met.
  text = str(getattr(error, "error_message", "") or "")
  return text.startswith(("NameError(", "NotImplementedError(")) or (
      text.startswith("TypeError(") and "object is not callable" in text)
