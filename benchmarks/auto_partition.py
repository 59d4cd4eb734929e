"""Automatic partitioning at 1, 2, 4 and 8 GPUs: a sharding rule under jit.

The same global matmul (A's rows split) and attention (heads split) as
``scaling.py``, over a mesh of each device count, four ways:

- ``jt_dist_rule_jit``: plain ``jax.jit`` of ``jt_dist.triton_call`` with a
  ``jt_dist.ShardingRule``, inputs on a mesh with explicit axes;
- ``jt_dist_sharded``: ``jt_dist.sharded_triton_call`` with specs;
- ``jax_triton_jit``: ``jax_triton.triton_call`` under plain ``jax.jit``,
  shapes as keyword metaparams (its users' way), inputs sharded on a mesh
  with automatic axes: XLA gathers them and every device runs the whole
  kernel (GPU only);
- ``xla``: XLA's own op on the sharded inputs.

Every function chains ``scaling.CHAIN`` calls in one ``jax.jit``, is
checked against XLA's result, and is timed in turns with the others of its
device count (``timing.interleaved_chained_each``). Each row also counts
the all-gathers and all-reduces in the compiled program.

    python benchmarks/auto_partition.py --out benchmarks/results/h200x1/auto_partition.json
    python benchmarks/auto_partition.py --smoke   # tiny sizes, any host
    python benchmarks/auto_partition.py --smoke --counts 2 --problems matmul
"""

import argparse
import collections
import functools
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
from jax.sharding import AxisType  # pylint: disable=g-import-not-at-top
import triton  # pylint: disable=g-import-not-at-top

import jt_dist  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import scaling  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

MATMUL_RULE = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})
ATTENTION_RULE = jt_dist.ShardingRule(
    "b h q d, b h k d, b h k d -> b h q d", whole=("q", "k", "d"))

_COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|all-to-all)(?:-start)?\(")


class Matmul(scaling.Matmul):
  """``scaling.Matmul`` with the kernel called under a sharding rule."""

  def rule_call(self, a, b):
    return jt_dist.triton_call(
        a, b, kernel=kernels.matmul_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=self.grid,
        sharding_rule=MATMUL_RULE, M=jt_dist.shard_size(0, axis=0),
        N=jt_dist.shard_size(1, axis=1), K=jt_dist.shard_size(0, axis=1),
        **self.options)


class Attention(scaling.Attention):
  """``scaling.Attention`` with the kernel called under a sharding rule."""

  def rule_call(self, q, k, v):
    return jt_dist.triton_call(
        q, k, v, kernel=kernels.attention_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=self._grid,
        sharding_rule=ATTENTION_RULE, **self._metaparams(q))


def _collectives(fn) -> dict:
  counts = collections.Counter(_COLLECTIVE.findall(fn.as_text()))
  return {f"{name}s": counts.get(name, 0)
          for name in ("all-gather", "all-reduce", "all-to-all")}


def _implementations(problem, mesh, jax_triton):
  """name -> (step, the mesh its inputs live on)."""
  impls = {
      "jt_dist_rule_jit": (problem.rule_call, mesh),
      "jt_dist_sharded": (functools.partial(problem.sharded, mesh), mesh),
      "xla": (problem.reference, mesh),
  }
  if jax_triton is not None:
    auto = scaling.make_mesh(mesh.size, AxisType.Auto)
    impls["jax_triton_jit"] = (
        functools.partial(problem.local, jax_triton.triton_call), auto)
  return impls


def _calls_for(problem, count, jax_triton, key):
  """label -> (compiled fn, args, work, collectives) at ``count`` devices."""
  extent = scaling.global_extent(problem)
  inputs = problem.inputs(extent, key)
  reference = jax.jit(scaling.chain(problem.reference))(*inputs)
  calls = {}
  for name, (step, mesh) in _implementations(
      problem, scaling.make_mesh(count), jax_triton).items():
    placed = scaling.place(inputs, mesh, problem.spec)
    fn = scaling.compiled(step, {}, placed)
    scaling.check(fn, placed, reference, f"{name}, {count} device(s)")
    calls[name] = (fn, placed, problem.work(extent), _collectives(fn))
  return calls


def bench_problem(problem, counts, sizes, jax_triton, record):
  key = jax.random.key(11)
  for count in counts:
    calls = scaling.calls_or_failure(
        lambda: _calls_for(problem, count, jax_triton, key),  # pylint: disable=cell-var-from-loop
        problem, count, record)
    if calls is None:
      continue
    seconds = timing.interleaved_chained_each(
        {name: (fn, args) for name, (fn, args, _, _) in calls.items()},
        iters=sizes["iters"], rounds=sizes["rounds"], shuffle_seed=0,
        settle=True)
    for name, (_, _, work, collectives) in calls.items():
      per_call = seconds[name] / scaling.CHAIN
      record(problem.name, name, count, ms=per_call * 1e3,
             **{problem.unit: work / per_call}, **collectives)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--problems", default="matmul,attention")
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--counts", default="1,2,4,8",
                      help="device counts to run, those present only")
  args = parser.parse_args(argv)
  sizes = dict(scaling.SIZES["smoke" if args.smoke else "full"])
  if args.rounds:
    sizes["rounds"] = args.rounds
  try:
    import jax_triton  # pylint: disable=g-import-not-at-top
  except Exception:  # pylint: disable=broad-except
    jax_triton = None
  if jax.devices()[0].platform != "gpu":
    jax_triton = None  # jax-triton lowers for GPUs only.
  counts = [int(c) for c in args.counts.split(",")
            if int(c) <= len(jax.devices())]
  results = []

  def record(case, impl, devices, **fields):
    row = {"case": case, "impl": impl, "devices": devices, **fields}
    results.append(row)
    print(row, flush=True)

  classes = {"matmul": Matmul, "attention": Attention}
  for name in args.problems.split(","):
    bench_problem(classes[name](sizes), counts, sizes, jax_triton, record)
  timing.print_table(results)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    environment = {
        "jax": jax.__version__, "triton": triton.__version__,
        "jax_triton": getattr(jax_triton, "__version__", None),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind}
    with open(args.out, "w") as f:
      json.dump({"environment": environment, "results": results}, f,
                indent=1)
  return results


if __name__ == "__main__":
  if "--smoke" in sys.argv:
    from jt_dist import testing  # pylint: disable=g-import-not-at-top
    testing.configure_cpu_devices(8)
  main()
