"""Triton kernels shared by the test suites.

A kernel that more than one test module calls is written once, here: the
suites call the same kernels in different contexts (eagerly, under jit and
vmap, on a mesh, by a sharding rule, cross-lowered for CUDA or ROCm).
Kernels that one test module needs for its own subject stay in that module.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def double_and_shift_kernel(x_ptr, n, doubled_ptr, shifted_ptr,
                            BLOCK: tl.constexpr):
  """Two outputs: doubled = 2 * x, shifted = x + 1."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(doubled_ptr + offsets, x * 2, mask=mask)
  tl.store(shifted_ptr + offsets, x + 1, mask=mask)


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
def desc_double_kernel(in_desc, out_desc, BM: tl.constexpr):
  """Program i doubles rows ``i * BM`` on, reading and writing by descriptor."""
  row = tl.program_id(0) * BM
  out_desc.store([row, 0], in_desc.load([row, 0]) * 2)


@triton.jit
def desc_double_in_place_kernel(desc, BM: tl.constexpr):
  row = tl.program_id(0) * BM
  desc.store([row, 0], desc.load([row, 0]) * 2)


@triton.jit
def rows_to_desc_kernel(x_ptr, out_desc, N: tl.constexpr, BM: tl.constexpr):
  """Program i doubles rows ``i * BM`` on, stored by descriptor."""
  rows = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
  block = tl.load(x_ptr + rows * N + tl.arange(0, N)[None, :])
  out_desc.store([tl.program_id(0) * BM, 0], block * 2)


@triton.jit
def tuple_add_kernel(x_ptr, yz, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(yz[0] + offsets, mask=mask)
           + tl.load(yz[1] + offsets, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride,
                   n_rows, n_cols, BLOCK_SIZE: tl.constexpr):
  # Triton's fused-softmax tutorial's signature: the output comes first.
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_cols
  x = tl.load(input_ptr + row * input_row_stride + offsets, mask=mask,
              other=-float("inf"))
  x = tl.exp(x - tl.max(x, axis=0))
  tl.store(output_ptr + row * output_row_stride + offsets,
           x / tl.sum(x, axis=0), mask=mask)


@triton.jit
def layer_norm_kernel(X, Y, W, B, Mean, Rstd, stride, N, eps,
                      BLOCK_SIZE: tl.constexpr):
  # Triton's layer-norm tutorial's signature: outputs between the inputs.
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK_SIZE)
  mask = cols < N
  x = tl.load(X + row * stride + cols, mask=mask, other=0.0)
  mean = tl.sum(x, axis=0) / N
  centred = tl.where(mask, x - mean, 0.0)
  rstd = 1 / tl.sqrt(tl.sum(centred * centred, axis=0) / N + eps)
  w = tl.load(W + cols, mask=mask)
  b = tl.load(B + cols, mask=mask)
  tl.store(Y + row * stride + cols, centred * rstd * w + b, mask=mask)
  tl.store(Mean + row, mean)
  tl.store(Rstd + row, rstd)


@triton.jit
def add_out_first_kernel(out_ptr, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
           + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def sum_out_first_kernel(total_ptr, x_ptr, acc_ptr, n, BLOCK: tl.constexpr):
  # total += sum(x) (total must start at zero); acc += x, in place.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
  tl.store(acc_ptr + offsets, tl.load(acc_ptr + offsets, mask=mask) + x,
           mask=mask)
  tl.atomic_add(total_ptr, tl.sum(x, axis=0))


@triton.jit
def unmasked_copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  # No mask: faults if it ever runs on an output shorter than BLOCK.
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


@triton.jit
def scale_kernel(x_ptr, alpha, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * alpha,
           mask=mask)


@triton.jit
def scale_negate_kernel(x_ptr, alpha, negate, n, out_ptr,
                        BLOCK: tl.constexpr):
  # out = -alpha * x if negate else alpha * x: a float and a bool scalar.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask) * alpha
  if negate:
    x = -x
  tl.store(out_ptr + offsets, x, mask=mask)


@triton.jit
def nested_tuple_kernel(scale, ab_c, out_ptr, BLOCK: tl.constexpr):
  # out = scale * a + shift + c, with ab_c = ((a, shift), c).
  ab = ab_c[0]
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, scale * tl.load(ab[0] + offsets) + ab[1]
           + tl.load(ab_c[1] + offsets))


@triton.jit
def tuple_inplace_kernel(xy, n, BLOCK: tl.constexpr):
  # y += x, in place.
  offsets = tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(xy[1] + offsets, tl.load(xy[1] + offsets, mask=mask)
           + tl.load(xy[0] + offsets, mask=mask), mask=mask)


@gluon.jit
def gluon_copy_kernel(in_ptr, out_ptr, size: gl.constexpr,
                      block: gl.constexpr):
  start = gl.program_id(0) * block
  for i in range(start, min(start + block, size)):
    gl.store(out_ptr + i, gl.load(in_ptr + i))


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  keep = tl.rand(seed, offsets) > p
  tl.store(out_ptr + offsets, tl.where(keep, x / (1 - p), 0.0), mask=mask)


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
