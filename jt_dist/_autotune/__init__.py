"""One autotuning choice for every shard: chosen once, shared, persisted."""
