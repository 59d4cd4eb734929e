"""Training with seeded dropout: a new mask every step, nothing recompiled.

The dropout kernel is Triton's low-memory dropout tutorial's, unchanged:
its output pointer comes second (``x_ptr, output_ptr, n_elements, p,
seed``), so the inputs after it are bound by keyword. The mask is never
stored: it is ``tl.rand(seed, offsets) > p``, so the backward pass (a
``jax.custom_vjp``) runs the same kernel on the incoming gradient with the
same seed. The training step runs under ``jax.jit``, where the step counter
is traced; the seed computed from it reaches the kernel's scalar parameter
through ``jt_dist.runtime_scalar``, so every step draws a new mask and the
step is traced and compiled once.

    python examples/seeded_dropout.py
"""

import jt_dist  # pylint: disable=g-bad-import-order

import functools

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

P_DROP = 0.25
BLOCK_SIZE = 256


@triton.jit
def seeded_dropout_kernel(x_ptr, output_ptr, n_elements, p, seed,
                          BLOCK_SIZE: tl.constexpr):
  pid = tl.program_id(axis=0)
  offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  keep = tl.rand(seed, offsets) > p
  tl.store(output_ptr + offsets, tl.where(keep, x / (1 - p), 0.0), mask=mask)


def _dropout(x, p, seed):
  """Drops each element of ``x`` with probability ``p``; scales the rest."""
  return jt_dist.triton_call(
      x, n_elements=x.size, p=p, seed=jt_dist.runtime_scalar(seed),
      kernel=seeded_dropout_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n_elements"],
                                     meta["BLOCK_SIZE"]),),
      BLOCK_SIZE=BLOCK_SIZE)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def dropout(x, p, seed):
  """Seeded dropout of ``x``; ``seed`` is an int32 scalar, traced or not."""
  return _dropout(x, p, seed)


def _dropout_fwd(x, p, seed):
  return _dropout(x, p, seed), seed


def _dropout_bwd(p, seed, g):
  # The same seed draws the same mask: the gradient is dropped the same way.
  return _dropout(g, p, seed), None


dropout.defvjp(_dropout_fwd, _dropout_bwd)


def step_seed(base_seed, step):
  """A seed per step, computed inside the jitted step (so traced)."""
  return base_seed + step * 7919


def loss_fn(params, x, y, seed):
  hidden = dropout(jax.nn.relu(x @ params["w1"]), P_DROP, seed)
  return jnp.mean((hidden @ params["w2"] - y) ** 2)


def make_train_step(lr, traces):
  @jax.jit
  def train_step(params, x, y, base_seed, step):
    traces.append(step)  # Runs only when jax traces the step.
    seed = step_seed(base_seed, step)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, seed)
    return jax.tree.map(lambda a, g: a - lr * g, params, grads), loss
  return train_step


def check_masks(x, base_seed):
  """The forward mask is the backward mask, and it changes with the step."""
  x = jnp.abs(x) + 1.0  # No zeros of its own: a zero is a dropped element.
  w = jnp.asarray(np.linspace(-1, 1, x.size, dtype=np.float32).reshape(
      x.shape))
  seed = step_seed(base_seed, jnp.int32(3))
  out, grad = jax.jit(lambda a, s: (
      dropout(a, P_DROP, s),
      jax.grad(lambda b: jnp.sum(dropout(b, P_DROP, s) * w))(a)))(x, seed)
  kept = np.asarray(out) != 0
  np.testing.assert_allclose(np.asarray(out)[kept],
                             np.asarray(x)[kept] / (1 - P_DROP), rtol=1e-6)
  np.testing.assert_allclose(
      grad, np.where(kept, np.asarray(w) / (1 - P_DROP), 0.0), rtol=1e-6)
  next_mask = np.asarray(jax.jit(dropout, static_argnums=1)(
      x, P_DROP, step_seed(base_seed, jnp.int32(4)))) != 0
  assert (kept != next_mask).any(), "two steps drew the same mask"
  return float(kept.mean())


def main(batch=None, steps=None, seed=0):
  on_cpu = jax.default_backend() == "cpu"
  batch = batch or (64 if on_cpu else 4096)
  steps = steps or (30 if on_cpu else 200)
  d_in, d_hidden = 16, 64
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((batch, d_in), dtype=np.float32))
  true_w = rng.standard_normal((d_in, 1), dtype=np.float32) / 4
  y = jnp.sin(x @ true_w)
  params = {
      "w1": jnp.asarray(rng.standard_normal((d_in, d_hidden),
                                            dtype=np.float32) / 4),
      "w2": jnp.asarray(rng.standard_normal((d_hidden, 1),
                                            dtype=np.float32) / 8),
  }
  base_seed = jnp.int32(rng.integers(1 << 20))
  kept = check_masks(x[:8, :], base_seed)
  assert abs(kept - (1 - P_DROP)) < 0.15, kept

  traces = []
  train_step = make_train_step(lr=0.03, traces=traces)
  losses = []
  for step in range(steps):
    params, loss = train_step(params, x, y, base_seed, jnp.int32(step))
    losses.append(float(loss))
  first, last = np.mean(losses[:5]), np.mean(losses[-5:])
  print(f"seeded dropout (p={P_DROP}, {kept:.0%} kept) training on"
        f" {jax.devices()[0].platform}: loss {first:.4f} -> {last:.4f} in"
        f" {steps} steps, traced {len(traces)} time(s)")
  assert len(traces) == 1, f"the step was traced {len(traces)} times"
  assert last < 0.7 * first, losses
  return losses


if __name__ == "__main__":
  testing.configure_cpu_devices(8)
  main()
