"""Kernel time: strong scaling, sharding rules, and jax.vmap's batched grid.

``scaling``: at 1, 2, 4 and 8 devices (as many as the host has), the same
global problem (a row-split bf16 matmul, attention split over heads, a
1 GiB fp32 add) on a mesh of that many devices, and one shard's problem
alone on one device, each library called its users' way:
``jt_dist.sharded_triton_call`` (timed twice: the spread is the run's
noise), a hand-written ``jax.shard_map`` around jt_dist's or jax-triton's
``triton_call``, and XLA's own op behind an optimization barrier.
``auto_partition``: the matmul and attention under plain ``jax.jit`` with
a ``jt_dist.ShardingRule``, against the same alternatives, with the
collectives each program holds. ``vmap_grid``: ``jax.vmap`` of a small add
and a row softmax, one launch over a grid extended by the batch against
one launch per element and XLA's batched op.

Every function chains ``CHAIN`` kernel calls in one ``jax.jit``, is checked
against XLA's result, then timed in turns (``timing.chained``).
"""

import collections
import functools
import math
import re

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import triton

from examples import softmax as softmax_example
import jt_dist
import kernels
import timing

try:
  import jax_triton  # pylint: disable=g-import-not-at-top
except Exception:  # pylint: disable=broad-except
  jax_triton = None

CHAIN = 10  # Kernel calls per jitted function, each feeding the next.
_AGAIN = "jt_dist_sharded (timed again)"

