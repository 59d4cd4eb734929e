"""User tools around calls: ``jax.export`` support and the doctor."""
