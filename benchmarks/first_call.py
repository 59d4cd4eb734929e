"""Times the first call of one kernel in a fresh process; prints JSON.

Run by benchmarks/run.py once per (library, kernel, cache state):

    python benchmarks/first_call.py --lib jt_dist --kernel matmul_autotuned
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--lib", choices=("jt_dist", "jax_triton"), required=True)
  parser.add_argument("--kernel", choices=("add", "matmul", "matmul_autotuned"),
                      required=True)
  parser.add_argument("--size", type=int, default=4096)
  args = parser.parse_args()

  start_process = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import kernels  # pylint: disable=g-import-not-at-top
  if args.lib == "jt_dist":
    import jt_dist as lib  # pylint: disable=g-import-not-at-top
  else:
    import jax_triton as lib  # pylint: disable=g-import-not-at-top
  key_a, key_b = jax.random.split(jax.random.key(int(time.time())))
  if args.kernel == "add":
    x = jax.random.normal(key_a, (1 << 24,), jnp.float32)
    y = jax.random.normal(key_b, (1 << 24,), jnp.float32)
    fn = jax.jit(lambda a, b: kernels.add(lib.triton_call, a, b))
    inputs = (x, y)
  else:
    n = args.size
    a = jax.random.normal(key_a, (n, n), jnp.bfloat16)
    b = jax.random.normal(key_b, (n, n), jnp.bfloat16)
    tuned = args.kernel == "matmul_autotuned"
    fn = jax.jit(lambda p, q: kernels.matmul(lib.triton_call, p, q,
                                             autotuned=tuned))
    inputs = (a, b)
  jax.block_until_ready(inputs)
  # The first call split into its stages: trace + lower (where Triton
  # compiles, or the disk cache answers), XLA's compile, and the first
  # execution (jaxlib loads the kernels and, if autotuned, times them).
  start = time.perf_counter()
  lowered = fn.trace(*inputs).lower()
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  compiled_at = time.perf_counter()
  out = jax.block_until_ready(compiled(*inputs))
  first = time.perf_counter() - start
  stages = {"lower_s": lowered_at - start, "xla_compile_s": compiled_at - lowered_at,
            "first_execute_s": time.perf_counter() - compiled_at}
  start = time.perf_counter()
  jax.block_until_ready(fn(*inputs))
  second = time.perf_counter() - start
  # Checked after the timing, which must not include the reference's compile.
  if args.kernel == "add":
    expected = inputs[0] + inputs[1]
  else:
    expected = kernels.xla_matmul(*inputs)
  error = float(jnp.linalg.norm((out - expected).astype(jnp.float32))
                / jnp.linalg.norm(expected.astype(jnp.float32)))
  if not error < 1e-2:
    raise SystemExit(f"{args.lib} {args.kernel}: relative error {error}")
  # Where each autotuning choice came from: "timed" in a cold process,
  # "disk" in a second one; none in jaxlib's mode, which times at run time.
  autotune = ([{"source": c.source, "config": c.config, "index": c.index}
               for c in lib.autotune_choices()]
              if args.lib == "jt_dist" else [])
  print(json.dumps({
      "lib": args.lib, "kernel": args.kernel, "first_call_s": first,
      "autotune": autotune,
      "second_call_s": second, "process_s": time.perf_counter() - start_process,
      **stages,
      "out_shape": list(out.shape), "rel_error": error,
  }))


if __name__ == "__main__":
  main()
