"""Fused row softmax: one program per row, the row held in registers.

The block is the row length rounded up to a power of two, passed as a
constexpr; nothing in the kernel depends on the array's size.

    python examples/softmax.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, n_cols, x_row_stride, out_row_stride, out_ptr,
                   BLOCK: tl.constexpr):
  row = tl.program_id(0)
  cols = tl.arange(0, BLOCK)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask,
              other=-float("inf")).to(tl.float32)
  x = x - tl.max(x, axis=0)
  numerator = tl.exp(x)
  y = numerator / tl.sum(numerator, axis=0)
  tl.store(out_ptr + row * out_row_stride + cols,
           y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: jax.Array) -> jax.Array:
  """Softmax over the last axis of a 2-D array."""
  n_rows, n_cols = x.shape
  return jt_dist.triton_call(
      x, n_cols, n_cols, n_cols,
      kernel=softmax_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(n_rows,),
      BLOCK=triton.next_power_of_2(n_cols))


def main(n_rows=None, n_cols=None, seed=0):
  on_cpu = jax.default_backend() == "cpu"
  n_rows = n_rows or (16 if on_cpu else 4096)
  n_cols = n_cols or (100 if on_cpu else 1000)
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((n_rows, n_cols), dtype=np.float32) * 4
  out = jax.jit(softmax)(jnp.asarray(x))
  e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
  expected = e / e.sum(axis=1, keepdims=True)
  error = float(np.max(np.abs(np.asarray(out) - expected)))
  where = "Triton's interpreter" if on_cpu else "a compiled Triton kernel"
  print(f"softmax of a {n_rows}x{n_cols} float32 array on {out.devices()}"
        f" ({where}): max |error| vs NumPy = {error:.3g}")
  assert error < 1e-6, error
  return error


if __name__ == "__main__":
  main()
