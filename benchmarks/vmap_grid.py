"""``jax.vmap`` of a small Triton kernel: one batched launch against a loop.

For batches of 1 to 1,024, each case times three ways of computing the same
batch, in turns (``timing.interleaved_chained_each``):

* ``grid``: ``jax.vmap`` of ``triton_call`` with the default method, one
  launch over a grid extended by the batch;
* ``sequential``: ``vmap_method="sequential"``, one launch per element in a
  ``lax.map`` loop;
* ``xla``: XLA's own batched op (``x + y``, ``jax.nn.softmax``).

Every result is checked against XLA before it is timed. Writes JSON and
prints a table:

    python benchmarks/vmap_grid.py --out benchmarks/results/h200x1/vmap_grid.json
    python benchmarks/vmap_grid.py --smoke    # tiny sizes, any host
"""

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import triton  # pylint: disable=g-import-not-at-top

from examples import softmax as softmax_example  # pylint: disable=g-import-not-at-top
import jt_dist  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import run  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

SIZES = {
    # add: elements per batch element; softmax: (rows, columns) per element.
    "full": dict(batches=(1, 4, 16, 64, 256, 1024), add=4096,
                 softmax=(16, 256), iters=20, rounds=15),
    "smoke": dict(batches=(1, 3), add=64, softmax=(2, 16), iters=2,
                  rounds=3),
}


def add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=kernels.add_kernel, out_shape=x,
      grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),),
      BLOCK=min(kernels.ADD_BLOCK, triton.next_power_of_2(x.size)),
      **options)


def softmax(x, **options):
  n_rows, n_cols = x.shape
  return jt_dist.triton_call(
      x, n_cols, n_cols, n_cols, kernel=softmax_example.softmax_kernel,
      out_shape=x, grid=(n_rows,), BLOCK=triton.next_power_of_2(n_cols),
      **options)


def _cases(sizes):
  """name -> (Triton call, XLA's batched op, per-element input shapes)."""
  return {
      "add": (add, jnp.add, [(sizes["add"],), (sizes["add"],)]),
      "softmax": (softmax, functools.partial(jax.nn.softmax, axis=-1),
                  [sizes["softmax"]]),
  }


def bench_case(results, name, call, xla_op, shapes, batch, sizes, key):
  keys = jax.random.split(key, len(shapes))
  args = [jax.random.normal(k, (batch, *s), jnp.float32)
          for k, s in zip(keys, shapes)]
  fns = {
      "grid": jax.jit(jax.vmap(call)),
      "sequential": jax.jit(jax.vmap(
          functools.partial(call, vmap_method="sequential"))),
      "xla": jax.jit(xla_op),
  }
  expected = fns["xla"](*args)
  errors = {impl: timing.relative_error(fn(*args), expected)
            for impl, fn in fns.items() if impl != "xla"}
  for impl, error in errors.items():
    if error > 1e-5:
      raise AssertionError(f"{name} batch {batch} {impl}: relative error"
                           f" {error:.3g} against XLA")
  seconds = timing.interleaved_chained_each(
      {impl: (fn, args) for impl, fn in fns.items()}, sizes["iters"],
      sizes["rounds"])
  for impl, s in seconds.items():
    run._record(results, f"vmap {name} B={batch}", impl, batch=batch,  # pylint: disable=protected-access
                us=s * 1e6, **({"rel_error": errors[impl]}
                               if impl in errors else {}))
  return seconds


def _print_table(rows):
  print("\n| kernel | batch | grid, µs | sequential, µs | XLA, µs |"
        " grid speed-up over sequential |")
  print("| --- | --- | --- | --- | --- | --- |")
  for name, batch, s in rows:
    print(f"| {name} | {batch:,} | {s['grid'] * 1e6:.1f} |"
          f" {s['sequential'] * 1e6:.1f} | {s['xla'] * 1e6:.1f} |"
          f" {s['sequential'] / s['grid']:.1f}× |")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--smoke", action="store_true")
  args = parser.parse_args()
  sizes = SIZES["smoke" if args.smoke else "full"]
  environment = run._environment()  # pylint: disable=protected-access
  print(f"environment: {environment}", flush=True)
  results, rows = [], []
  key = jax.random.key(int.from_bytes(os.urandom(4), "little"))
  for name, (call, xla_op, shapes) in _cases(sizes).items():
    for batch in sizes["batches"]:
      key, sub = jax.random.split(key)
      try:
        seconds = bench_case(results, name, call, xla_op, shapes, batch,
                             sizes, sub)
      except Exception as e:  # pylint: disable=broad-except
        # One failing case must not lose the others' numbers.
        run._record(results, f"vmap {name} B={batch}", "FAILED",  # pylint: disable=protected-access
                    error=f"{type(e).__name__}: {e}"[:500])
        continue
      rows.append((name, batch, seconds))
  _print_table(rows)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"environment": environment, "sizes": sizes,
                 "results": results}, f, indent=1)


if __name__ == "__main__":
  main()
