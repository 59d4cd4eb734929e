"""The compiled-kernel cache and the GPU target: below the GPU lowering and autotuning."""
