"""The ``triton_call`` primitive: abstract evaluation, transformations, impl.

Lowerings are registered per platform by ``_registration``; this module only
defines the primitive and its platform-independent rules.
"""

from __future__ import annotations

import jax
from jax.extend import core as jex_core
from jax.interpreters import ad
from jax.interpreters import batching

from jt_dist._vmap import batching as _batching
from jt_dist import _compat
from jt_dist._cpu import lowering as _cpu_lowering
from jt_dist._gpu import faults as _gpu_faults

triton_call_p = jex_core.Primitive("jt_dist_triton_call")
triton_call_p.multiple_results = True


def _abstract_eval(*in_avals, spec):
  outs = _compat.output_avals(in_avals, spec.out_shapes)
  if spec.has_side_effect:
    return outs, {_compat.kernel_side_effect()}
  return outs, jex_core.no_effects


triton_call_p.def_effectful_abstract_eval(_abstract_eval)

# jax never drops a kernel call, as jax-triton 0.4 does not: a kernel may
# write through a pointer jax cannot see. XLA still removes an unused call
# unless it is marked has_side_effect=True (a device print, a pointer it
# computes), which also keeps it inside nested jaxprs (an effect).
_compat.register_dce_rule(triton_call_p, lambda eqn: True)


def _impl(*args, spec):
  # Reached when the primitive is bound eagerly outside triton_call's fast
  # path (jt_dist._call.dispatch), e.g. by a transformation's rule: one bounded
  # cache of jitted callables serves both. (call_cache imports this module.)
  from jt_dist._core import call_cache as _call_cache  # pylint: disable=g-import-not-at-top
  try:
    return _gpu_faults.wait_if_synced(_call_cache.executable(spec)(*args))
  except Exception as e:  # pylint: disable=broad-except
    # On the CPU, give the caller the kernel's own exception (e.g.
    # OutOfBoundsAccessError), not jax's wrapping of it (a JaxRuntimeError,
    # or a ValueError for some callbacks). On a GPU, name the kernel behind
    # an illegal address or failed launch.
    _cpu_lowering.raise_host_fault(e)
    if _gpu_faults.is_device_fault(e):
      raise _gpu_faults.launch_fault(e, spec) from e
    raise


triton_call_p.def_impl(_impl)


def _refuse_jvp(primals, tangents, *, spec):
  del primals, tangents
  raise NotImplementedError(
      f"triton_call: kernel {spec.info.name!r} cannot be differentiated"
      " automatically: JAX cannot see inside a Triton kernel. Wrap the call"
      " in a function decorated with jax.custom_vjp (or jax.custom_jvp) and"
      " write its backward pass, with another triton_call if you like."
  )


ad.primitive_jvps[triton_call_p] = _refuse_jvp


def _batch(args, dims, *, spec):
  return _batching.batch_rule(triton_call_p.bind, args, dims, spec)


batching.primitive_batchers[triton_call_p] = _batch
