"""jt_dist: sharding-aware Triton kernels inside JAX programs.

``triton_call`` runs a ``@triton.jit`` kernel on ``jax.Array``s (on GPUs
through jaxlib's Triton custom call, on the CPU through Triton's
interpreter), after checking where its inputs live.
``sharded_triton_call`` runs it once per shard of a device mesh.
"""

# Each platform registers its rules on the primitive when imported.
from jt_dist._cpu import lowering as _cpu_lowering  # noqa: F401
from jt_dist._gpu import lowering as _gpu_lowering  # noqa: F401
from jt_dist._vmap import batching as _batching  # noqa: F401
from jt_dist._call.api import triton_call
from jt_dist._call.boundary import kernel_errors
from jt_dist._call.kernel_call import KernelCall
from jt_dist._call.kernel_call import kernel_call
from jt_dist._call.metadata import KernelMetadata
from jt_dist._call.metadata import kernel_metadata
from jt_dist._autotune.api import AutotuneChoice
from jt_dist._autotune.api import autotune_choices
from jt_dist._autotune.api import forget_autotune_choices
from jt_dist._autotune.api import pin_autotune_config
from jt_dist._tools.export import ExportedKernelCall
from jt_dist._tools.export import check_exported
from jt_dist._tools.export import export_options
from jt_dist._tools.export import export_safety_checks
from jt_dist._tools.export import exported_versions
from jt_dist._settings import configure_autotune
from jt_dist._settings import configure_cache
from jt_dist._errors import AutoAxesError
from jt_dist._errors import AutotuneError
from jt_dist._errors import DevicePlacementError
from jt_dist._errors import ExportError
from jt_dist._errors import KernelAssertionError
from jt_dist._errors import KernelBindingError
from jt_dist._errors import KernelLaunchError
from jt_dist._errors import KernelTypeError
from jt_dist._errors import OutOfBoundsAccessError
from jt_dist._errors import ShardingSpecError
from jt_dist._errors import UnwrittenOutputReadError
from jt_dist._sharding.rule import ShardingRule
from jt_dist._core.placeholders import RuntimeScalar
from jt_dist._core.placeholders import runtime_scalar
from jt_dist._core.placeholders import ShardSize
from jt_dist._core.placeholders import shard_size
from jt_dist._call.sharded import ShardedKernelCall
from jt_dist._call.sharded import sharded_kernel_call
from jt_dist._call.sharded import sharded_triton_call
from jt_dist._call.cache_info import CacheInfo
from jt_dist._call.cache_info import cache_info
from jt_dist._gpu.lowering import CUSTOM_CALL_TARGET_NAME
from jt_dist._core.tensordesc import TensorDescriptor
from jt_dist._call.helpers import cdiv
from jt_dist._call.helpers import get_compute_capability
from jt_dist._call.helpers import next_power_of_2
from jt_dist._call.helpers import strides_from_shape

__version__ = "0.2.0"

__all__ = [
    "AutoAxesError",
    "CUSTOM_CALL_TARGET_NAME",
    "AutotuneChoice",
    "AutotuneError",
    "CacheInfo",
    "DevicePlacementError",
    "ExportError",
    "ExportedKernelCall",
    "KernelCall",
    "KernelMetadata",
    "ShardedKernelCall",
    "KernelAssertionError",
    "KernelBindingError",
    "KernelLaunchError",
    "KernelTypeError",
    "OutOfBoundsAccessError",
    "RuntimeScalar",
    "ShardSize",
    "ShardingRule",
    "ShardingSpecError",
    "TensorDescriptor",
    "UnwrittenOutputReadError",
    "__version__",
    "autotune_choices",
    "cache_info",
    "cdiv",
    "check_exported",
    "configure_autotune",
    "configure_cache",
    "export_options",
    "export_safety_checks",
    "exported_versions",
    "forget_autotune_choices",
    "get_compute_capability",
    "kernel_call",
    "kernel_errors",
    "kernel_metadata",
    "next_power_of_2",
    "pin_autotune_config",
    "runtime_scalar",
    "shard_size",
    "sharded_kernel_call",
    "sharded_triton_call",
    "strides_from_shape",
    "triton_call",
]
