"""The primitive and what it is bound to: a kernel's parameters, the
call's static spec, scalar and pointer types, options and lowering rules."""
