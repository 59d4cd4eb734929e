"""Which of the interpreter's builder methods run right over all programs.

A method that broadcasts over the leading program axis runs unchanged; one
naming, looping over or acting once for the first axis would mix programs.
Only the methods listed, each read for this, run as upstream wrote them;
every other, a later Triton's included, refuses (``Unsupported``).
"""

from __future__ import annotations

import inspect


class Unsupported(Exception):
  """A vectorised launch met an operation it cannot run for all programs."""


# Shared or elementwise methods, those calling only redefined ones (loads,
# stores) and ``tl.dot`` (matmul batches the program axis). Left off:
# printing, polling, scaled dots, descriptor gathers (they loop on axis 0).
REVIEWED = frozenset("""
    set_grid_dim get_cache_policy get_ptr_ty get_block_ty get_half_ty
    get_bf16_ty get_float_ty get_double_ty get_int1_ty get_int8_ty get_uint8_ty
    get_int16_ty get_uint16_ty get_int32_ty get_uint32_ty get_int64_ty
    get_uint64_ty get_fp8e4nv_ty get_fp8e4b15_ty get_fp8e4b8_ty get_fp8e5_ty
    get_fp8e5b16_ty get_int1 get_uint8 get_int8 get_uint16 get_int16 get_uint32
    get_int32 get_uint64 get_int64 get_fp16 get_bf16 get_fp32 get_fp64
    get_null_value get_all_ones_value create_get_num_programs create_load
    create_store cast_impl create_si_to_fp create_ui_to_fp create_fp_to_si
    create_fp_to_ui create_fp_ext create_fp_trunc create_int_cast
    create_fp_to_fp create_bitcast create_int_to_ptr create_ptr_to_int
    binary_op create_fadd create_fmul create_fdiv create_frem create_fsub
    create_mul create_precise_divf create_approx_divf create_sdiv create_udiv
    create_idiv create_srem create_urem create_add create_sub create_shl
    create_lshr create_ashr create_umulhi create_minsi create_minui
    create_minimumf create_minnumf create_maxsi create_maxui create_maximumf
    create_maxnumf create_icmpSLE create_icmpSLT create_icmpSGE create_icmpSGT
    create_icmpULE create_icmpULT create_icmpUGE create_icmpUGT create_icmpEQ
    create_icmpNE create_fcmpOLT create_fcmpOGT create_fcmpOLE create_fcmpOGE
    create_fcmpOEQ create_fcmpONE create_fcmpULT create_fcmpUGT create_fcmpULE
    create_fcmpUGE create_fcmpUEQ create_fcmpUNE create_and create_xor
    create_or ternary_op create_clampf create_select create_fma unary_op
    create_fneg create_fabs create_cos create_exp create_exp2 create_iabs
    create_floor create_ceil create_log create_log2 create_precise_sqrt
    create_sqrt create_sin create_erf create_rsqrt create_split create_dot
    create_atomic_load create_atomic_store create_descriptor_load
    create_descriptor_store create_tensor_pointer_load
    create_tensor_pointer_store create_barrier
""".split())


def _refusal(name: str):
  def refuse(*_, **__):
    raise Unsupported(f"{name} is not reviewed for a leading program axis"
                      " (vector_reviewed.REVIEWED)")
  refuse.__name__ = refuse.__qualname__ = name
  return refuse


def refuse_unreviewed(cls, base) -> list[str]:
  """Makes ``cls`` refuse ``base``'s unreviewed methods it keeps: names."""
  own = [c for c in cls.__mro__ if c not in base.__mro__]
  refused = [name for name, value in inspect.getmembers(base)
             if not (name.startswith("_") or name in REVIEWED
                     or not callable(value)
                     or any(name in vars(c) for c in own))]
  for name in refused:
    setattr(cls, name, _refusal(name))
  return refused
