"""``triton_call``'s front door: operands as given (keywords, tuples,
Refs, TMA descriptors, backend options) and the eager dispatch cache."""
