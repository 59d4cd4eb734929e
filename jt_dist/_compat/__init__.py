"""Every jax-, jaxlib- and Triton-version difference jt_dist depends on.

Supporting a new release means editing this package alone (and
``jt_dist._cpu.interpreter``). Nothing runs at import beyond reading
versions and importing classes. The rest of jt_dist, and the tests'
``mock.patch.object(_compat, ...)``, use the names re-exported here, never
the modules behind them (CONTRIBUTING.md says which holds what).
"""

import triton

from jt_dist._compat.jax_api import at_top_level
from jt_dist._compat.jax_api import distributed_client
from jt_dist._compat.jax_api import host_buffer_callback
from jt_dist._compat.jax_api import is_auto_axis
from jt_dist._compat.jax_api import is_ref_view
from jt_dist._compat.jax_api import jit_cache_context
from jt_dist._compat.jax_api import kernel_side_effect
from jt_dist._compat.jax_api import lowering_axis_facts
from jt_dist._compat.jax_api import lowering_for_export
from jt_dist._compat.jax_api import mark_requires_devices
from jt_dist._compat.jax_api import mesh_devices
from jt_dist._compat.jax_api import mesh_platform
from jt_dist._compat.jax_api import output_avals
from jt_dist._compat.jax_api import platform_version
from jt_dist._compat.jax_api import primitive_impl
from jt_dist._compat.jax_api import register_dce_rule
from jt_dist._compat.jax_api import varying_axes
from jt_dist._compat.jaxlib_triton import check_tf32_descriptor
from jt_dist._compat.jaxlib_triton import descriptor_fallback_flags
from jt_dist._compat.jaxlib_triton import gpu_triton_module
from jt_dist._compat.jaxlib_triton import interpreter_descriptor
from jt_dist._compat.jaxlib_triton import jaxlib_takes_module_image
from jt_dist._compat.jaxlib_triton import jaxlib_version
from jt_dist._compat.jaxlib_triton import make_triton_kernel
from jt_dist._compat.jaxlib_triton import tma_parameter
from jt_dist._compat.jaxlib_triton import triton_ffi_targets
from jt_dist._compat.triton_api import attributes_replaced
from jt_dist._compat.triton_api import Autotuner
from jt_dist._compat.triton_api import Config
from jt_dist._compat.triton_api import Heuristics
from jt_dist._compat.triton_api import InterpreterError
from jt_dist._compat.triton_api import is_interpreted
from jt_dist._compat.triton_api import is_triton_function
from jt_dist._compat.triton_api import jit_function_for
from jt_dist._compat.triton_api import jit_function_of
from jt_dist._compat.triton_api import JITFunction
from jt_dist._compat.triton_api import LANGUAGE_LOCK
from jt_dist._compat.triton_api import print_autotuning
from jt_dist._compat.triton_api import tensor_descriptor_class
from jt_dist._compat.triton_api import triton_launcher_scalar_type
from jt_dist._compat.triton_compiler import loaded_registers
from jt_dist._compat.triton_compiler import ast_to_ttir
from jt_dist._compat.triton_compiler import backend_hash
from jt_dist._compat.triton_compiler import cache_invalidating_env_vars
from jt_dist._compat.triton_compiler import compiler_stages
from jt_dist._compat.triton_compiler import gpu_target
from jt_dist._compat.triton_compiler import is_gluon
from jt_dist._compat.triton_compiler import make_backend
from jt_dist._compat.triton_compiler import missing_gluon_api
from jt_dist._compat.triton_compiler import pointer_divisibility_attr
