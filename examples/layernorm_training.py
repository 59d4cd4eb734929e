"""Training a layer norm whose forward and backward passes are Triton kernels.

The op is a ``jax.custom_vjp``: the forward kernel normalises each row and
saves its mean and reciprocal standard deviation; the backward kernel
computes the input gradient per row and accumulates the weight and bias
gradients with atomics into zeroed outputs. Over a data-parallel mesh the
batch is split over "data" and the weight gradients, partial per shard, are
summed across shards with ``out_reduce`` before they leave them.

    python examples/layernorm_training.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import functools

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from jax.sharding import PartitionSpec as P

from jt_dist import testing

EPS = 1e-5


@triton.jit
def ln_fwd_kernel(x_ptr, w_ptr, b_ptr, n_cols, eps, y_ptr, mean_ptr, rstd_ptr,
                  BLOCK_D: tl.constexpr):
  row = tl.program_id(0).to(tl.int64)
  cols = tl.arange(0, BLOCK_D)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
  mean = tl.sum(x, 0) / n_cols
  centred = tl.where(mask, x - mean, 0.0)
  rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, 0) / n_cols + eps)
  w = tl.load(w_ptr + cols, mask=mask)
  b = tl.load(b_ptr + cols, mask=mask)
  tl.store(y_ptr + row * n_cols + cols, centred * rstd * w + b, mask=mask)
  tl.store(mean_ptr + row, mean)
  tl.store(rstd_ptr + row, rstd)


@triton.jit
def ln_bwd_kernel(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, n_cols,
                  dx_ptr, dw_ptr, db_ptr, BLOCK_D: tl.constexpr):
  row = tl.program_id(0).to(tl.int64)
  cols = tl.arange(0, BLOCK_D)
  mask = cols < n_cols
  x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
  dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0)
  w = tl.load(w_ptr + cols, mask=mask, other=0.0)
  rstd = tl.load(rstd_ptr + row)
  x_hat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
  w_dy = w * dy
  c1 = tl.sum(x_hat * w_dy, 0) / n_cols
  c2 = tl.sum(w_dy, 0) / n_cols
  tl.store(dx_ptr + row * n_cols + cols, (w_dy - (x_hat * c1 + c2)) * rstd,
           mask=mask)
  tl.atomic_add(dw_ptr + cols, dy * x_hat, mask=mask)
  tl.atomic_add(db_ptr + cols, dy, mask=mask)


def _block(d):
  return triton.next_power_of_2(d)


def _forward(x, w, b, mesh):
  rows, d = x.shape
  f32 = jnp.float32
  return jt_dist.sharded_triton_call(
      x, w, b, d, EPS, kernel=ln_fwd_kernel,
      out_shape=(jax.ShapeDtypeStruct((rows, d), f32),
                 jax.ShapeDtypeStruct((rows,), f32),
                 jax.ShapeDtypeStruct((rows,), f32)),
      grid=lambda meta: (meta["x_ptr"].shape[0],),  # Local rows.
      mesh=mesh, in_specs=(P("data"), P(), P()), out_specs=P("data"),
      BLOCK_D=_block(d))


def _backward(x, w, mean, rstd, dy, mesh):
  rows, d = x.shape
  f32 = jnp.float32
  return jt_dist.sharded_triton_call(
      x, w, mean, rstd, dy, d, kernel=ln_bwd_kernel,
      out_shape=(jax.ShapeDtypeStruct((rows, d), f32),
                 jax.ShapeDtypeStruct((d,), f32),
                 jax.ShapeDtypeStruct((d,), f32)),
      grid=lambda meta: (meta["x_ptr"].shape[0],),
      mesh=mesh, in_specs=(P("data"), P(), P("data"), P("data"), P("data")),
      out_specs=(P("data"), P(), P()),
      zeroed_outputs=(1, 2),
      out_reduce=(None, ("sum", "data"), ("sum", "data")),
      BLOCK_D=_block(d))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x, w, b, mesh):
  """Row-wise layer norm of x [rows, d] with weight and bias [d]."""
  return _forward(x, w, b, mesh)[0]


def _layer_norm_fwd(x, w, b, mesh):
  y, mean, rstd = _forward(x, w, b, mesh)
  return y, (x, w, mean, rstd)


def _layer_norm_bwd(mesh, residuals, dy):
  x, w, mean, rstd = residuals
  return _backward(x, w, mean, rstd, dy, mesh)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def layer_norm_reference(x, w, b):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + EPS) * w + b


def loss_fn(params, x, target, mesh, remat=False):
  norm = functools.partial(layer_norm, mesh=mesh)
  if remat:
    norm = jax.checkpoint(norm)
  y = norm(x, params["w"], params["b"])
  return jnp.mean(jnp.sum((y - target) ** 2, axis=-1))


def train(x, target, params, mesh, steps=20, lr=0.2, remat=False):
  """Plain SGD under jax.jit; returns the final params and the losses."""

  @jax.jit
  def step(p):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, target, mesh, remat)
    return jax.tree.map(lambda a, g: a - lr * g, p, grads), loss

  losses = []
  for _ in range(steps):
    params, loss = step(params)
    losses.append(float(loss))
  return params, losses


def main(rows=None, d=None, seed=0):
  devices = jax.devices()
  on_cpu = devices[0].platform == "cpu"
  count = 2 if len(devices) >= 2 else 1
  mesh = jax.make_mesh((count,), ("data",), devices=devices[:count])
  rows = rows or (16 if on_cpu else 8192)
  d = d or (32 if on_cpu else 1024)
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((rows, d), dtype=np.float32) * 3 + 1
  true_w = rng.uniform(0.5, 1.5, d).astype(np.float32)
  true_b = rng.standard_normal(d, dtype=np.float32)
  target = layer_norm_reference(x, true_w, true_b)
  params = {"w": jnp.ones(d, jnp.float32),
            "b": jnp.asarray(rng.standard_normal(d, dtype=np.float32) * 0.1)}
  params, losses = train(x, target, params, mesh)
  print(f"layer-norm training on {count} {devices[0].platform} device(s):"
        f" loss {losses[0]:.4f} -> {losses[-1]:.6f} in {len(losses)} steps")
  assert losses[-1] < 0.1 * losses[0], losses
  return losses


if __name__ == "__main__":
  testing.configure_cpu_devices(8)
  main()
