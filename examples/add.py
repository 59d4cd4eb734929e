"""Vector add with ``jt_dist.triton_call``: the smallest complete example.

On a GPU the kernel is compiled by Triton; on a host without GPUs it runs
through Triton's interpreter, with a smaller input so that it takes seconds.

    python examples/add.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


def add(x: jax.Array, y: jax.Array, block: int = 1024) -> jax.Array:
  """Elementwise x + y of two 1-D arrays of one shape and dtype."""
  return jt_dist.triton_call(
      x, y, x.size,
      kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),),
      BLOCK=block)


def main(n=None, seed=0):
  on_cpu = jax.default_backend() == "cpu"
  if n is None:
    n = 10_000 if on_cpu else 1 << 24
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(n, dtype=np.float32)
  y = rng.standard_normal(n, dtype=np.float32)
  out = jax.jit(add, static_argnames="block")(
      jnp.asarray(x), jnp.asarray(y), block=256 if on_cpu else 1024)
  error = float(np.max(np.abs(np.asarray(out) - (x + y))))
  where = "Triton's interpreter" if on_cpu else "a compiled Triton kernel"
  print(f"add of {n} float32 elements on {out.devices()} ({where}):"
        f" max |error| vs NumPy = {error:.3g}")
  assert error == 0.0, error
  return error


if __name__ == "__main__":
  main()
