"""Eager and jitted dispatch of a 1,024-float add: XLA, jax-triton, jt_dist.

Both suites time cases from ``_cases``, one call followed by a sync on two
random vectors of 1,024 float32, in turns (``timing.per_call``); what each
case and figure is, docs/benchmarks.md ("Eager dispatch") says.

``dispatch``: each case's median, quartiles and medians over the even and
the odd rounds, the ratios, the jitted functions' custom calls, jax's
Python functions run per call, a first call, and a per-step scalar.

``python_wall_cost``: the wall time a hot microsecond of Python costs
after a sync, and jt_dist's own Python per eager call, unsharded (hot, its
jitted function a stub, and after a sync) and sharded over every device.

To add a case, add it to ``_cases``.
"""

import cProfile
import functools
import os
import pstats
import re
from unittest import mock

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import triton

import jt_dist
from jt_dist._call import memo as _memo  # pylint: disable=g-bad-import-order
import kernels
import timing

try:
  import jax_triton  # pylint: disable=g-import-not-at-top
except Exception as e:  # pylint: disable=broad-except
  jax_triton = None
  NOTE = f"jax_triton not importable: {type(e).__name__}: {e}"
else:
  NOTE = None

SIZE = BLOCK = 1024
BOUND = 1.2  # The target: an eager triton_call at most 1.2x XLA's a + b.
PADS = (0, 4, 16, 48)
SIZES = {
    "full": dict(rounds=600, calls=5, first_calls=30, scalar_calls=300,
                 wall_rounds=400, hot_calls=2000),
    "quick": dict(rounds=6, calls=2, first_calls=2, scalar_calls=5,
                  wall_rounds=3, hot_calls=20),
}


def _inputs(seed):
  key = jax.random.key(seed)
  return (jax.random.normal(key, (SIZE,), jnp.float32),
          jax.random.normal(jax.random.fold_in(key, 1), (SIZE,), jnp.float32))


def held_kernel_call():
  """``kernels.add_kw``'s call as a ``jt_dist.kernel_call``, made once."""
  return jt_dist.kernel_call(
      kernels.add_kw_kernel, out_shape=jax.ShapeDtypeStruct((SIZE,),
                                                            jnp.float32),
      grid=(triton.cdiv(SIZE, BLOCK),), n_elements=SIZE, BLOCK_SIZE=BLOCK)


def filed_call(memo, fn, args):
  """The call object ``fn(*args)`` files in ``memo`` (emptied by the caller).

  Read through the memo's ``put``: entries that are no call are passed
  over, and a call filed under several keys counts once.
  """
  with mock.patch.object(memo, "put", wraps=memo.put) as put:
    timing.block(fn(*args))
  calls = list({id(c.args[1]): c.args[1] for c in put.call_args_list
                if callable(getattr(c.args[1], "_jitted", None))}.values())
  assert len(calls) == 1, f"{len(calls)} calls filed, not 1"
  return calls[0]


MESH1_SPECS = dict(in_specs=(P("x"), P("x")), out_specs=P("x"))


def sharded_eager(mesh):
  """``kernels.add_kw`` as an eager ``sharded_triton_call`` over ``mesh``."""
  def call(a, b):
    n = a.size // mesh.size  # Per shard.
    return jt_dist.sharded_triton_call(
        a, b, kernel=kernels.add_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=(triton.cdiv(n, BLOCK),), mesh=mesh, **MESH1_SPECS,
        n_elements=n, BLOCK_SIZE=BLOCK)
  return call


def held_sharded_kernel_call(mesh):
  """The same as a ``jt_dist.sharded_kernel_call``, made once."""
  n = SIZE // mesh.size
  return jt_dist.sharded_kernel_call(
      kernels.add_kw_kernel, out_shape=jax.ShapeDtypeStruct((SIZE,),
                                                            jnp.float32),
      grid=(triton.cdiv(n, BLOCK),), mesh=mesh, **MESH1_SPECS,
      n_elements=n, BLOCK_SIZE=BLOCK)


