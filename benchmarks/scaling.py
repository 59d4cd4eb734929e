"""Strong scaling at 1, 2, 4 and 8 GPUs, each library called as its users do.

One process per host. For every device count up to the GPUs present, the
same global problem runs on a mesh of that many devices, and one shard's
problem runs alone on one GPU; every function runs 10 chained kernel calls
inside one ``jax.jit``, and all of a device count's functions are timed in
turns (``timing.interleaved_chained_each``), in a random order each round
and each after one untimed call of its own, so drifts in clocks and host
load, and the power state a previous function leaves, fall on all alike.

Implementations (columns of the benchmarks page's tables, docs/benchmarks.md):

- ``jt_dist_sharded``: ``jt_dist.sharded_triton_call`` with
  ``jt_dist.shard_size`` metaparams;
- ``jt_dist_shard_map``: a hand-written ``jax.shard_map`` around
  ``jt_dist.triton_call``;
- ``jax_triton_shard_map``: the same around ``jax_triton.triton_call``,
  shapes as keyword metaparams, as jax-triton's README and examples write it;
- ``xla``: XLA's own op on sharded inputs, behind an optimization barrier
  so that XLA runs one op per call as the kernels do, rather than fusing the
  chain of adds into one kernel that reads each input once;
- matmul only, labelled variants of ``jt_dist_shard_map``: the legacy
  custom-call target, the FFI target without the CUBIN, and both libraries
  in the scalar-argument form (M, N, K as runtime integers, which jax-triton
  0.3.1 does not specialise), on one GPU.

    python benchmarks/scaling.py --out benchmarks/results/h200x1/scaling.json
    python benchmarks/scaling.py --smoke    # tiny sizes, any host
"""

import argparse
import functools
import json
import math
import os
import sys
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
from jax.sharding import AxisType  # pylint: disable=g-import-not-at-top
from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import triton  # pylint: disable=g-import-not-at-top

import jt_dist  # pylint: disable=g-import-not-at-top
from jt_dist._gpu import lowering as _gpu_lowering  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

CHAIN = 10  # Kernel calls per jitted function, each feeding the next.
_AGAIN = "jt_dist_sharded (timed again)"

SIZES = {
    "full": dict(matmul=8192, attention=(8, 16, 4096, 64), add=1 << 28,
                 rounds=21, iters=2, blocks=(64, 64),
                 matmul_config=kernels.MATMUL_CONFIG,
                 matmul_options=kernels.MATMUL_OPTIONS),
    "smoke": dict(matmul=64, attention=(2, 8, 32, 16), add=1 << 12,
                  rounds=2, iters=1, blocks=(16, 16),
                  matmul_config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
                                     GROUP_M=2),
                  matmul_options={}),
}


def make_mesh(count, axis_type=AxisType.Explicit):
  """A 1-D mesh "x" over the first ``count`` devices."""
  return jax.make_mesh((count,), ("x",), devices=jax.devices()[:count],
                       axis_types=(axis_type,))


def chain(step):
  """``CHAIN`` calls of ``step(x, *rest)``, each output the next ``x``."""
  def run(x, *rest):
    for _ in range(CHAIN):
      x = step(x, *rest)
    return x
  return run


# --- The three problems, each written once per library ----------------------


class Matmul:
  """C = A @ B with A's rows split; B is scaled so that chaining keeps C ~ 1."""

  name, spec, unit = "matmul_rows_bf16", (P("x"), P()), "TFLOPs"

  def __init__(self, sizes):
    self.m = sizes["matmul"]
    self.options = {**sizes["matmul_options"], **sizes["matmul_config"]}

  def work(self, rows):
    return 2 * rows * self.m * self.m / 1e12

  def inputs(self, rows, key):
    a = jax.random.normal(key, (rows, self.m), jnp.bfloat16)
    b = jax.random.normal(jax.random.fold_in(key, 1), (self.m, self.m),
                          jnp.float32) / math.sqrt(self.m)
    return a, b.astype(jnp.bfloat16)

  def reference(self, a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)

  def grid(self, meta):
    return (triton.cdiv(meta["M"], meta["BLOCK_M"])
            * triton.cdiv(meta["N"], meta["BLOCK_N"]),)

  def local(self, call, a, b, **extra):
    return call(a, b, kernel=kernels.matmul_kw_kernel,
                out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
                grid=self.grid, M=a.shape[0], N=b.shape[1], K=a.shape[1],
                **self.options, **extra)

  def scalar_form(self, call, a, b):
    # jax-triton's grid callable sees metaparams only, not scalar arguments.
    m, n = a.shape[0], b.shape[1]
    return call(a, b, m, n, a.shape[1], kernel=kernels.matmul_kernel,
                out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
                grid=lambda meta: self.grid({**meta, "M": m, "N": n}),
                **self.options)

  def sharded(self, mesh, a, b):
    return jt_dist.sharded_triton_call(
        a, b, kernel=kernels.matmul_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=self.grid,
        mesh=mesh, in_specs=self.spec, out_specs=P("x"),
        M=jt_dist.shard_size(0, axis=0), N=b.shape[1], K=a.shape[1],
        **self.options)


