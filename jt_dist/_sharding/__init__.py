"""Sharding: the device-validation layer, `sharded_triton_call`, its specs."""