def _with_caller_args(fn, pad=None):
  """``pad``, the caller's share of a Triton call (out_shape, grid, size), ``fn``."""
  def case(a, b):
    if pad is not None:
      pad()
    jax.ShapeDtypeStruct(a.shape, a.dtype)
    (triton.cdiv(a.size, BLOCK),)  # pylint: disable=expression-not-assigned
    a.size  # pylint: disable=pointless-statement
    return fn(a, b)
  return case


def _cases():
  """name -> function of (x, y), each checked against x + y."""
  jt = jt_dist.triton_call
  mesh1 = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
  cases = {
      "xla_eager": lambda a, b: a + b,
      "xla_jit": jax.jit(lambda a, b: a + b),
      "jt_dist_eager": lambda a, b: kernels.add_kw(jt, a, b),
      "jt_dist_jit": jax.jit(lambda a, b: kernels.add_kw(jt, a, b)),
      "jt_dist_scalar_n_eager": lambda a, b: kernels.add(jt, a, b),
      "jt_dist_scalar_n_jit": jax.jit(lambda a, b: kernels.add(jt, a, b)),
      # Made here, once, as a hot loop would hold them.
      "jt_dist_kernel_call_eager": held_kernel_call(),
      "jt_dist_sharded_1dev_eager": sharded_eager(mesh1),
      "jt_dist_sharded_kernel_call_1dev_eager": held_sharded_kernel_call(
          mesh1),
  }
  if jax_triton is not None:
    jxt = jax_triton.triton_call
    cases["jax_triton_eager"] = lambda a, b: kernels.add_kw(jxt, a, b)
    cases["jax_triton_jit"] = jax.jit(lambda a, b: kernels.add_kw(jxt, a, b))
  for name, fn in cases.items():  # Fresh random inputs per case.
    x, y = _inputs(int.from_bytes(os.urandom(4), "little"))
    np.testing.assert_allclose(np.asarray(fn(x, y)), np.asarray(x) + y,
                               rtol=1e-6, err_msg=name)
  return cases


def _ratios(med):
  """Each case over XLA's (eager or jit), and the pairs worth comparing."""
  pairs = [(c, "xla_jit" if "jit" in c else "xla_eager") for c in med
           if not c.startswith("xla")]
  pairs += [(f"jt_dist_{m}", f"jax_triton_{m}") for m in ("eager", "jit")]
  pairs += [("jt_dist_kernel_call_eager", "jax_triton_eager"),
            ("jt_dist_eager", "jt_dist_kernel_call_eager"),
            ("jt_dist_sharded_1dev_eager", "jt_dist_eager"),
            ("jt_dist_sharded_kernel_call_1dev_eager",
             "jt_dist_kernel_call_eager")]
  return [{"case": "ratios", "impl": f"{a} / {b}", "ratio": med[a] / med[b]}
          for a, b in pairs if a in med and b in med]


def _jax_python_calls(fn, args, calls=5):
  """jax's Python dispatch functions run per call of ``fn`` (0: C++)."""
  timing.block(fn(*args))
  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(calls):
    fn(*args)
  profiler.disable()
  # jax's dispatch modules only: a CPU call's host callback runs others.
  return sum(n for (path, _, _), (n, *_) in pstats.Stats(profiler).stats.items()
             if os.sep + "jax" + os.sep in path and os.path.basename(path)
             in ("pjit.py", "api.py", "dispatch.py", "pxla.py")) / calls


def _hlo_rows(cases, args):
  """The custom calls each jitted library function lowers to."""
  rows = []
  for name in ("jt_dist_jit", "jax_triton_jit"):
    if name in cases:
      text = cases[name].lower(*args).as_text(dialect="hlo")
      rows.append({
          "case": "custom calls of the jitted functions", "impl": name,
          "target": ", ".join(re.findall(r'custom_call_target="([^"]+)"',
                                         text)),
          "api_version": ", ".join(re.findall(r"api_version=(\w+)", text)),
          "instructions": sum(" = " in line for line in text.splitlines())})
  return rows


def first_call(args, calls):
  """One call and a sync with only the compiled Triton kernel kept, µs."""
  ways = {"triton_call, memo emptied": (
              lambda: kernels.add_kw(jt_dist.triton_call, *args),
              _memo.triton_calls.clear),
          "kernel_call made afresh": (lambda: held_kernel_call()(*args),
                                      lambda: None)}
  rows = []
  for name, (fn, before) in ways.items():
    each = []
    for _ in range(calls):
      before()
      each.append(timing.once(fn))
    rows.append({"case": "a first call, eagerly", "impl": name,
                 "us": float(np.median(each)) * 1e6, "calls": calls})
  _memo.triton_calls.clear()
  return rows


