"""Pytest start-up: 8 virtual CPU devices, set before JAX initialises.

Where JAX's ROCm plugin is installed without ROCm, a stub HIP runtime is
loaded first (tests/hip_stub.py), so that jaxlib's ROCm Triton bindings
import and tests/rocm_lowering_test.py can cross-lower for AMD GPUs.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "tests"))
import hip_stub  # pylint: disable=g-import-not-at-top,wrong-import-position

hip_stub.load_if_needed()

from jt_dist import testing  # pylint: disable=g-import-not-at-top,wrong-import-position

testing.configure_cpu_devices()