SIZES = {
    "full": dict(matmul=8192, attention=(8, 16, 4096, 64), add=1 << 28,
                 rounds=21, iters=2, blocks=(64, 64),
                 matmul_config=kernels.MATMUL_CONFIG,
                 matmul_options=kernels.MATMUL_OPTIONS),
    "quick": dict(matmul=64, attention=(2, 8, 32, 16), add=1 << 12,
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
    self.m = self.extent = sizes["matmul"]
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
    self.extent = self.shape[1]  # Heads.
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
    self.n = self.extent = sizes["add"]

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


# --- Building the functions -------------------------------------------------


def _shard_map(mesh, body, problem, check_vma=True):
  return jax.shard_map(body, mesh=mesh, in_specs=problem.spec,
                       out_specs=problem.spec[0], check_vma=check_vma)


def _implementations(problem, mesh):
  """name -> step function on ``mesh``."""
  local = problem.local
  impls = {
      "jt_dist_sharded": functools.partial(problem.sharded, mesh),
      "jt_dist_shard_map": _shard_map(
          mesh, functools.partial(local, jt_dist.triton_call), problem),
      "xla": lambda *args: jax.lax.optimization_barrier(
          problem.reference(*args)),
  }
  if _jax_triton() is not None:
    # jax-triton gives no varying-axes types, so check_vma must be off.
    impls["jax_triton_shard_map"] = _shard_map(
        mesh, functools.partial(local, _jax_triton().triton_call), problem,
        check_vma=False)
  return impls


def _jax_triton():
  """jax-triton where it lowers (GPUs only), else None."""
  return jax_triton if jax.devices()[0].platform == "gpu" else None


def compiled(step, args):
  return jax.jit(chain(step)).trace(*args).lower().compile()


def place(args, mesh, spec):
  return tuple(jax.device_put(a, NamedSharding(mesh, s))
               for a, s in zip(args, spec))


def check(fn, args, reference, label):
  error = timing.relative_error(fn(*args), reference)
  if not error < 2e-2:
    raise AssertionError(f"{label}: relative error {error:.3g}")


def _placement_calls(problem, extent, mesh, where, key):
  """Every implementation on ``mesh`` over ``extent``, compiled and checked."""
  inputs = problem.inputs(extent, key)
  placed = place(inputs, mesh, problem.spec)
  reference = jax.jit(chain(problem.reference))(*inputs)
  calls = {}
  for name, step in _implementations(problem, mesh).items():
    fn = compiled(step, placed)
    check(fn, placed, reference, f"{name}, {where}, {mesh.size} device(s)")
    calls[(name, where)] = (fn, placed, problem.work(extent))
  return calls


def _calls_for(problem, count, key):
  """Every function to time at ``count`` devices: label -> (fn, args, work)."""
  extent = problem.extent
  calls = _placement_calls(problem, extent, make_mesh(count), "mesh", key)
  # The headline function once more, as its own entry: the spread between
  # the two is the run's noise, against which differences are read.
  calls[(_AGAIN, "mesh")] = calls[("jt_dist_sharded", "mesh")]
  if count > 1:
    calls.update(_placement_calls(problem, extent // count, make_mesh(1),
                                  "shard_alone", jax.random.fold_in(key, count)))
  return calls


def _counts(quick):
  """Device counts to run: those the host has (quick: 1 and 2)."""
  return [c for c in ((1, 2) if quick else (1, 2, 4, 8))
          if c <= len(jax.devices())]


def _problem_rows(problem, make, sizes):
  """Per device count, ``make(count)``'s functions timed; a count that
  cannot be built or checked (out of memory, say) is a row of its own."""
  rows = []
  for count in _counts(sizes is SIZES["quick"]):
    try:
      calls = make(count)
    except Exception as e:  # pylint: disable=broad-except
      rows.append({"case": problem.name, "impl": "FAILED", "devices": count,
                   "error": f"{type(e).__name__}: {e}"[:300]})
      continue
    seconds = timing.chained(
        {k: (fn, args) for k, (fn, args, *_) in calls.items()},
        iters=sizes["iters"], rounds=sizes["rounds"], settle=True)
    for label, (_, _, work, *extra) in calls.items():
      name, where = label if isinstance(label, tuple) else (label, None)
      per_call = seconds[label] / CHAIN
      rows.append({"case": problem.name, "impl": name, "devices": count,
                   **({"where": where} if where else {}),
                   "ms": per_call * 1e3, problem.unit: work / per_call,
                   **(extra[0] if extra else {})})
  return rows


def scaling(quick):
  sizes = SIZES["quick" if quick else "full"]
  key = jax.random.key(11)
  rows = []
  for problem in (Matmul(sizes), Attention(sizes), Add(sizes)):
    rows += _problem_rows(problem, lambda count, p=problem: _calls_for(
        p, count, key), sizes)
  return _with_failures(sizes, rows)


def _with_failures(sizes, rows):
  return {"sizes": sizes, "results": rows,
          "failed": any(r["impl"] == "FAILED" for r in rows)}


MATMUL_RULE = jt_dist.ShardingRule("i k, k j -> i j", reductions={"k": "sum"})
ATTENTION_RULE = jt_dist.ShardingRule(
    "b h q d, b h k d, b h k d -> b h q d", whole=("q", "k", "d"))
_COLLECTIVE = re.compile(r"\b(all-gather|all-reduce|all-to-all)(?:-start)?\(")


def _matmul_rule_call(problem, a, b):
  return jt_dist.triton_call(
      a, b, kernel=kernels.matmul_kw_kernel,
      out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=problem.grid,
      sharding_rule=MATMUL_RULE, M=jt_dist.shard_size(0, axis=0),
      N=jt_dist.shard_size(1, axis=1), K=jt_dist.shard_size(0, axis=1),
      **problem.options)


def _attention_rule_call(problem, q, k, v):
  return jt_dist.triton_call(
      q, k, v, kernel=kernels.attention_kw_kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=problem._grid,  # pylint: disable=protected-access
      sharding_rule=ATTENTION_RULE, **problem._metaparams(q))  # pylint: disable=protected-access


def _collectives(fn):
  counts = collections.Counter(_COLLECTIVE.findall(fn.as_text()))
  return {f"{name}s": counts.get(name, 0)
          for name in ("all-gather", "all-reduce", "all-to-all")}


def _rule_calls(problem, rule_call, count, key):
  """name -> (compiled fn, args, work, collectives) at ``count`` devices."""
  mesh = make_mesh(count)
  impls = {"jt_dist_rule_jit": (functools.partial(rule_call, problem), mesh),
           "jt_dist_sharded": (functools.partial(problem.sharded, mesh), mesh),
           "xla": (problem.reference, mesh)}
  if _jax_triton() is not None:
    impls["jax_triton_jit"] = (functools.partial(
        problem.local, _jax_triton().triton_call),
                               make_mesh(count, AxisType.Auto))
  extent = problem.extent
  inputs = problem.inputs(extent, key)
  reference = jax.jit(chain(problem.reference))(*inputs)
  calls = {}
  for name, (step, on) in impls.items():
    placed = place(inputs, on, problem.spec)
    fn = compiled(step, placed)
    check(fn, placed, reference, f"{name}, {count} device(s)")
    calls[name] = (fn, placed, problem.work(extent), _collectives(fn))
  return calls


def auto_partition(quick):
  sizes = SIZES["quick" if quick else "full"]
  key = jax.random.key(11)
  rows = []
  for problem, rule_call in ((Matmul(sizes), _matmul_rule_call),
                             (Attention(sizes), _attention_rule_call)):
    rows += _problem_rows(problem, lambda count, p=problem, r=rule_call:
                          _rule_calls(p, r, count, key), sizes)
  return _with_failures(sizes, rows)


VMAP_SIZES = {
    # add: elements per batch element; softmax: (rows, columns) per element.
    "full": dict(batches=(1, 4, 16, 64, 256, 1024), add=4096,
                 softmax=(16, 256), iters=20, rounds=15),
    "quick": dict(batches=(1, 3), add=64, softmax=(2, 16), iters=2,
                  rounds=3),
}


def _vmap_add(x, y, **options):
  return jt_dist.triton_call(
      x, y, x.size, kernel=kernels.add_kernel, out_shape=x,
      grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),),
      BLOCK=min(kernels.ADD_BLOCK, triton.next_power_of_2(x.size)),
      **options)


