"""Training a small MLP data-parallel, with a fused Triton layer inside.

The model is ``tanh(x @ w1 + b1) @ w2 + b2``. Its middle, the bias add and
the tanh, is one Triton kernel forward and one backward, joined into a
differentiable op by ``jax.custom_vjp``; the matmuls are plain ``jnp``. The
batch is split over a "data" axis of every local device (8 virtual CPU
devices on a host without GPUs); the parameters are replicated.

``jt_dist.sharded_triton_call`` runs each kernel once per device on its
shard of the batch. The backward kernel sums the bias gradient over its
rows with atomics into a zeroed output; that sum is partial per shard, so
``out_reduce`` adds the shards' sums before the gradient leaves them. The
matmuls' gradients are summed across the batch by XLA, as for any sharded
``jnp`` code.

The script checks one training step against the same model written in
``jnp`` alone (the same loss and the same updated parameters), then trains
and checks that the loss falls.

    python examples/data_parallel_training.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jt_dist import testing


@triton.jit
def _tanh(z):
  # tanh through exp: exact at both ends, as exp overflows to inf or
  # underflows to 0.
  return 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)


@triton.jit
def bias_tanh_fwd_kernel(x_ptr, b_ptr, n_rows, y_ptr, N_COLS: tl.constexpr,
                         BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
  rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
  cols = tl.arange(0, BLOCK_COLS)
  mask = (rows[:, None] < n_rows) & (cols[None, :] < N_COLS)
  offsets = rows[:, None] * N_COLS + cols[None, :]
  x = tl.load(x_ptr + offsets, mask=mask)
  b = tl.load(b_ptr + cols, mask=cols < N_COLS)
  tl.store(y_ptr + offsets, _tanh(x + b[None, :]), mask=mask)


@triton.jit
def bias_tanh_bwd_kernel(y_ptr, dy_ptr, n_rows, dx_ptr, db_ptr,
                         N_COLS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                         BLOCK_COLS: tl.constexpr):
  rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
  cols = tl.arange(0, BLOCK_COLS)
  mask = (rows[:, None] < n_rows) & (cols[None, :] < N_COLS)
  offsets = rows[:, None] * N_COLS + cols[None, :]
  y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
  dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
  dx = dy * (1.0 - y * y)
  tl.store(dx_ptr + offsets, dx, mask=mask)
  # This program's rows only: the programs' sums meet in db by atomics.
  tl.atomic_add(db_ptr + cols, tl.sum(dx, axis=0), mask=cols < N_COLS)


_BLOCK_ROWS = 8


def _grid(meta):
  # Arrays appear in `meta` as shape/dtype structs, here the local shard.
  return (triton.cdiv(meta["x_ptr"].shape[0], meta["BLOCK_ROWS"]),)


def _bwd_grid(meta):
  return (triton.cdiv(meta["y_ptr"].shape[0], meta["BLOCK_ROWS"]),)


def _bias_tanh_forward(x, b, mesh):
  rows, cols = x.shape
  return jt_dist.sharded_triton_call(
      x, b, jt_dist.shard_size(0, axis=0),  # n_rows: the shard's rows.
      kernel=bias_tanh_fwd_kernel,
      out_shape=jax.ShapeDtypeStruct((rows, cols), x.dtype), grid=_grid,
      mesh=mesh, in_specs=(P("data"), P()), out_specs=P("data"),
      N_COLS=cols, BLOCK_ROWS=_BLOCK_ROWS,
      BLOCK_COLS=triton.next_power_of_2(cols))


def _bias_tanh_backward(y, dy, mesh):
  rows, cols = y.shape
  return jt_dist.sharded_triton_call(
      y, dy, jt_dist.shard_size(0, axis=0), kernel=bias_tanh_bwd_kernel,
      out_shape=(jax.ShapeDtypeStruct((rows, cols), y.dtype),
                 jax.ShapeDtypeStruct((cols,), y.dtype)),
      grid=_bwd_grid, mesh=mesh, in_specs=(P("data"), P("data")),
      out_specs=(P("data"), P()),
      zeroed_outputs=(1,),  # db accumulates with atomics.
      out_reduce=(None, ("sum", "data")),  # Each shard's db is partial.
      N_COLS=cols, BLOCK_ROWS=_BLOCK_ROWS,
      BLOCK_COLS=triton.next_power_of_2(cols))


def make_bias_tanh(mesh):
  """``tanh(x + b)`` over a mesh, differentiable, as Triton kernels."""

  @jax.custom_vjp
  def bias_tanh(x, b):
    return _bias_tanh_forward(x, b, mesh)

  def forward(x, b):
    y = _bias_tanh_forward(x, b, mesh)
    return y, y  # The backward pass needs only the output.

  def backward(y, dy):
    return _bias_tanh_backward(y, dy, mesh)

  bias_tanh.defvjp(forward, backward)
  return bias_tanh


def _jnp_bias_tanh(x, b):
  return jnp.tanh(x + b)


def loss_fn(params, x, target, bias_tanh):
  hidden = bias_tanh(x @ params["w1"], params["b1"])
  out = hidden @ params["w2"] + params["b2"]
  return jnp.mean(jnp.sum((out - target) ** 2, axis=-1))


def make_step(bias_tanh, lr):
  """One SGD step of the model, jitted: (params, x, target) -> (params, loss)."""

  @jax.jit
  def step(params, x, target):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, target, bias_tanh)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

  return step


def init_params(rng, d_in, hidden, d_out):
  def normal(*shape):
    return jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
  return {"w1": normal(d_in, hidden) / np.sqrt(d_in),
          "b1": normal(hidden) * 0.1,
          "w2": normal(hidden, d_out) / np.sqrt(hidden),
          "b2": jnp.zeros(d_out, jnp.float32)}


def main(steps=25, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
  d_in, hidden, d_out = (16, 32, 4) if on_cpu else (512, 1024, 64)
  batch = (8 if on_cpu else 1024) * len(devices)
  lr = 0.1
  rng = np.random.default_rng(seed)
  # A target the model can fit: a fixed random network of the same shape.
  teacher = init_params(rng, d_in, hidden, d_out)
  x = rng.standard_normal((batch, d_in), dtype=np.float32)
  target = jnp.tanh(x @ teacher["w1"] + teacher["b1"]) @ teacher["w2"]
  params = init_params(rng, d_in, hidden, d_out)

  replicated = NamedSharding(mesh, P())
  x = jax.device_put(x, NamedSharding(mesh, P("data")))
  target = jax.device_put(target, NamedSharding(mesh, P("data")))
  params = jax.device_put(params, replicated)

  step = make_step(make_bias_tanh(mesh), lr)
  reference_step = make_step(_jnp_bias_tanh, lr)

  # One step of each from the same parameters: the same loss and update.
  new_params, loss = step(params, x, target)
  ref_params, ref_loss = reference_step(params, x, target)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for name in params:
    np.testing.assert_allclose(new_params[name], ref_params[name],
                               rtol=1e-4, atol=1e-6, err_msg=name)

  losses = [float(loss)]
  params = new_params
  for _ in range(steps - 1):
    params, loss = step(params, x, target)
    losses.append(float(loss))
  print(f"data-parallel MLP training on {len(devices)} {devices[0].platform}"
        f" device(s), batch {batch}: loss {losses[0]:.4f} ->"
        f" {losses[-1]:.4f} in {steps} steps; the first step matches jnp")
  assert losses[-1] < 0.5 * losses[0], losses
  return losses


if __name__ == "__main__":
  testing.configure_cpu_devices(8)  # Only affects the CPU backend.
  main()
