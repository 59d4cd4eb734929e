"""A host callback followed by a collective, on virtual CPU devices: no jt_dist.

The minimal reproducer of the jaxlib limit that decides how jt_dist's CPU
path calls back into Python beside collectives. Each device of a ``jax.shard_map`` calls back into Python on its
shard, then the shards are summed with ``jax.lax.psum``:

- through ``jax.pure_callback``, which ``device_put``s every operand to CPU
  device 0 before calling back: with jaxlib 0.10, from 25,600 float32
  (102,400 bytes) per shard the copy is made asynchronously on the thread
  pool that runs the devices' programs, the threads in the psum wait for the
  threads in the callbacks, which wait for copies no thread is left to make,
  and XLA aborts the process (``rendezvous.cc`` "Termination timeout");
- through ``jax.experimental.buffer_callback``, which hands the callback the
  computation's own buffers: no copy, no wait, at any size.

Every run is a child process (an abort kills only it), with XLA's rendezvous
timeout lowered to ``--terminate-s`` so that an abort comes quickly.

    python benchmarks/cpu_callback_collective_repro.py \
        --out benchmarks/results/cpu/cpu_callback_collective_repro.json
"""

import argparse
import json
import os
import subprocess
import sys
import time

_SIZES = (25_599, 25_600, 262_144, 1_048_576)
_ROUTES = ("pure_callback", "buffer_callback")


def _child(route: str, per_shard: int, devices: int) -> None:
  """One run: prints the psum's first element, or dies with XLA's abort."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_num_cpu_devices", devices)
  mesh = jax.make_mesh((devices,), ("x",))

  def body(x):
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    if route == "pure_callback":
      y = jax.pure_callback(lambda a: np.asarray(a) + 1, result, x)
    else:
      from jax.experimental.buffer_callback import buffer_callback  # pylint: disable=import-outside-toplevel

      def add_one(ctx, out, a):
        del ctx
        np.asarray(out)[...] = np.asarray(a) + 1

      y = buffer_callback(add_one, result)(x)
    return jax.lax.psum(y, "x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))
  x = jax.device_put(np.zeros(devices * per_shard, np.float32),
                     NamedSharding(mesh, P("x")))
  print(float(f(x)[0]), flush=True)


def _run(route, per_shard, devices, terminate_s, timeout_s):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join(filter(None, [
      env.get("XLA_FLAGS", ""),
      f"--xla_cpu_collective_call_terminate_timeout_seconds={terminate_s}"]))
  start = time.perf_counter()
  try:
    done = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", route,
         str(per_shard), str(devices)],
        env=env, capture_output=True, text=True, timeout=timeout_s,
        check=False)
  except subprocess.TimeoutExpired:
    return {"outcome": "hung", "seconds": time.perf_counter() - start}
  seconds = time.perf_counter() - start
  if done.returncode == 0 and done.stdout.strip() == f"{float(devices)}":
    outcome = "ok"
  elif "Termination timeout" in done.stderr:
    outcome = "aborted (rendezvous termination timeout)"
  else:
    outcome = f"failed (exit status {done.returncode})"
  return {"outcome": outcome, "seconds": seconds,
          "stderr_tail": done.stderr[-400:] if outcome != "ok" else ""}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--child", nargs=3, metavar=("ROUTE", "N", "DEVICES"))
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--sizes", type=int, nargs="*", default=_SIZES)
  parser.add_argument("--terminate-s", type=int, default=10)
  parser.add_argument("--out", help="write the results here as JSON")
  args = parser.parse_args()
  if args.child:
    route, per_shard, devices = args.child
    _child(route, int(per_shard), int(devices))
    return
  import jax  # pylint: disable=import-outside-toplevel
  import jaxlib  # pylint: disable=import-outside-toplevel

  results = {"environment": {"jax": jax.__version__,
                             "jaxlib": jaxlib.__version__,
                             "cpu devices": args.devices,
                             "cpus": os.cpu_count()},
             "terminate_s": args.terminate_s, "runs": []}
  for route in _ROUTES:
    for per_shard in args.sizes:
      run = _run(route, per_shard, args.devices, args.terminate_s,
                 timeout_s=6 * args.terminate_s + 60)
      run.update(route=route, float32_per_shard=per_shard,
                 bytes_per_shard=4 * per_shard)
      results["runs"].append(run)
      print(f"{route:16s} {4 * per_shard:>9,d} bytes/shard:"
            f" {run['outcome']} ({run['seconds']:.1f} s)", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=2)


if __name__ == "__main__":
  main()