class Attention:
  """Attention over [B, H, S, D] with the heads split."""

  name, spec, unit = "attention_heads_bf16", (P(None, "x"),) * 3, "TFLOPs"

  def __init__(self, sizes):
    self.shape = sizes["attention"]
    self.blocks = sizes["blocks"]

  def work(self, heads):
    batch, _, seq, dim = self.shape
    return 4 * batch * heads * seq * seq * dim / 1e12

  def inputs(self, heads, key):
    shape = (self.shape[0], heads, *self.shape[2:])
    return tuple(jax.random.normal(jax.random.fold_in(key, i), shape,
                                   jnp.bfloat16) for i in range(3))

  def reference(self, q, k, v):
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
    p = jax.nn.softmax(scores / math.sqrt(q.shape[-1]), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v)

  def _grid(self, meta):
    batch, heads = meta["q_ptr"].shape[:2]
    return (triton.cdiv(meta["seq_len"], meta["BLOCK_M"]), batch * heads)

  def _metaparams(self, q):
    return dict(seq_len=q.shape[2], sm_scale=1.0 / math.sqrt(q.shape[3]),
                HEAD_DIM=q.shape[3], BLOCK_M=self.blocks[0],
                BLOCK_N=self.blocks[1])

  def local(self, call, q, k, v, **extra):
    batch, heads, seq, _ = q.shape
    return call(q, k, v, kernel=kernels.attention_kw_kernel,
                out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
                grid=(triton.cdiv(seq, self.blocks[0]), batch * heads),
                **self._metaparams(q), **extra)

  def sharded(self, mesh, q, k, v):
    return jt_dist.sharded_triton_call(
        q, k, v, kernel=kernels.attention_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=self._grid,
        mesh=mesh, in_specs=self.spec, out_specs=P(None, "x"),
        **self._metaparams(q))


class Add:
  """out = x + y over 1-D fp32 arrays, split evenly."""

  name, spec, unit = "add_fp32", (P("x"), P("x")), "GBps"

  def __init__(self, sizes):
    self.n = sizes["add"]

  def work(self, n):
    return 12 * n / 1e9

  def inputs(self, n, key):
    return (jax.random.normal(key, (n,), jnp.float32),
            jax.random.normal(jax.random.fold_in(key, 1), (n,), jnp.float32))

  def reference(self, x, y):
    return x + y

  def local(self, call, x, y, **extra):
    return call(x, y, x.size, kernel=kernels.add_kernel,
                out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                grid=(triton.cdiv(x.size, kernels.ADD_BLOCK),),
                BLOCK=kernels.ADD_BLOCK, **extra)

  def sharded(self, mesh, x, y):
    return jt_dist.sharded_triton_call(
        x, y, jt_dist.shard_size(0), kernel=kernels.add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),),
        mesh=mesh, in_specs=self.spec, out_specs=P("x"),
        BLOCK=kernels.ADD_BLOCK)


def global_extent(problem):
  """The extent the mesh splits: rows, heads or elements."""
  if isinstance(problem, Matmul):
    return problem.m
  if isinstance(problem, Attention):
    return problem.shape[1]
  return problem.n


# --- Building the functions -------------------------------------------------


def _shard_map(mesh, body, problem, check_vma=True):
  out_spec = problem.spec[0]
  return jax.shard_map(body, mesh=mesh, in_specs=problem.spec,
                       out_specs=out_spec, check_vma=check_vma)


def _unfused(reference):
  return lambda *args: jax.lax.optimization_barrier(reference(*args))


