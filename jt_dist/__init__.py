"""jt_dist: sharding-aware Triton kernels inside JAX programs.

``triton_call`` runs a ``@triton.jit`` kernel on ``jax.Array``s (on GPUs
through jaxlib's Triton custom call, on the CPU through Triton's
interpreter), after checking where its inputs live.
``sharded_triton_call`` runs it once per shard of a device mesh.
"""

# jax first, so that on a host without GPUs the CUDA plugin's start-up lines
# are dropped (see _jax_import); every module below imports jax.
from jt_dist import _jax_import

_jax_import.import_jax()

# pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import registration as _registration  # noqa: F401  (registers the lowerings)
from jt_dist._call.api import triton_call
from jt_dist._autotune.api import AutotuneChoice
from jt_dist._autotune.api import autotune_choices
from jt_dist._autotune.api import configure_autotune
from jt_dist._autotune.api import forget_autotune_choices
from jt_dist._autotune.api import pin_autotune_config
from jt_dist._tools.export import ExportedKernelCall
from jt_dist._tools.export import check_exported
from jt_dist._tools.export import export_options
from jt_dist._tools.export import export_safety_checks
from jt_dist._tools.export import exported_versions
from jt_dist._call.dispatch import configure_cache
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
from jt_dist._sharding.shard_size import ShardSize
from jt_dist._sharding.shard_size import shard_size
from jt_dist._call.sharded import sharded_triton_call
from jt_dist._gpu.lowering import CUSTOM_CALL_TARGET_NAME
from jt_dist._call.tensordesc import TensorDescriptor
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
    "DevicePlacementError",
    "ExportError",
    "ExportedKernelCall",
    "KernelAssertionError",
    "KernelBindingError",
    "KernelLaunchError",
    "KernelTypeError",
    "OutOfBoundsAccessError",
    "ShardSize",
    "ShardingRule",
    "ShardingSpecError",
    "TensorDescriptor",
    "UnwrittenOutputReadError",
    "__version__",
    "autotune_choices",
    "cdiv",
    "check_exported",
    "configure_autotune",
    "configure_cache",
    "export_options",
    "export_safety_checks",
    "exported_versions",
    "forget_autotune_choices",
    "get_compute_capability",
    "next_power_of_2",
    "pin_autotune_config",
    "shard_size",
    "sharded_triton_call",
    "strides_from_shape",
    "triton_call",
]
