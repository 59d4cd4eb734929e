"""The ``triton_call`` primitive and its platform-free rules.

``jt_dist._cpu``, ``_gpu`` and ``_vmap`` register their own rules on it.
"""

from jax.extend import core as jex_core
from jax.interpreters import ad

from jt_dist import _compat
from jt_dist._core import host_faults as _host_faults

triton_call_p = jex_core.Primitive("jt_dist_triton_call")
triton_call_p.multiple_results = True


def _abstract_eval(*in_avals, spec):
  outs = _compat.output_avals(in_avals, spec.out_shapes)
  if spec.has_side_effect:
    return outs, {_compat.kernel_side_effect()}
  return outs, jex_core.no_effects


triton_call_p.def_effectful_abstract_eval(_abstract_eval)

# jax never drops a kernel call (as jax-triton 0.4): a kernel may write
# through a pointer jax cannot see. XLA still removes an unused call unless
# has_side_effect=True, which also keeps it in nested jaxprs (an effect).
_compat.register_dce_rule(triton_call_p, lambda eqn: True)

_apply_primitive = _compat.primitive_impl(triton_call_p)


def _impl(*args, spec):
  """Bound outside a trace: jax's dispatch, a kernel's error raised as is."""
  try:
    return _apply_primitive(*args, spec=spec)
  except KeyboardInterrupt:
    _host_faults.abandon_launches()
    raise
  except Exception as e:  # pylint: disable=broad-except
    _host_faults.raise_original(e)
    raise


triton_call_p.def_impl(_impl)


def _refuse_jvp(primals, tangents, *, spec):
  del primals, tangents
  raise NotImplementedError(
      f"triton_call: kernel {spec.info.name!r} cannot be differentiated"
      " automatically: JAX cannot see inside a Triton kernel. Wrap the call"
      " in a function decorated with jax.custom_vjp (or jax.custom_jvp) and"
      " write its backward pass, with another triton_call if you like.")


ad.primitive_jvps[triton_call_p] = _refuse_jvp