def _implementations(problem, mesh, jax_triton):
  """name -> (step function, lowering choices) on ``mesh``."""
  local = problem.local
  impls = {
      "jt_dist_sharded": (functools.partial(problem.sharded, mesh), {}),
      "jt_dist_shard_map": (
          _shard_map(mesh, functools.partial(local, jt_dist.triton_call),
                     problem), {}),
      "xla": (_unfused(problem.reference), {}),
  }
  if jax_triton is not None:
    # jax-triton gives no varying-axes types, so check_vma must be off.
    impls["jax_triton_shard_map"] = (
        _shard_map(mesh, functools.partial(local, jax_triton.triton_call),
                   problem, check_vma=False), {})
  if isinstance(problem, Matmul) and jax.devices()[0].platform == "gpu":
    bare = impls["jt_dist_shard_map"][0]
    impls["jt_dist_shard_map[legacy target]"] = (
        _shard_map(mesh, functools.partial(
            local, jt_dist.triton_call,
            custom_call_target_name="triton_kernel_call"), problem), {})
    impls["jt_dist_shard_map[FFI, no CUBIN]"] = (
        bare, {"module_images": False})
  return impls


def compiled(step, choices, args):
  """The chained function, compiled with ``choices`` for the serialised call."""
  fn = jax.jit(chain(step))
  with mock.patch.object(_gpu_lowering, "proto_choices",
                         _gpu_lowering.ProtoChoices(**choices)):
    return fn.trace(*args).lower().compile()


def place(args, mesh, spec):
  return tuple(jax.device_put(a, NamedSharding(mesh, s))
               for a, s in zip(args, spec))


def check(fn, args, reference, label):
  out = np.asarray(fn(*args), np.float32)
  error = timing.relative_error(out, np.asarray(reference, np.float32))
  if not error < 2e-2:
    raise AssertionError(f"{label}: relative error {error:.3g}")


# --- Timing ------------------------------------------------------------------


def _placement_calls(problem, extent, mesh, where, jax_triton, key):
  """Every implementation on ``mesh`` over ``extent``, compiled and checked."""
  inputs = problem.inputs(extent, key)
  placed = place(inputs, mesh, problem.spec)
  reference = jax.jit(chain(problem.reference))(*inputs)
  calls = {}
  for name, (step, choices) in _implementations(
      problem, mesh, jax_triton).items():
    fn = compiled(step, choices, placed)
    check(fn, placed, reference, f"{name}, {where}, {mesh.size} device(s)")
    calls[(name, where)] = (fn, placed, problem.work(extent))
  return calls


def _calls_for(problem, count, jax_triton, key):
  """Every function to time at ``count`` devices: label -> (fn, args, work)."""
  extent = global_extent(problem)
  calls = _placement_calls(problem, extent, make_mesh(count), "mesh",
                           jax_triton, key)
  # The headline function once more, as its own entry: the spread between
  # the two is the run's noise, against which differences are read.
  calls[(_AGAIN, "mesh")] = calls[("jt_dist_sharded", "mesh")]
  if count > 1:
    calls.update(_placement_calls(problem, extent // count, make_mesh(1),
                                  "shard_alone", jax_triton,
                                  jax.random.fold_in(key, count)))
  return calls


def _scalar_form_calls(problem, jax_triton, key):
  """The scalar-argument matmul on one GPU, for each library."""
  if not isinstance(problem, Matmul):
    return {}
  libs = {"jt_dist": jt_dist.triton_call}
  if jax_triton is not None:
    libs["jax_triton"] = jax_triton.triton_call
  args = problem.inputs(problem.m, key)
  args = tuple(jax.device_put(a, jax.devices()[0]) for a in args)
  reference = jax.jit(chain(problem.reference))(*args)
  calls = {}
  for lib, call in libs.items():
    fn = jax.jit(chain(functools.partial(problem.scalar_form, call)))
    check(fn, args, reference, f"{lib} scalar form")
    calls[(f"{lib}[scalar-argument form]", "mesh")] = (
        fn, args, problem.work(problem.m))
  return calls


def _timed(calls, sizes):
  """Median seconds per jitted call, in random order with settled clocks.

  jax-triton's scalar-argument form is timed on its own: it runs 15x
  slower at a fraction of the power, and whatever follows it would start
  on boosted clocks (jt_dist's scalar form measured 14% faster when timed
  beside it than beside the keyword forms).
  """
  alone = "jax_triton[scalar-argument form]"
  groups = [{k: v for k, v in calls.items() if k[0] != alone},
            {k: v for k, v in calls.items() if k[0] == alone}]
  seconds = {}
  for group in groups:
    if group:
      seconds.update(timing.interleaved_chained_each(
          {k: (fn, args) for k, (fn, args, _) in group.items()},
          iters=sizes["iters"], rounds=sizes["rounds"], shuffle_seed=0,
          settle=True))
  return seconds


