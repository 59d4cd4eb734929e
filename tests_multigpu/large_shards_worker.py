"""One entry point of jt_dist run on 4 MiB shards, then collectives after it.

Started by ``large_shards_test.py`` in a subprocess of its own (a hang there
fails that test, not the suite): ``python large_shards_worker.py CASE``, on
8 virtual CPU devices, or through ``run_processes`` for the case
``processes`` (2 processes x 4 devices). Each case checks its result
against NumPy (sums in float64) and prints one JSON line,
``{"case": ..., "rel_error": ...}``.

The kernels are trivially cheap: a block of 2**18 elements or more, so each
shard takes a handful of program instances through the interpreter.
"""

import json
import os
import sys

from jt_dist import testing

CASE = sys.argv[1]
if CASE == "processes":
  PROCESS_ID, _ = testing.initialize_process()
else:
  PROCESS_ID = 0
  testing.configure_cpu_devices(8)

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from jax.experimental import multihost_utils
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import triton
import triton.language as tl

import jt_dist

sys.path.insert(0, os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from feature_kernels import add_kernel
# pylint: enable=g-import-not-at-top,wrong-import-position

# float32 elements in 4 MiB.
SHARD = 1 << 20
BLOCK = 1 << 18


@triton.jit
def scale_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """out = 2 * x."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask),
           mask=mask)


@triton.jit
def row_sum_kernel(x_ptr, cols, out_ptr, BLOCK: tl.constexpr):
  """out[r] = sum(x[r, :]) for a row of at most BLOCK columns."""
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK)
  x = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=0.0)
  tl.store(out_ptr + row, tl.sum(x, axis=0))


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _scale(x):
  """2 * x through the kernel, for the local shard ``x`` (any shape)."""
  return jt_dist.triton_call(
      x, x.size, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_grid,
      BLOCK=BLOCK)


def _report(case, actual, expected):
  """Prints the largest error relative to the largest expected magnitude.

  ``expected`` is float64 where the kernel's float32 result is a sum, and
  float32 where the kernel computes it exactly as NumPy does (2 * x,
  x + y): then the error is computed in float32, which over 32 MiB of
  results spares 64 MiB arrays of fresh memory.
  """
  expected = np.asarray(expected)
  actual = np.asarray(actual, expected.dtype)
  error = float(np.max(np.abs(actual - expected)) / np.max(np.abs(expected)))
  print(json.dumps({"case": case, "process": PROCESS_ID, "rel_error": error,
                    "shape": list(actual.shape)}), flush=True)


def _mesh():
  return jax.make_mesh((jax.device_count(),), ("x",),
                       axis_types=(AxisType.Explicit,))


def _out_reduce(x, mesh):
  """The per-shard 2 * x, summed over the mesh (out_reduce)."""
  return jt_dist.sharded_triton_call(
      x, jt_dist.shard_size(0), kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct((x.shape[0] // mesh.size,), x.dtype),
      grid=_grid, mesh=mesh, in_specs=P("x"), out_specs=P(),
      out_reduce=("sum", "x"), BLOCK=BLOCK)


def case_out_reduce(rng):
  mesh = _mesh()
  x = rng.standard_normal(SHARD * mesh.size, np.float32)
  expected = 2 * x.reshape(mesh.size, SHARD).sum(0, dtype=np.float64)
  _report("out_reduce_jit", jax.jit(lambda a: _out_reduce(a, mesh))(x),
          expected)
  _report("out_reduce_eager", _out_reduce(x, mesh), expected)


def case_rule(rng):
  """A rule's reduction (all-reduce), all-gather and reshard (all-to-all)."""
  mesh = _mesh()
  n = mesh.size
  row_sum = jt_dist.ShardingRule("r c -> r", reductions={"c": "sum"})
  rows, cols = 4, SHARD // 4 * n
  x = rng.standard_normal((rows, cols), np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P(None, "x")))

  def sums(a):
    return jt_dist.triton_call(
        a, jt_dist.shard_size(0, axis=1), kernel=row_sum_kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0],), a.dtype),
        grid=(a.shape[0],), sharding_rule=row_sum, BLOCK=cols // n)

  # Each device adds up its 4 MiB of columns; the rule then sums over x.
  _report("rule_reduction", jax.jit(sums)(xs), x.sum(1, dtype=np.float64))

  whole_rows = jt_dist.ShardingRule("r c -> r c", whole=("c",))
  gather = jax.jit(lambda a: jt_dist.triton_call(
      a, jt_dist.shard_size(0), kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=_grid,
      sharding_rule=whole_rows, BLOCK=BLOCK))
  small = x[:, :SHARD // 4 * 2]  # 2 MiB columns split 8 ways, then gathered.
  _report("rule_all_gather", gather(jax.device_put(
      small, NamedSharding(mesh, P(None, "x")))), 2 * small)

  add = jt_dist.ShardingRule("i j, i j -> i j")
  y = rng.standard_normal((n * 1024, 1024), np.float32)
  z = rng.standard_normal((n * 1024, 1024), np.float32)

  @jax.jit
  def reshard(a, b):
    out = jt_dist.triton_call(
        a, b, jt_dist.shard_size(0), kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=_grid,
        sharding_rule=add, BLOCK=BLOCK)
    # Summing over the split rows is an all-reduce after the kernel.
    return out, out.sum(0)

  out, column_sums = reshard(
      jax.device_put(y, NamedSharding(mesh, P("x"))),
      jax.device_put(z, NamedSharding(mesh, P(None, "x"))))
  _report("rule_reshard", out, y + z)
  _report("rule_reshard_sum", column_sums,
          np.asarray(out).sum(0, dtype=np.float64))


def case_vmap(rng):
  """jax.vmap of a call inside shard_map, then the user's psum."""
  mesh = _mesh()
  batch = 4
  x = rng.standard_normal((mesh.size * batch, SHARD // batch),
                          np.float32)

  def body(local):
    return jax.lax.psum(jax.vmap(_scale)(local), "x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))
  expected = 2 * x.reshape(mesh.size, batch, -1).sum(0, dtype=np.float64)
  _report("vmap_psum", f(jax.device_put(x, NamedSharding(mesh, P("x")))),
          expected)


def case_user_collectives(rng):
  """A plain call inside shard_map, then psum, all_gather and ppermute."""
  mesh = _mesh()
  n = mesh.size
  x = rng.standard_normal(SHARD * n, np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  shards = 2 * x.reshape(n, SHARD)  # Exact in float32.

  def body(local):
    y = _scale(local)
    total = jax.lax.psum(y, "x")
    # Each device keeps shard 0 of what it gathered.
    gathered = jax.lax.all_gather(y, "x", tiled=True)[:local.size]
    shifted = jax.lax.ppermute(y, "x", [(i, (i + 1) % n) for i in range(n)])
    return total, gathered, shifted

  # Every device's copy of shard 0, side by side.
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                            out_specs=(P(), P("x"), P("x"))))
  total, gathered, shifted = f(xs)
  _report("user_psum", total, shards.sum(0, dtype=np.float64))
  _report("user_all_gather", np.asarray(gathered).reshape(n, SHARD),
          np.broadcast_to(shards[:1], (n, SHARD)))
  _report("user_ppermute", shifted, np.roll(shards, 1, axis=0).reshape(-1))


def case_processes(rng):
  """2 processes x 4 devices: out_reduce and a psum across processes."""
  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  x = rng.standard_normal(SHARD * mesh.size, np.float32)
  expected = 2 * x.reshape(mesh.size, SHARD).sum(0, dtype=np.float64)
  out = jax.jit(lambda a: _out_reduce(a, mesh))(x)
  _report("processes_out_reduce",
          np.asarray(out.addressable_shards[0].data), expected)
  eager = _out_reduce(x, mesh)
  _report("processes_out_reduce_eager",
          np.asarray(eager.addressable_shards[0].data), expected)
  f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(_scale(a), "x"),
                            mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  # Every process holds the same x (same seed): each places its shards.
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  gathered = multihost_utils.process_allgather(f(xs), tiled=True)
  _report("processes_psum", np.asarray(gathered)[:SHARD], expected)


def main():
  seed = int(os.environ.get("JT_DIST_TEST_SEED", "0"))
  globals()[f"case_{CASE}"](np.random.default_rng(seed))
  print(json.dumps({"case": "done", "process": PROCESS_ID}), flush=True)


if __name__ == "__main__":
  main()
