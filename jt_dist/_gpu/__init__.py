"""The GPU platform: Triton compilation, target choice, caches and jaxlib's custom call."""
