"""Vector add over every local device with ``jt_dist.sharded_triton_call``.

The README's demo. On GPUs it shards over every local GPU; on a host without
GPUs it runs Triton's interpreter on 8 virtual CPU devices.

    python examples/sharded_add.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import numpy as np
import triton
import triton.language as tl

from jax.sharding import PartitionSpec as P

from jt_dist import testing


@triton.jit
def add_kernel(x_ptr, y_ptr, n_elements, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


def sharded_add(x, y, mesh, block=1024):
  """x + y, one kernel launch per device, each on its own shard."""
  return jt_dist.sharded_triton_call(
      x, y, jt_dist.shard_size(0),  # n_elements: the local shard's size.
      kernel=add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n_elements"], meta["BLOCK"]),),
      mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
      BLOCK=block)


def main(elements_per_device=None, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  if elements_per_device is None:
    elements_per_device = 2048 if on_cpu else 1 << 24
  mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
  rng = np.random.default_rng(seed)
  n = elements_per_device * len(devices)
  x = rng.standard_normal(n, dtype=np.float32)
  y = rng.standard_normal(n, dtype=np.float32)
  out = jax.jit(lambda a, b: sharded_add(a, b, mesh,
                                         block=256 if on_cpu else 1024))(x, y)
  error = float(np.max(np.abs(np.asarray(out) - (x + y))))
  where = "Triton's interpreter" if on_cpu else "compiled Triton kernels"
  print(f"sharded add of {n} float32 elements over {len(devices)}"
        f" {devices[0].platform} devices ({where}): max |error| = {error:.3g};"
        f" output sharding {out.sharding.spec}")
  assert error == 0.0, error
  return error


if __name__ == "__main__":
  testing.configure_cpu_devices(8)  # Only affects the CPU backend.
  main()