def scale(x, s, keyword=False):
  """``x * s``, ``s`` by position or (as jax-triton 0.4 allows) keyword."""
  return jt_dist.triton_call(
      x, *(() if keyword else (s,)), kernel=kernels.scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, BLOCK),), n_elements=x.size,
      BLOCK_SIZE=BLOCK, **({"s": s} if keyword else {}))


xla_scale = jax.jit(lambda a, s: a * s)


def per_step_scalar(x, calls):
  """Eager ``x * s``, ``s`` by position and by keyword: one ``s`` throughout
  or a new one every call, each call beside XLA's jitted ``x * s`` given the
  same float. ``executables``: the calls ``triton_call`` filed over both."""
  rows = []
  for way, jt in (("", scale),
                  (", s=", functools.partial(scale, keyword=True))):
    _memo.triton_calls.clear()
    pair = {fn: {"case": "a per-step scalar, eagerly", "impl": name + way}
            for fn, name in ((jt, "jt_dist"), (xla_scale, "XLA x * s"))}
    with mock.patch.object(_memo.triton_calls, "put",
                           wraps=_memo.triton_calls.put) as put:
      for fn in pair:
        timing.block(fn(x, 0.5))
      for name, values in (("same_value_us", [0.5] * calls),
                           ("new_value_us",
                            [1.0 + 1e-4 * (i + 1) for i in range(calls)])):
        each = {fn: [] for fn in pair}
        for s in values:
          for fn, times in each.items():
            times.append(timing.once(lambda: fn(x, s)))  # pylint: disable=cell-var-from-loop
        for fn, times in each.items():
          pair[fn][name] = float(np.median(times)) * 1e6
    pair[jt]["executables"] = len({
        id(c.args[1]) for c in put.call_args_list
        if callable(getattr(c.args[1], "_jitted", None))})
    rows += pair.values()
  _memo.triton_calls.clear()
  return rows


def dispatch(quick):
  sizes = SIZES["quick" if quick else "full"]
  args = _inputs(7)
  cases = _cases()
  samples, halves = timing.per_call(cases, args, sizes["rounds"],
                                    sizes["calls"])
  rows = [{"case": "one call and a sync", "impl": name,
           **timing.quartiles_us(s), "samples": len(s),
           "even_rounds_us": float(np.median(halves[name][0])) * 1e6,
           "odd_rounds_us": float(np.median(halves[name][1] or [0])) * 1e6}
          for name, s in samples.items()]
  rows += _ratios({r["impl"]: r["median_us"] for r in rows})
  rows += _hlo_rows(cases, args)
  rows += [{"case": "jax Python calls per call (0: C++ dispatch)",
            "impl": name, "calls": _jax_python_calls(cases[name], args)}
           for name in ("xla_jit", "jt_dist_jit", "jt_dist_kernel_call_eager",
                        "jt_dist_sharded_kernel_call_1dev_eager")]
  rows += first_call(args, sizes["first_calls"])
  rows += per_step_scalar(args[0], sizes["scalar_calls"])
  return {"sizes": sizes, "results": rows, "notes": [NOTE] if NOTE else [],
          "plots": [{"case": "one call and a sync", "metrics": ["median_us"]}]}


def _pad(n):
  small = tuple(range(8))

  def pad():
    for _ in range(n):
      hash((small, n, 1.5))
  return pad


def _python_hot_us(pairs, args, number):
  """Per name, jt_dist's own Python per call in a hot loop, µs. ``pairs``:
  name -> (the call object whose jitted function is stubbed,
  the function timed, the floor made of the stub it is timed against[, its
  own args]). The stub returns a ready output: nothing waits for a device.
  """
  out = {}
  for name, (call, fn, floor, *own) in pairs.items():
    a = own[0] if own else args
    ready = timing.block(call._jitted(*a))  # pylint: disable=protected-access
    stub = lambda *_, ready=ready: ready
    with mock.patch.object(call, "_jitted", stub):
      out[name] = (timing.hot_us(lambda: fn(*a), number)
                   - timing.hot_us(lambda: floor(stub)(*a), number))
  return out