def calls_or_failure(make, problem, count, record):
  """``make()``; or, where it raises, None and the failure as a result row.

  One device count that cannot be built or checked (say, out of memory)
  leaves the other counts' rows standing.
  """
  try:
    return make()
  except Exception as e:  # pylint: disable=broad-except
    record(problem.name, "FAILED", count,
           error=f"{type(e).__name__}: {e}"[:500])
    return None


def bench_problem(problem, counts, sizes, jax_triton, record):
  key = jax.random.key(11)

  def make(count):
    calls = _calls_for(problem, count, jax_triton, key)
    if count == 1:
      calls.update(_scalar_form_calls(problem, jax_triton, key))
    return calls

  for count in counts:
    calls = calls_or_failure(lambda: make(count), problem, count, record)  # pylint: disable=cell-var-from-loop
    if calls is None:
      continue
    seconds = _timed(calls, sizes)
    for (name, where), (_, _, work) in calls.items():
      per_call = seconds[(name, where)] / CHAIN
      record(problem.name, name, count, where=where, ms=per_call * 1e3,
             **{problem.unit: work / per_call})


def _ratio_rows(results):
  """jt_dist_sharded over its peers, per problem and device count."""
  by_key = {(r["case"], r["impl"], r["devices"], r.get("where")): r
            for r in results if "error" not in r}
  rows = []
  for (case, impl, count, where), row in by_key.items():
    if impl != "jt_dist_sharded":
      continue
    unit = "TFLOPs" if "TFLOPs" in row else "GBps"
    for peer in ("jax_triton_shard_map", "jt_dist_shard_map", "xla", _AGAIN):
      other = by_key.get((case, peer, count, where))
      if other:
        rows.append({"case": case, "devices": count, "where": where,
                     "ratio": f"jt_dist_sharded / {peer}",
                     "value": row[unit] / other[unit]})
  return rows


def _print_table(results, ratios):
  print("\n| case | devices | where | impl | ms per call | rate |")
  print("| --- | --- | --- | --- | --- | --- |")
  for r in results:
    if "error" in r:
      print(f"| {r['case']} | {r['devices']} | | {r['impl']} | {r['error']} | |")
      continue
    unit = "TFLOPs" if "TFLOPs" in r else "GBps"
    print(f"| {r['case']} | {r['devices']} | {r['where']} | {r['impl']} |"
          f" {r['ms']:.4f} | {r[unit]:.1f} {unit} |")
  print("\n| case | devices | where | ratio | value |\n| --- | --- | --- | --- | --- |")
  for r in ratios:
    print(f"| {r['case']} | {r['devices']} | {r['where']} | {r['ratio']} |"
          f" {r['value']:.3f} |")


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--problems", default="matmul,attention,add")
  parser.add_argument("--rounds", type=int, default=None)
  args = parser.parse_args(argv)
  sizes = dict(SIZES["smoke" if args.smoke else "full"])
  if args.rounds:
    sizes["rounds"] = args.rounds
  try:
    import jax_triton  # pylint: disable=g-import-not-at-top
  except Exception:  # pylint: disable=broad-except
    jax_triton = None
  if jax.devices()[0].platform != "gpu":
    jax_triton = None  # jax-triton lowers for GPUs only.
  available = len(jax.devices())
  counts = [c for c in (1, 2, 4, 8) if c <= available]
  results = []

  def record(case, impl, devices, **fields):
    row = {"case": case, "impl": impl, "devices": devices, **fields}
    results.append(row)
    print(row, flush=True)

  classes = {"matmul": Matmul, "attention": Attention, "add": Add}
  for name in args.problems.split(","):
    bench_problem(classes[name](sizes), counts, sizes, jax_triton, record)
  ratios = _ratio_rows(results)
  _print_table(results, ratios)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    environment = {
        "jax": jax.__version__, "triton": triton.__version__,
        "jax_triton": getattr(jax_triton, "__version__", None),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind}
    with open(args.out, "w") as f:
      json.dump({"environment": environment, "results": results,
                 "ratios": ratios}, f, indent=1)
  return results


if __name__ == "__main__":
  if "--smoke" in sys.argv:
    from jt_dist import testing  # pylint: disable=g-import-not-at-top
    testing.configure_cpu_devices(8)
  main()
