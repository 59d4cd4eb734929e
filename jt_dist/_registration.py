"""Registers the primitive's lowering for each platform with JAX."""

from __future__ import annotations

from jax.interpreters import mlir

from jt_dist import _interpret
from jt_dist import _primitive

mlir.register_lowering(
    _primitive.triton_call_p, _interpret.cpu_lowering, platform="cpu"
)