def python_wall_cost(quick):
  sizes = SIZES["quick" if quick else "full"]
  args = _inputs(11)
  eager = lambda a, b: kernels.add_kw(jt_dist.triton_call, a, b)
  _memo.triton_calls.clear()
  _memo.sharded_calls.clear()
  call = filed_call(_memo.triton_calls, eager, args)
  held = held_kernel_call()
  # Hot, the sharded call runs over every device, on operands split there.
  devices = jax.device_count()
  mesh = jax.make_mesh((devices,), ("x",))
  placed = tuple(jax.device_put(a, NamedSharding(mesh, P("x"))) for a in args)
  over_all, held_sharded = sharded_eager(mesh), held_sharded_kernel_call(mesh)
  pads = {n: _pad(n) for n in PADS}
  cases = {"xla_eager": lambda a, b: a + b, "jt_dist_eager": eager,
           "jt_dist_kernel_call_eager": held,
           "jt_dist_entry_fn": call._jitted}  # pylint: disable=protected-access
  for n, pad in pads.items():
    cases[f"floor_pad_{n}"] = _with_caller_args(call._jitted, pad)  # pylint: disable=protected-access
  samples, _ = timing.per_call(cases, args, sizes["wall_rounds"],
                               sizes["calls"], seed=3, warmup=20)
  med = {k: float(np.median(v)) * 1e6 for k, v in samples.items()}
  pad_hot = {n: timing.hot_us(p, sizes["hot_calls"] * 10)
             for n, p in pads.items()}
  slope = float(np.polyfit([pad_hot[n] - pad_hot[0] for n in PADS],
                           [med[f"floor_pad_{n}"] - med["floor_pad_0"]
                            for n in PADS], 1)[0])
  hot = _python_hot_us({
      "eager": (call, eager, _with_caller_args),
      "held": (held, held, lambda stub: stub),
      "sharded": (filed_call(_memo.sharded_calls, over_all, placed), over_all,
                  _with_caller_args, placed),
      "held sharded": (held_sharded, held_sharded, lambda stub: stub, placed),
  }, args, sizes["hot_calls"])
  budget = BOUND * med["xla_eager"] - med["floor_pad_0"]
  derived = {
      "wall µs per hot µs of padding, after a sync": slope,
      "jt_dist's Python per call, hot loop, µs": hot["eager"],
      "jt_dist's Python per call, after a sync, µs":
          med["jt_dist_eager"] - med["floor_pad_0"],
      "a held kernel_call's Python per call, hot loop, µs": hot["held"],
      "a held kernel_call's Python per call, after a sync, µs":
          med["jt_dist_kernel_call_eager"] - med["jt_dist_entry_fn"],
      f"jt_dist's Python per sharded call ({devices} device(s)), hot loop, µs":
          hot["sharded"],
      f"sharded ({devices} device(s)) / unsharded Python per eager call, hot"
      " loop": hot["sharded"] / hot["eager"] if hot["eager"] > 0 else "n/a",
      "a held sharded_kernel_call's Python per call, hot loop, µs":
          hot["held sharded"],
      f"what {BOUND}x XLA eager leaves above the floor, wall µs": budget,
      "that budget at the padding's rate, hot µs":
          budget / slope if slope > 0 else "n/a",
      "floor / XLA eager": med["floor_pad_0"] / med["xla_eager"],
      "jt_dist eager / XLA eager": med["jt_dist_eager"] / med["xla_eager"],
  }
  rows = [{"case": "one call and a sync", "impl": k, "median_us": v}
          for k, v in med.items()]
  rows += [{"case": "padding", "impl": f"{n} hashes", "hot_us": v}
           for n, v in pad_hot.items()]
  rows += [{"case": "what follows", "impl": k, "value": v}
           for k, v in derived.items()]
  return {"sizes": sizes, "results": rows,
          "plots": [{"case": "one call and a sync", "metrics": ["median_us"]}]}

SUITES = {"dispatch": dispatch, "python_wall_cost": python_wall_cost}
