"""One small ``@triton.jit`` function per ``tl`` operation that takes floats.

``tests/narrow_floats_test.py`` passes each, as the constexpr ``OP``, to
``float_op_kernel``, which loads three ``BLOCK`` x ``BLOCK`` blocks per
program, applies ``OP(x, y, z, cols)`` and stores the result as float32
broadcast to the block. Reductions keep the reduced axis (length 1).
"""

import triton
import triton.language as tl


@triton.jit
def float_op_kernel(x_ptr, y_ptr, z_ptr, out_ptr, OP: tl.constexpr,
                    BLOCK: tl.constexpr, TAG: tl.constexpr):
  # TAG only makes each test's launches a kernel signature of their own, so
  # that the interpreter logs how it ran them.
  cols = tl.arange(0, BLOCK)[None, :]
  offsets = (tl.program_id(0) * BLOCK * BLOCK
             + tl.arange(0, BLOCK)[:, None] * BLOCK + cols)
  x = tl.load(x_ptr + offsets)
  y = tl.load(y_ptr + offsets)
  z = tl.load(z_ptr + offsets)
  result = OP(x, y, z, cols)
  tl.store(out_ptr + offsets,
           tl.zeros((BLOCK, BLOCK), tl.float32) + result.to(tl.float32))


@triton.jit
def print_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  x = tl.load(x_ptr + tl.arange(0, BLOCK))
  tl.device_print("x", x)
  tl.store(out_ptr + tl.arange(0, BLOCK), x)


@triton.jit
def _plus(a, b):
  return a + b


@triton.jit
def _larger(a, b):
  return tl.maximum(a, b)


# --- elementwise -------------------------------------------------------------

@triton.jit
def add(x, y, z, cols):
  return x + y


@triton.jit
def add_scalar(x, y, z, cols):
  return x + 1.5


@triton.jit
def sub(x, y, z, cols):
  return x - y


@triton.jit
def mul(x, y, z, cols):
  return x * y


@triton.jit
def div(x, y, z, cols):
  return x / y


@triton.jit
def mod(x, y, z, cols):
  return x % y


@triton.jit
def fdiv(x, y, z, cols):
  return tl.math.fdiv(x, y)


@triton.jit
def div_rn(x, y, z, cols):
  return tl.math.div_rn(x, y)


@triton.jit
def neg(x, y, z, cols):
  return -x


@triton.jit
def abs_(x, y, z, cols):
  return tl.abs(x)


@triton.jit
def less(x, y, z, cols):
  return x < y


@triton.jit
def equal(x, y, z, cols):
  return x == tl.where(cols % 2 == 0, x, y)


@triton.jit
def maximum(x, y, z, cols):
  return tl.maximum(x, y)


@triton.jit
def minimum(x, y, z, cols):
  return tl.minimum(x, y)


@triton.jit
def maximum_nan(x, y, z, cols):
  return tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum_nan(x, y, z, cols):
  return tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def clamp(x, y, z, cols):
  return tl.clamp(x, y, z)


@triton.jit
def clamp_nan(x, y, z, cols):
  return tl.clamp(x, y, z, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def fma(x, y, z, cols):
  return tl.fma(x, y, z)


@triton.jit
def where(x, y, z, cols):
  return tl.where(cols % 3 == 0, x, y)


@triton.jit
def round_trip(x, y, z, cols):
  return (x.to(tl.float32) * 3.0).to(x.dtype)


# --- math functions ----------------------------------------------------------

@triton.jit
def exp(x, y, z, cols):
  return tl.exp(x)


@triton.jit
def exp2(x, y, z, cols):
  return tl.exp2(x)


@triton.jit
def log(x, y, z, cols):
  return tl.log(x)


@triton.jit
def log2(x, y, z, cols):
  return tl.log2(x)


@triton.jit
def sin(x, y, z, cols):
  return tl.sin(x)


@triton.jit
def cos(x, y, z, cols):
  return tl.cos(x)


@triton.jit
def sqrt(x, y, z, cols):
  return tl.sqrt(x)


@triton.jit
def sqrt_rn(x, y, z, cols):
  return tl.sqrt_rn(x)


@triton.jit
def rsqrt(x, y, z, cols):
  return tl.rsqrt(x)


@triton.jit
def erf(x, y, z, cols):
  return tl.erf(x)


@triton.jit
def floor(x, y, z, cols):
  return tl.floor(x)


@triton.jit
def ceil(x, y, z, cols):
  return tl.ceil(x)


@triton.jit
def sigmoid(x, y, z, cols):
  return tl.sigmoid(x)


@triton.jit
def softmax(x, y, z, cols):
  return tl.softmax(x)


# --- reductions --------------------------------------------------------------

@triton.jit
def sum_(x, y, z, cols):
  return tl.sum(x, 1, keep_dims=True)


@triton.jit
def sum_all(x, y, z, cols):
  return tl.sum(x)


@triton.jit
def sum_float32(x, y, z, cols):
  return tl.sum(x, 1, keep_dims=True, dtype=tl.float32)


@triton.jit
def max_(x, y, z, cols):
  return tl.max(x, 1, keep_dims=True)


@triton.jit
def min_(x, y, z, cols):
  return tl.min(x, 1, keep_dims=True)


@triton.jit
def max_with_index(x, y, z, cols):
  value, index = tl.max(x, 1, return_indices=True, keep_dims=True)
  return tl.where(cols == 0, value.to(tl.float32), index.to(tl.float32))


@triton.jit
def min_with_index(x, y, z, cols):
  value, index = tl.min(x, 1, return_indices=True, keep_dims=True)
  return tl.where(cols == 0, value.to(tl.float32), index.to(tl.float32))


@triton.jit
def argmax(x, y, z, cols):
  return tl.argmax(x, 1, keep_dims=True)


@triton.jit
def argmin(x, y, z, cols):
  return tl.argmin(x, 1, keep_dims=True)


@triton.jit
def reduce_add(x, y, z, cols):
  return tl.reduce(x, 1, _plus, keep_dims=True)


@triton.jit
def reduce_max(x, y, z, cols):
  return tl.reduce(x, 1, _larger, keep_dims=True)


# --- scans -------------------------------------------------------------------

@triton.jit
def cumsum(x, y, z, cols):
  return tl.cumsum(x, 1)


@triton.jit
def cumsum_reverse(x, y, z, cols):
  return tl.cumsum(x, 1, reverse=True)


@triton.jit
def cumprod(x, y, z, cols):
  return tl.cumprod(x, 1)


@triton.jit
def scan_add(x, y, z, cols):
  return tl.associative_scan(x, 1, _plus)


# --- moves and products ------------------------------------------------------

@triton.jit
def sort(x, y, z, cols):
  return tl.sort(x, 1)


@triton.jit
def flip(x, y, z, cols):
  return tl.flip(x, 1)


@triton.jit
def trans(x, y, z, cols):
  return tl.trans(x)


@triton.jit
def join_split(x, y, z, cols):
  first, second = tl.split(tl.join(x, y))
  return tl.where(cols % 2 == 0, first, second)


@triton.jit
def permute(x, y, z, cols):
  blocks = tl.reshape(x, (4, x.shape[0] // 4, x.shape[1]))
  return tl.reshape(tl.permute(blocks, (1, 0, 2)), x.shape)


@triton.jit
def gather(x, y, z, cols):
  index = tl.broadcast_to((cols * 5) % x.shape[1], x.shape)
  return tl.gather(x, index, 1)


@triton.jit
def dot(x, y, z, cols):
  return tl.dot(x, y)
