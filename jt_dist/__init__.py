"""jt_dist: sharding-aware Triton kernels inside JAX programs."""

from jt_dist import _registration  # noqa: F401  (registers the lowerings)
from jt_dist._api import triton_call
from jt_dist._errors import DevicePlacementError
from jt_dist._errors import KernelBindingError
from jt_dist._errors import ShardingSpecError

__version__ = "0.1.0"

__all__ = [
    "DevicePlacementError",
    "KernelBindingError",
    "ShardingSpecError",
    "__version__",
    "triton_call",
]
