"""The CPU platform: kernels run through Triton's interpreter in a host callback."""
