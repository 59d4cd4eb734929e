"""Eager and jitted dispatch of a 1,024-float add: XLA, jax-triton, jt_dist.

Two suites over one set of cases (``_cases``), each one call followed by a
sync on two random vectors of 1,024 float32, the cases taking turns in a
fresh random order every round (``timing.per_call``):

- ``xla``: ``a + b``, eagerly and inside ``jax.jit``;
- ``jax_triton``: ``jax_triton.triton_call`` as its docs call it (the size
  a keyword metaparam), eagerly and jitted, where it can be imported;
- ``jt_dist``: the same call through ``jt_dist.triton_call``, and
  ``jt_dist_scalar_n`` with the size a runtime scalar (the README's
  quickstart form);
- ``jt_dist_kernel_call_eager``: a ``jt_dist.kernel_call`` of the same
  kernel made once, called on the two arrays;
- ``jt_dist_sharded_1dev_eager``: ``sharded_triton_call`` over one device;
- diagnostics: ``diag_jt_dist_entry_fn_eager``, the jitted function that
  ``triton_call``'s memo holds, called directly; ``diag_xla_eager_prebuilt_sds``,
  XLA's ``a + b`` after the ``ShapeDtypeStruct`` and grid every Triton
  caller builds; ``diag_floor_caller_args_entry_fn``, those, then the
  memo's jitted function: the eager call with no jt_dist Python at all.

``dispatch`` reports each case's median, quartiles and its median over the
even and the odd rounds (the same case timed twice: a difference smaller
than theirs is noise), the ratios, the custom calls of the jitted
functions, how many of jax's Python functions each callable runs per call
(0: jax's C++ dispatch), a first call with only the compiled Triton kernel
kept, a per-step scalar (the same value every call, and a new one), and a
softmax declaring its output first against the same kernel outputs last.

``python_wall_cost`` asks how much Python an eager front door can afford:
the floor with Python padding of known hot cost in front of it gives the
wall time a hot microsecond costs after a sync; jt_dist's own Python per
call, hot (its jitted function replaced by a stub) and after a sync; and
what ``BOUND`` times XLA's eager ``a + b`` leaves above the floor.

To add a case, add it to ``_cases``: both suites time it.
"""

import cProfile
import os
import pstats
import re
import time
from unittest import mock

import jax
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
                 order_shape=(16384, 1024), order_iters=200, order_rounds=15,
                 wall_rounds=400, hot_calls=2000),
    "quick": dict(rounds=6, calls=2, first_calls=2, scalar_calls=5,
                  order_shape=(8, 64), order_iters=2, order_rounds=2,
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


def _sharded(mesh):
  spec = jax.sharding.PartitionSpec()

  def call(a, b):
    return jt_dist.sharded_triton_call(
        a, b, kernel=kernels.add_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=(triton.cdiv(a.size, BLOCK),), mesh=mesh, in_specs=(spec, spec),
        out_specs=spec, n_elements=a.size, BLOCK_SIZE=BLOCK)
  return call


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


def _cases(args):
  """name -> function of (x, y); eager ones are plain Python functions."""
  jt = jt_dist.triton_call
  cases = {
      "xla_eager": lambda a, b: a + b,
      "xla_jit": jax.jit(lambda a, b: a + b),
      "jt_dist_eager": lambda a, b: kernels.add_kw(jt, a, b),
      "jt_dist_jit": jax.jit(lambda a, b: kernels.add_kw(jt, a, b)),
      "jt_dist_scalar_n_eager": lambda a, b: kernels.add(jt, a, b),
      "jt_dist_scalar_n_jit": jax.jit(lambda a, b: kernels.add(jt, a, b)),
      # Made here, once, as a hot loop would hold it.
      "jt_dist_kernel_call_eager": held_kernel_call(),
      "jt_dist_sharded_1dev_eager": _sharded(
          jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])),
  }
  if jax_triton is not None:
    jxt = jax_triton.triton_call
    cases["jax_triton_eager"] = lambda a, b: kernels.add_kw(jxt, a, b)
    cases["jax_triton_jit"] = jax.jit(lambda a, b: kernels.add_kw(jxt, a, b))
  _memo.triton_calls.clear()
  entry = filed_call(_memo.triton_calls, cases["jt_dist_eager"], args)._jitted  # pylint: disable=protected-access
  cases["diag_jt_dist_entry_fn_eager"] = entry
  cases["diag_xla_eager_prebuilt_sds"] = _with_caller_args(
      lambda a, b: a + b)
  cases["diag_floor_caller_args_entry_fn"] = _with_caller_args(entry)
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
            ("jt_dist_eager", "jt_dist_kernel_call_eager")]
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
      start = time.perf_counter()
      timing.block(fn())
      each.append(time.perf_counter() - start)
    rows.append({"case": "a first call, eagerly", "impl": name,
                 "us": float(np.median(each)) * 1e6, "calls": calls})
  _memo.triton_calls.clear()
  return rows


def scale(x, s):
  return jt_dist.triton_call(
      x, s, kernel=kernels.scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, BLOCK),), n_elements=x.size,
      BLOCK_SIZE=BLOCK)


