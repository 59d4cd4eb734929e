"""Sharding: the device-validation layer, `sharded_triton_call` and its specs."""
