"""Triton kernels shared by the feature tests (jax-triton 0.4's features).

``tests/features_vmap_test.py``, ``tests_multigpu/features_matrix_test.py``
and ``tests/cuda_lowering_test.py`` call them in different contexts (vmap,
a mesh, a rule, cross-lowering), so each is written once here.
"""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def copy_kernel(in_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(in_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def acc_sum_kernel(x_ptr, acc_ptr, n, total_ptr, BLOCK: tl.constexpr):
  # 0.4's convention: acc_ptr is output 0's buffer (acc += x); total_ptr is
  # output 1, which must start at zero (total += sum(x)).
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
  tl.store(acc_ptr + offsets, tl.load(acc_ptr + offsets, mask=mask) + x,
           mask=mask)
  tl.atomic_add(total_ptr, tl.sum(x, axis=0))


@triton.jit
def wide_scale_kernel(x_ptr, big, small, scale, n, out_ptr,
                      BLOCK: tl.constexpr):
  # big and small lie beyond float32's range: right only if both arrive as
  # doubles; scale arrives as a float32.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask).to(tl.float64)
  tl.store(out_ptr + offsets, (x * big * small).to(tl.float32) * scale,
           mask=mask)


@triton.jit
def desc_copy_kernel(in_desc, out_ptr, M: tl.constexpr, N: tl.constexpr):
  block = in_desc.load([0, 0])
  offsets = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
  tl.store(out_ptr + offsets, block)


@triton.jit
def tuple_add_kernel(x_ptr, yz, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(yz[0] + offsets, mask=mask)
           + tl.load(yz[1] + offsets, mask=mask), mask=mask)


@triton.jit
def maybe_bias_kernel(x_ptr, bias_ptr, n, out_ptr, scale,
                      BLOCK: tl.constexpr):
  # bias_ptr and scale may be None (compile-time constants): Triton then
  # compiles their branches away.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  if bias_ptr is not None:
    x += tl.load(bias_ptr + offsets, mask=mask)
  if scale is not None:
    x *= scale
  tl.store(out_ptr + offsets, x, mask=mask)