xla_scale = jax.jit(lambda a, s: a * s)


def per_step_scalar(x, calls):
  """Eager ``x * s``: one ``s`` throughout, or a new ``s`` every call.

  Each call alternates with XLA's jitted ``x * s`` given the same float.
  ``executables``: the calls ``triton_call`` filed over both runs.
  """
  _memo.triton_calls.clear()
  rows = {fn: {"case": "a per-step scalar, eagerly", "impl": name}
          for fn, name in ((scale, "jt_dist"), (xla_scale, "XLA x * s"))}
  with mock.patch.object(_memo.triton_calls, "put",
                         wraps=_memo.triton_calls.put) as put:
    for fn in rows:
      timing.block(fn(x, 0.5))
    for name, values in (("same_value_us", [0.5] * calls),
                         ("new_value_us",
                          [1.0 + 1e-4 * (i + 1) for i in range(calls)])):
      each = {fn: [] for fn in rows}
      for s in values:
        for fn, times in each.items():
          start = time.perf_counter()
          timing.block(fn(x, s))
          times.append(time.perf_counter() - start)
      for fn, times in each.items():
        rows[fn][name] = float(np.median(times)) * 1e6
  rows[scale]["executables"] = len({
      id(c.args[1]) for c in put.call_args_list
      if callable(getattr(c.args[1], "_jitted", None))})
  _memo.triton_calls.clear()
  return list(rows.values())


def output_order(shape, iters, rounds):
  """Kernel time of the output-first softmax against the outputs-last one."""
  rows, cols = shape
  x = jax.random.normal(jax.random.key(3), shape, jnp.float32)
  common = dict(out_shape=x, grid=(rows,), input_row_stride=cols,
                output_row_stride=cols, n_cols=cols,
                BLOCK_SIZE=triton.next_power_of_2(cols))
  fns = {
      "output first": jax.jit(lambda a: jt_dist.triton_call(
          kernel=kernels.softmax_out_first_kernel, input_ptr=a, **common)),
      "outputs last": jax.jit(lambda a: jt_dist.triton_call(
          a, kernel=kernels.softmax_out_last_kernel, **common)),
  }
  np.testing.assert_allclose(fns["output first"](x), jax.nn.softmax(x),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(fns["output first"](x), fns["outputs last"](x))
  seconds = timing.chained({k: (f, (x,)) for k, f in fns.items()}, iters,
                           rounds)
  return [{"case": f"a kernel declaring its output first {rows}x{cols}",
           "impl": name, "us": s * 1e6} for name, s in seconds.items()]


def dispatch(quick):
  sizes = SIZES["quick" if quick else "full"]
  args = _inputs(7)
  cases = _cases(args)
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
                        "diag_jt_dist_entry_fn_eager")]
  rows += first_call(args, sizes["first_calls"])
  rows += per_step_scalar(args[0], sizes["scalar_calls"])
  rows += output_order(sizes["order_shape"], sizes["order_iters"],
                       sizes["order_rounds"])
  return {"sizes": sizes, "results": rows, "notes": [NOTE] if NOTE else [],
          "plots": [{"case": "one call and a sync", "metrics": ["median_us"]}]}


def _pad(n):
  small = tuple(range(8))

  def pad():
    for _ in range(n):
      hash((small, n, 1.5))
  return pad


def _python_hot_us(call, held, eager, args, number):
  """jt_dist's own Python per call in a hot loop: its jitted function stubbed.

  The stub returns a ready output, so nothing waits for the device; the
  eager call is timed against the unpadded floor, ``held`` against the stub.
  """
  ready = timing.block(call._jitted(*args))  # pylint: disable=protected-access
  stub = lambda *_: ready
  floor = _with_caller_args(stub)
  with (mock.patch.object(call, "_jitted", stub),
        mock.patch.object(held, "_jitted", stub)):
    return (timing.hot_us(lambda: eager(*args), number)
            - timing.hot_us(lambda: floor(*args), number),
            timing.hot_us(lambda: held(*args), number)
            - timing.hot_us(lambda: stub(*args), number))


def python_wall_cost(quick):
  sizes = SIZES["quick" if quick else "full"]
  args = _inputs(11)
  eager = lambda a, b: kernels.add_kw(jt_dist.triton_call, a, b)
  _memo.triton_calls.clear()
  call = filed_call(_memo.triton_calls, eager, args)
  held = held_kernel_call()
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
  hot, held_hot = _python_hot_us(call, held, eager, args, sizes["hot_calls"])
  budget = BOUND * med["xla_eager"] - med["floor_pad_0"]
  derived = {
      "wall µs per hot µs of padding, after a sync": slope,
      "jt_dist's Python per call, hot loop, µs": hot,
      "jt_dist's Python per call, after a sync, µs":
          med["jt_dist_eager"] - med["floor_pad_0"],
      "a held kernel_call's Python per call, hot loop, µs": held_hot,
      "a held kernel_call's Python per call, after a sync, µs":
          med["jt_dist_kernel_call_eager"] - med["jt_dist_entry_fn"],
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
