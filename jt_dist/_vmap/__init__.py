"""``jax.vmap`` of a call: the batching rule and the batched-grid kernel."""
