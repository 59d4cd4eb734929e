"""Registers the primitive's lowering for each platform with JAX."""

from __future__ import annotations

import functools

from jax.interpreters import mlir

from jt_dist import _compat
from jt_dist import _gpu_lowering
from jt_dist import _interpret
from jt_dist import _primitive

mlir.register_lowering(
    _primitive.triton_call_p, _interpret.cpu_lowering, platform="cpu"
)
for _platform in ("cuda", "rocm"):
  mlir.register_lowering(
      _primitive.triton_call_p,
      functools.partial(_gpu_lowering.gpu_lowering, platform=_platform),
      platform=_platform,
  )
# The GPU target is read from the devices the call is lowered for, which
# JAX names in the lowering context only for primitives that ask for them.
_compat.mark_requires_devices(_primitive.triton_call_p)