def _vmap_softmax(x, **options):
  n_rows, n_cols = x.shape
  return jt_dist.triton_call(
      x, n_cols, n_cols, n_cols, kernel=softmax_example.softmax_kernel,
      out_shape=x, grid=(n_rows,), BLOCK=triton.next_power_of_2(n_cols),
      **options)


def vmap_grid(quick):
  sizes = VMAP_SIZES["quick" if quick else "full"]
  cases = {"add": (_vmap_add, jnp.add, [(sizes["add"],)] * 2),
           "softmax": (_vmap_softmax, functools.partial(jax.nn.softmax,
                                                        axis=-1),
                       [sizes["softmax"]])}
  key = jax.random.key(5)
  rows = []
  for name, (call, xla_op, shapes) in cases.items():
    for batch in sizes["batches"]:
      key, *keys = jax.random.split(key, len(shapes) + 1)
      args = [jax.random.normal(k, (batch, *s), jnp.float32)
              for k, s in zip(keys, shapes)]
      fns = {"grid": jax.jit(jax.vmap(call)),
             "sequential": jax.jit(jax.vmap(functools.partial(
                 call, vmap_method="sequential"))),
             "xla": jax.jit(xla_op)}
      expected = fns["xla"](*args)
      for impl in ("grid", "sequential"):
        error = timing.relative_error(fns[impl](*args), expected)
        if error > 1e-5:
          raise AssertionError(f"{name} batch {batch} {impl}: relative"
                               f" error {error:.3g} against XLA")
      seconds = timing.chained({k: (f, args) for k, f in fns.items()},
                               sizes["iters"], sizes["rounds"])
      rows += [{"case": f"vmap {name}", "impl": impl, "batch": batch,
                "us": s * 1e6} for impl, s in seconds.items()]
  return {"sizes": sizes, "results": rows}


SUITES = {"scaling": scaling, "auto_partition": auto_partition,
          "vmap_grid": vmap_grid}
