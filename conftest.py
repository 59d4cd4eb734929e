"""Pytest start-up: 8 virtual CPU devices, set before JAX initialises."""

from jt_dist import testing

testing.configure_cpu_devices()
