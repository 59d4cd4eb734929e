"""Eager and jitted dispatch of a 1,024-float add: XLA, jax-triton, jt_dist.

Each case is one call followed by a sync, on two random vectors of 1,024
float32. The cases take turns in a fresh random order every round, in one
process, and the medians (with quartiles) of every call are reported, and
each case's median over the even and over the odd rounds (the same case
timed twice: a difference between cases smaller than theirs is noise):

- ``xla``: ``a + b``, eagerly and inside ``jax.jit``;
- ``jax_triton``: ``jax_triton.triton_call`` as its docs call it (the size
  as a keyword metaparam), eagerly and jitted (skipped, with a note, where
  jax_triton cannot be imported);
- ``jt_dist``: the same call through ``jt_dist.triton_call``, and
  ``jt_dist_scalar_n`` with the size as a runtime scalar argument (the
  README's quickstart form);
- ``jt_dist_kernel_call_eager``: ``jt_dist.kernel_call`` of the same kernel,
  outputs, grid and metaparams, made once; each call passes the two arrays
  alone, and goes straight to ``jax.jit``'s dispatch;
- ``jt_dist_sharded_1dev``: ``jt_dist.sharded_triton_call`` over a mesh of
  one device, eagerly.

Diagnostic rows, to tell jt_dist's Python from its executable:

- ``diag_jt_dist_entry_fn_eager``: the jitted function that
  ``triton_call``'s memo holds for ``jt_dist_eager``, called directly (no
  jt_dist Python);
- ``diag_xla_eager_prebuilt_sds``: ``a + b`` after building the
  ``ShapeDtypeStruct`` and grid that every Triton call builds (the caller's
  share of a ``triton_call``, which XLA's ``a + b`` does not pay).
- ``diag_floor_caller_args_entry_fn``: that ``ShapeDtypeStruct`` and grid,
  then the memo's jitted function directly: what ``jt_dist_eager`` would
  cost if jt_dist's own Python took no time at all (the floor of any
  design).
- ``jt_dist_jit_legacy_target``: ``jt_dist_jit`` on jaxlib's legacy
  custom-call target (``custom_call_target_name="triton_kernel_call"``, as
  jax-triton 0.3 emits);
- ``jt_dist_jit_ffi_no_cubin``: ``jt_dist_jit`` on the FFI target without
  the inline CUBIN (lowered with ``ProtoChoices(module_images=False)``):
  with ``jt_dist_jit`` and ``jax_triton_jit``, whether a gap is the CUBIN
  or the FFI call itself.

And ``hlo``: whether the jitted jt_dist and jax-triton functions lower to
the same HLO (custom-call target, operands, layouts, aliases; the kernel
payload in ``backend_config`` differs by construction), and
``fast_path``: how many of jax's Python functions run per call of each
callable (0 means jax's C++ dispatch took it).

Then, for jt_dist's eager call:

- ``python_wall_us`` / ``python_cpu_us``: jt_dist's own Python per call,
  the kernel excluded (``python_kw_*``: the same for the keyword form of
  ``jt_dist_eager``; ``python_kernel_call_*``: for a held
  ``kernel_call``). The jitted function of the call's ``KernelCall`` is
  replaced, for the measurement only, by a jitted ``a + b``, and the call
  is timed against that jitted ``a + b`` alone, interleaved; the
  difference is jt_dist's key, memo lookup and call boundary. On the CPU
  this is the number the interpreter would otherwise drown.
- ``profile``: a cProfile of repeated calls, split by stage (the front
  door, its key, the ``KernelCall``, and on a first call making the
  ``KernelCall`` and tracing it), for the keyword form (arrays only), the
  scalar form, a held ``kernel_call``, and a first call (the memo emptied
  before each call);
- ``first_call``: one call and a sync with nothing of the call kept but
  the compiled Triton kernel: ``triton_call`` with its memo emptied, and
  a ``kernel_call`` made afresh (jax traces, lowers and compiles again);
- ``per_step_scalar``: an eager ``x * s`` with the same ``s`` every call,
  and with a new ``s`` every call (what a learning rate or a step count
  passed as a scalar costs per step), and their ratio; each call
  alternates with XLA's jitted ``x * s`` given the same Python float;
- ``output_order``: the kernel time of a jitted row softmax over a
  ``OUTPUT_ORDER_SHAPE`` matrix declared output first (Triton's tutorial's
  signature, its input bound by keyword: the call goes through jt_dist's
  generated wrapper kernel) and the same kernel declared outputs last,
  interleaved, back-to-back launches synced once
  (``timing.interleaved_chained_seconds``), and their ratio.

    python benchmarks/dispatch.py --out benchmarks/results/h100x1/dispatch.json
    python benchmarks/dispatch.py --smoke      # tiny, any host (CI sanity)
"""

import contextlib
import cProfile
import functools
import json
import os
import platform
import pstats
import re
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import triton  # pylint: disable=g-import-not-at-top
import triton.language as tl  # pylint: disable=g-import-not-at-top

import jt_dist  # pylint: disable=g-import-not-at-top
from jt_dist._call import memo as _memo  # pylint: disable=g-import-not-at-top
from jt_dist._gpu import lowering as _gpu_lowering  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

try:
  import jax_triton  # pylint: disable=g-import-not-at-top
except Exception as e:  # pylint: disable=broad-except
  jax_triton = None
  JAX_TRITON_NOTE = f"jax_triton not importable: {type(e).__name__}: {e}"
else:
  JAX_TRITON_NOTE = None

SIZE = 1024
BLOCK = 1024
SIZES = {
    "full": dict(rounds=600, calls=5, python_rounds=200, python_calls=50,
                 profile_calls=2000, first_calls=30, scalar_calls=300,
                 order_iters=200, order_rounds=15),
    "smoke": dict(rounds=6, calls=2, python_rounds=10, python_calls=20,
                  profile_calls=20, first_calls=2, scalar_calls=5,
                  order_iters=2, order_rounds=2),
}
# Rows and columns of output_order's softmax: long enough a kernel that
# its device time, not the launch, is timed.
OUTPUT_ORDER_SHAPE = {"full": (16384, 1024), "smoke": (8, 64)}


@triton.jit
def add_kw_kernel(x_ptr, y_ptr, out_ptr, n_elements: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr):
  """jax-triton's documented form: the size is a keyword metaparam."""
  offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_elements
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def scale_kernel(x_ptr, s, out_ptr, n_elements: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr):
  """``x * s``: ``s`` is the per-step scalar (a learning rate, a step)."""
  offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_elements
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * s,
           mask=mask)


def scale(x, s):
  return jt_dist.triton_call(
      x, s, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(triton.cdiv(x.size, BLOCK),), n_elements=x.size,
      BLOCK_SIZE=BLOCK)


# XLA's own per-step scalar: a jitted ``x * s`` given a Python float.
xla_scale = jax.jit(lambda a, s: a * s)


def per_step_scalar(x, calls):
  """Eager ``x * s`` with one float ``s`` throughout, or a new ``s`` per call.

  Whatever a new value costs (a call traced, lowered and compiled again,
  or only a new runtime operand) shows in the second run's median. Each
  call alternates with XLA's ``x * s`` (``xla_*``), which copies its
  Python ``s`` to the device at every call.
  ``executables_kept``: the ``KernelCall``s ``triton_call`` filed in its
  memo over both runs (one may be filed under several keys), each with a
  jitted function compiled once here.
  """
  _memo.triton_calls.clear()
  timings = {}
  with mock.patch.object(_memo.triton_calls, "put",
                         wraps=_memo.triton_calls.put) as put:
    jax.block_until_ready(scale(x, 0.5))
    jax.block_until_ready(xla_scale(x, 0.5))
    for name, values in (("same_value", [0.5] * calls),
                         ("new_value_each_call",
                          [1.0 + 1e-4 * (i + 1) for i in range(calls)])):
      each = {scale: [], xla_scale: []}
      for s in values:
        for fn, times in each.items():
          start = time.perf_counter()
          jax.block_until_ready(fn(x, s))
          times.append(time.perf_counter() - start)
      timings[f"{name}_us"] = float(np.median(each[scale])) * 1e6
      timings[f"xla_{name}_us"] = float(np.median(each[xla_scale])) * 1e6
  timings["new_over_same"] = (timings["new_value_each_call_us"]
                              / timings["same_value_us"])
  timings["executables_kept"] = len({
      id(c.args[1]) for c in put.call_args_list
      if callable(getattr(c.args[1], "_jitted", None))})
  _memo.triton_calls.clear()
  return timings


@triton.jit
def softmax_out_first_kernel(output_ptr, input_ptr, input_row_stride,
                             output_row_stride, n_cols,
                             BLOCK_SIZE: tl.constexpr):
  """Triton's fused-softmax tutorial's signature: the output first."""
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_cols
  x = tl.load(input_ptr + row * input_row_stride + offsets, mask=mask,
              other=-float("inf"))
  x = tl.exp(x - tl.max(x, axis=0))
  tl.store(output_ptr + row * output_row_stride + offsets,
           x / tl.sum(x, axis=0), mask=mask)


@triton.jit
def softmax_out_last_kernel(input_ptr, input_row_stride, output_row_stride,
                            n_cols, output_ptr, BLOCK_SIZE: tl.constexpr):
  """The same softmax with its output declared last."""
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK_SIZE)
  mask = offsets < n_cols
  x = tl.load(input_ptr + row * input_row_stride + offsets, mask=mask,
              other=-float("inf"))
  x = tl.exp(x - tl.max(x, axis=0))
  tl.store(output_ptr + row * output_row_stride + offsets,
           x / tl.sum(x, axis=0), mask=mask)


def output_order(shape, iters, rounds):
  """Kernel time of the output-first softmax against the outputs-last one.

  ``out_first_us`` / ``out_last_us``: median µs per launch; ``ratio``:
  their quotient (1.0 within noise: the wrapper is inlined); ``max_diff``:
  the largest difference between the two kernels' results.
  """
  rows, cols = shape
  x = jax.random.normal(jax.random.key(3), shape, jnp.float32)
  common = dict(out_shape=jax.ShapeDtypeStruct(shape, jnp.float32),
                grid=(rows,), input_row_stride=cols, output_row_stride=cols,
                n_cols=cols, BLOCK_SIZE=triton.next_power_of_2(cols))
  fns = {
      "out_first": jax.jit(lambda a: jt_dist.triton_call(
          kernel=softmax_out_first_kernel, input_ptr=a, **common)),
      "out_last": jax.jit(lambda a: jt_dist.triton_call(
          a, kernel=softmax_out_last_kernel, **common)),
  }
  diff = float(jnp.max(jnp.abs(fns["out_first"](x) - fns["out_last"](x))))
  seconds = timing.interleaved_chained_seconds(fns, (x,), iters, rounds)
  result = {f"{name}_us": s * 1e6 for name, s in seconds.items()}
  result["ratio"] = result["out_first_us"] / result["out_last_us"]
  result["max_diff"] = diff
  result["shape"] = list(shape)
  return result


def add_kw(call, x, y):
  return call(x, y, kernel=add_kw_kernel,
              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
              grid=(triton.cdiv(x.size, BLOCK),), n_elements=x.size,
              BLOCK_SIZE=BLOCK)


def add_kernel_call():
  """``add_kw``'s call as a ``jt_dist.kernel_call``, made once by its caller."""
  return jt_dist.kernel_call(
      add_kw_kernel, out_shape=jax.ShapeDtypeStruct((SIZE,), jnp.float32),
      grid=(triton.cdiv(SIZE, BLOCK),), n_elements=SIZE, BLOCK_SIZE=BLOCK)


def filed_call(memo, fn, args):
  """The call object that ``fn(*args)`` files in ``memo`` (a front door's).

  The caller empties ``memo`` first, or knows the call is not in it yet.
  Read through the memo's ``put``, so that no cache internals are touched;
  entries that are no call (markers a front door may file beside it) are
  passed over, and a call filed under several keys counts once.
  """
  with mock.patch.object(memo, "put", wraps=memo.put) as put:
    jax.block_until_ready(fn(*args))
  calls = list({id(c.args[1]): c.args[1] for c in put.call_args_list
                if callable(getattr(c.args[1], "_jitted", None))}.values())
  assert len(calls) == 1, f"{len(calls)} calls filed, not 1"
  return calls[0]


def _sharded(mesh):
  spec = jax.sharding.PartitionSpec()

  def call(x, y):
    return jt_dist.sharded_triton_call(
        x, y, kernel=add_kw_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(triton.cdiv(x.size, BLOCK),), mesh=mesh, in_specs=(spec, spec),
        out_specs=spec, n_elements=x.size, BLOCK_SIZE=BLOCK)

  return call


def _cases():
  """name -> function of (x, y); eager ones are plain Python functions."""
  jt = jt_dist.triton_call
  cases = {
      "xla_eager": lambda a, b: a + b,
      "xla_jit": jax.jit(lambda a, b: a + b),
      "jt_dist_eager": lambda a, b: add_kw(jt, a, b),
      "jt_dist_jit": jax.jit(lambda a, b: add_kw(jt, a, b)),
      "jt_dist_scalar_n_eager": lambda a, b: kernels.add(jt, a, b),
      "jt_dist_scalar_n_jit": jax.jit(lambda a, b: kernels.add(jt, a, b)),
      # Made here, once, as a hot loop would hold it.
      "jt_dist_kernel_call_eager": add_kernel_call(),
  }
  if jax_triton is not None:
    jxt = jax_triton.triton_call
    cases["jax_triton_eager"] = lambda a, b: add_kw(jxt, a, b)
    cases["jax_triton_jit"] = jax.jit(lambda a, b: add_kw(jxt, a, b))
  mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
  cases["jt_dist_sharded_1dev_eager"] = _sharded(mesh)
  cases.update(_target_cases())
  return cases


def _target_cases():
  """Jitted jt_dist on the legacy target, and on FFI without the CUBIN.

  Beside ``jt_dist_jit`` (the FFI target with each CUBIN inline, the
  default) and ``jax_triton_jit`` (the legacy target), they tell whether a
  gap to jax-triton is the FFI call itself or the CUBIN it carries.
  """
  legacy = functools.partial(
      jt_dist.triton_call, custom_call_target_name=_gpu_lowering.LEGACY_TARGET)
  no_cubin = jax.jit(lambda a, b: add_kw(jt_dist.triton_call, a, b))
  # A jitted function is lowered at its first call: make it under the choice.
  with mock.patch.object(_gpu_lowering, "proto_choices",
                         _gpu_lowering.ProtoChoices(module_images=False)):
    jax.block_until_ready(no_cubin(*_inputs(5)))
  return {"jt_dist_jit_legacy_target": jax.jit(
              lambda a, b: add_kw(legacy, a, b)),
          "jt_dist_jit_ffi_no_cubin": no_cubin}


def _diagnostic_cases(cases, args):
  """Rows that split a case's time into its parts (see the module doc)."""
  _memo.triton_calls.clear()
  call = filed_call(_memo.triton_calls, cases["jt_dist_eager"], args)
  fn = call._jitted  # pylint: disable=protected-access

  def xla_with_caller_args(a, b):
    jax.ShapeDtypeStruct(a.shape, a.dtype)
    (triton.cdiv(a.size, BLOCK),)  # pylint: disable=expression-not-assigned
    return a + b

  def floor(a, b):
    jax.ShapeDtypeStruct(a.shape, a.dtype)
    (triton.cdiv(a.size, BLOCK),)  # pylint: disable=expression-not-assigned
    return fn(a, b)

  return {
      "diag_jt_dist_entry_fn_eager": fn,
      "diag_xla_eager_prebuilt_sds": xla_with_caller_args,
      "diag_floor_caller_args_entry_fn": floor,
  }


def _python_calls_in_jax(fn, args, calls=5):
  """jax's Python functions run per call of ``fn`` (0: C++ dispatch)."""
  jax.block_until_ready(fn(*args))
  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(calls):
    fn(*args)
  profiler.disable()
  stats = pstats.Stats(profiler).stats
  # jax's dispatch modules only: a CPU call's host callback runs others.
  count = sum(n for (path, _, _), (n, _, _, _, _) in stats.items()
              if os.sep + "jax" + os.sep in path and os.path.basename(path)
              in ("pjit.py", "api.py", "dispatch.py", "pxla.py"))
  return count / calls


def fast_path_report(cases, diag, args):
  """Per callable: jax Python calls per call (0 = C++ fast path).

  ``jt_dist_front_door`` is ``triton_call`` with its ``out_shape`` and grid
  made once, so that the caller's ``ShapeDtypeStruct`` (jax Python) is not
  counted; ``jt_dist_sharded_entry_fn`` is the jitted ``shard_map`` that
  the sharded front door's memo holds.
  """
  sds = jax.ShapeDtypeStruct((SIZE,), jnp.float32)
  grid = (triton.cdiv(SIZE, BLOCK),)
  front_door = lambda a, b: jt_dist.triton_call(
      a, b, kernel=add_kw_kernel, out_shape=sds, grid=grid,
      n_elements=SIZE, BLOCK_SIZE=BLOCK)
  out = {"xla_jit": _python_calls_in_jax(cases["xla_jit"], args),
         "jt_dist_jit": _python_calls_in_jax(cases["jt_dist_jit"], args),
         "jt_dist_entry_fn": _python_calls_in_jax(
             diag["diag_jt_dist_entry_fn_eager"], args),
         "jt_dist_kernel_call": _python_calls_in_jax(
             cases["jt_dist_kernel_call_eager"], args),
         "jt_dist_front_door": _python_calls_in_jax(front_door, args)}
  if "jax_triton_jit" in cases:
    out["jax_triton_jit"] = _python_calls_in_jax(cases["jax_triton_jit"], args)
  _memo.sharded_calls.clear()
  sharded = filed_call(_memo.sharded_calls,
                       cases["jt_dist_sharded_1dev_eager"], args)
  out["jt_dist_sharded_entry_fn"] = _python_calls_in_jax(
      sharded._jitted, args)  # pylint: disable=protected-access
  return out


def _custom_calls(text):
  """The custom-call lines of an HLO text, with backend_config dropped."""
  lines = [line for line in text.splitlines() if "custom-call" in line]
  return [re.sub(r'backend_config=("(?:[^"\\]|\\.)*"|\{[^}]*\})', "",
                 line.split("=", 1)[1]) for line in lines]


def hlo_report(cases, args):
  """Whether jitted jt_dist and jax-triton lower to the same HLO."""
  texts = {}
  for name in ("jt_dist_jit", "jax_triton_jit"):
    if name in cases:
      texts[name] = cases[name].lower(*args).as_text(dialect="hlo")
  out = {name: {"custom_calls": _custom_calls(t),
                "targets": re.findall(r'custom_call_target="([^"]+)"', t),
                "api_versions": re.findall(r"api_version=(\w+)", t),
                "text_chars": len(t),
                "instructions": sum(" = " in line for line in t.splitlines())}
         for name, t in texts.items()}
  if len(texts) == 2:
    a, b = (out[n]["custom_calls"] for n in ("jt_dist_jit", "jax_triton_jit"))
    out["same_custom_calls_but_payload"] = a == b
    out["same_targets"] = (out["jt_dist_jit"]["targets"]
                           == out["jax_triton_jit"]["targets"])
    out["same_instruction_count"] = (out["jt_dist_jit"]["instructions"]
                                     == out["jax_triton_jit"]["instructions"])
  return out


def _inputs(seed):
  key = jax.random.key(seed)
  x = jax.random.normal(key, (SIZE,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (SIZE,), jnp.float32)
  return x, y


def _check(cases):
  """Every case against NumPy, on fresh random inputs per case."""
  for name, fn in cases.items():
    x, y = _inputs(int.from_bytes(os.urandom(4), "little"))
    expected = np.asarray(x) + np.asarray(y)
    np.testing.assert_allclose(np.asarray(fn(x, y)), expected, rtol=1e-6,
                               err_msg=name)


def _interleaved(cases, args, rounds, calls, seed=0):
  """Seconds of every call + sync per case, cases in a random order per round.

  Returns:
    ``(samples, halves)``: per case every call's seconds, and the same
    split into the even and the odd rounds.
  """
  rng = np.random.default_rng(seed)
  names = list(cases)
  samples = {name: [] for name in names}
  halves = {name: ([], []) for name in names}
  for r in range(rounds):
    for k in rng.permutation(len(names)):
      fn = cases[names[k]]
      for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds = time.perf_counter() - start
        samples[names[k]].append(seconds)
        halves[names[k]][r % 2].append(seconds)
  return samples, halves


def _batches(cases, args, rounds, calls, clock, seed):
  """Seconds per call of ``calls`` back-to-back calls, per case and round."""
  rng = np.random.default_rng(seed)
  names = list(cases)
  samples = {name: [] for name in names}
  for _ in range(rounds):
    for k in rng.permutation(len(names)):
      fn = cases[names[k]]
      start = clock()
      for _ in range(calls):
        fn(*args)
      samples[names[k]].append((clock() - start) / calls)
  return {name: float(np.median(v)) * 1e6 for name, v in samples.items()}


def _stubbed_cases(args, stack):
  """The three eager jt_dist forms, each with a jitted ``a + b`` for kernel.

  The front doors' ``KernelCall``s, and a held ``kernel_call``, get
  ``stub`` in place of their jitted function while ``stack`` is open.
  The calls' own arguments are made once, as a loop that calls the same
  kernel would: what is timed is jt_dist's, not the caller's, Python.
  """
  jt = jt_dist.triton_call
  # Takes and drops what a KernelCall may pass beside the arrays (on the
  # CPU, its runtime scalars packed in one operand).
  stub = jax.jit(lambda a, b, *rest: a + b)
  sds = jax.ShapeDtypeStruct(args[0].shape, args[0].dtype)
  grid = (triton.cdiv(SIZE, kernels.ADD_BLOCK),)
  kw_grid = (triton.cdiv(SIZE, BLOCK),)
  cases = {"jt_dist_fast_path": lambda a, b: jt(
               a, b, SIZE, kernel=kernels.add_kernel, out_shape=sds,
               grid=grid, BLOCK=kernels.ADD_BLOCK),
           # The keyword form (the headline ``jt_dist_eager`` case): no
           # scalar operand, so no fixed value among the operands.
           "jt_dist_kw_fast_path": lambda a, b: jt(
               a, b, kernel=add_kw_kernel, out_shape=sds, grid=kw_grid,
               n_elements=SIZE, BLOCK_SIZE=BLOCK),
           "jt_dist_kernel_call": add_kernel_call(),
           "stub_alone": stub}
  _memo.triton_calls.clear()
  calls = [filed_call(_memo.triton_calls, cases[name], args)
           for name in ("jt_dist_fast_path", "jt_dist_kw_fast_path")]
  calls.append(cases["jt_dist_kernel_call"])
  for call in calls:
    stack.enter_context(mock.patch.object(call, "_jitted", stub))
  return cases


def python_overhead(args, rounds, calls):
  """jt_dist's own Python per eager call: its kernel replaced by ``a + b``.

  Timed by the wall clock and by the process's CPU time (which a busy,
  shared host does not inflate), in batches of back-to-back calls. Both
  forms of ``triton_call`` and a held ``kernel_call`` are timed against
  the same jitted ``a + b`` alone; the differences are jt_dist's.
  """
  out = {}
  with contextlib.ExitStack() as stack:
    cases = _stubbed_cases(args, stack)
    for fn in cases.values():
      for _ in range(20):
        jax.block_until_ready(fn(*args))
    for clock_name, clock in (("wall", time.perf_counter),
                              ("cpu", time.process_time)):
      medians = _batches(cases, args, rounds, calls, clock, seed=1)
      out.update({f"{k}_{clock_name}_us": v for k, v in medians.items()})
      stub = medians["stub_alone"]
      out[f"python_{clock_name}_us"] = medians["jt_dist_fast_path"] - stub
      out[f"python_kw_{clock_name}_us"] = (medians["jt_dist_kw_fast_path"]
                                           - stub)
      out[f"python_kernel_call_{clock_name}_us"] = (
          medians["jt_dist_kernel_call"] - stub)
  # The memo's calls have their jitted functions back; start afresh anyway.
  _memo.triton_calls.clear()
  return out


_STAGES = {
    "front_door": (("_call/api.py", "triton_call"),),
    "key": (("_call/memo.py", "out_key"), ("_call/memo.py", "grid_key"),
            ("_core/exact.py", "items_key"), ("_call/api.py", "_template")),
    # The KernelCall's frame, with jax.jit's dispatch (C++) inside it.
    "kernel_call": (("_call/kernel_call.py", "__call__"),),
    "first_call": (("_call/api.py", "_first_call"),),
    "make": (("_call/kernel_call.py", "make"),),
    "trace": (("_call/kernel_call.py", "_traced"),
              ("_call/kernel_call.py", "_traced_runtime")),
}


def _profile(fn, args, calls, before=None):
  profiler = cProfile.Profile()
  profiler.enable()
  for _ in range(calls):
    if before is not None:
      before()
    jax.block_until_ready(fn(*args))
  profiler.disable()
  stats = pstats.Stats(profiler).stats
  # Each value: (primitive calls, calls, own time, cumulative time, callers).
  total = sum(own for (_, _, own, _, _) in stats.values())
  out = {"total_us": total / calls * 1e6}
  for stage, functions in _STAGES.items():
    cum = sum(ct for (path, _, fname), (_, _, _, ct, _) in stats.items()
              if any(fname == name and path.endswith(file_end)
                     for file_end, name in functions))
    out[f"{stage}_us"] = cum / calls * 1e6
  return out


def profiles(args, calls):
  """cProfile stage breakdown: both forms, a held call, a first call."""
  fn = lambda a, b: kernels.add(jt_dist.triton_call, a, b)
  kw = lambda a, b: add_kw(jt_dist.triton_call, a, b)
  held = add_kernel_call()
  for f in (fn, kw, held):
    jax.block_until_ready(f(*args))
  out = {
      "keyword_form": _profile(kw, args, calls),
      "fast_path": _profile(fn, args, calls),
      "kernel_call": _profile(held, args, calls),
      "first_call": _profile(fn, args, max(1, calls // 10),
                             before=_memo.triton_calls.clear),
  }
  _memo.triton_calls.clear()
  return out


def first_call(args, calls):
  """One call and a sync with only the compiled Triton kernel kept, µs.

  ``triton_call`` with its memo emptied before each call, and a
  ``kernel_call`` made afresh each time (made and called, timed together).
  """
  jt = jt_dist.triton_call
  cases = {"triton_call_us": (lambda: add_kw(jt, *args),
                              _memo.triton_calls.clear),
           "kernel_call_us": (lambda: add_kernel_call()(*args), None)}
  out = {}
  for name, (fn, before) in cases.items():
    each = []
    for _ in range(calls):
      if before is not None:
        before()
      start = time.perf_counter()
      jax.block_until_ready(fn())
      each.append(time.perf_counter() - start)
    out[name] = float(np.median(each)) * 1e6
  out["calls"] = calls
  _memo.triton_calls.clear()
  return out


def _environment():
  return {
      "python": platform.python_version(), "jax": jax.__version__,
      "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__")
      else None, "triton": triton.__version__,
      "jax_triton": getattr(jax_triton, "__version__", None),
      "jax_triton_note": JAX_TRITON_NOTE,
      "devices": [str(d) for d in jax.devices()],
      "device_kind": jax.devices()[0].device_kind,
  }


def _rows(samples, halves):
  """One row per case: median, quartiles, and the two halves' medians."""
  rows = []
  for name, values in samples.items():
    p25, p50, p75 = np.percentile(values, [25, 50, 75]) * 1e6
    rows.append({"case": name, "median_us": p50, "p25_us": p25,
                 "p75_us": p75, "samples": len(values),
                 "halves_median_us": [float(np.median(h)) * 1e6
                                      for h in halves[name] if h]})
  return rows


def _ratios(rows):
  """Each case over XLA's (eager or jit), and the pairs worth comparing."""
  med = {r["case"]: r["median_us"] for r in rows}
  ratios = {f"{r['case']}_over_xla_{'jit' if 'jit' in r['case'] else 'eager'}":
            r["median_us"] / med["xla_jit" if "jit" in r["case"]
                                 else "xla_eager"] for r in rows}
  for mode in ("eager", "jit"):
    if f"jax_triton_{mode}" in med:
      ratios[f"jt_dist_{mode}_over_jax_triton_{mode}"] = (
          med[f"jt_dist_{mode}"] / med[f"jax_triton_{mode}"])
  if "jax_triton_eager" in med:
    ratios["jt_dist_kernel_call_eager_over_jax_triton_eager"] = (
        med["jt_dist_kernel_call_eager"] / med["jax_triton_eager"])
  # What the front door adds to a held kernel_call, as a ratio.
  ratios["jt_dist_eager_over_jt_dist_kernel_call_eager"] = (
      med["jt_dist_eager"] / med["jt_dist_kernel_call_eager"])
  if "jax_triton_jit" in med:
    for name in ("jt_dist_jit_legacy_target", "jt_dist_jit_ffi_no_cubin"):
      ratios[f"{name}_over_jax_triton_jit"] = (
          med[name] / med["jax_triton_jit"])
  return ratios


def _print(result):
  """The table and the other sections, short, on stdout."""
  print("\n| case | median µs | p25 | p75 | even / odd rounds |\n"
        "| --- | --- | --- | --- | --- |")
  for r in result["results"]:
    halves = " / ".join(f"{h:.1f}" for h in r["halves_median_us"])
    print(f"| {r['case']} | {r['median_us']:.1f} | {r['p25_us']:.1f} |"
          f" {r['p75_us']:.1f} | {halves} |")
  rounded = lambda d: json.dumps({k: round(v, 3) for k, v in d.items()})
  print("\nratios:", rounded(result["ratios"]))
  print("jt_dist python per eager call:", rounded(result["python_overhead"]))
  print("jax Python calls per call (0 = C++ fast path):",
        json.dumps(result["fast_path"]))
  print("hlo:", json.dumps(result["hlo"]))
  print("profile (µs per call):", json.dumps(
      {k: {s: round(v, 1) for s, v in p.items()}
       for k, p in result["profile"].items()}))
  print("first call:", rounded(result["first_call"]))
  print("per-step scalar:", rounded(result["per_step_scalar"]))
  print("output order:", json.dumps(result["output_order"]))
  if JAX_TRITON_NOTE:
    print("note:", JAX_TRITON_NOTE)


def main(argv=None):
  flags = timing.smoke_flags(__doc__, argv)
  sizes = SIZES["smoke" if flags.smoke else "full"]
  cases = _cases()
  _check(cases)
  args = _inputs(7)
  diag = _diagnostic_cases(cases, args)
  timed = {**cases, **diag}
  for fn in timed.values():  # Warm up: compile, fill every cache.
    for _ in range(3):
      jax.block_until_ready(fn(*args))
  rows = _rows(*_interleaved(timed, args, sizes["rounds"], sizes["calls"]))
  result = {
      "environment": _environment(), "sizes": sizes, "results": rows,
      "ratios": _ratios(rows),
      "fast_path": fast_path_report(cases, diag, args),
      "hlo": hlo_report(cases, args),
      "python_overhead": python_overhead(args, sizes["python_rounds"],
                                         sizes["python_calls"]),
      "profile": profiles(args, sizes["profile_calls"]),
      "first_call": first_call(args, sizes["first_calls"]),
      "per_step_scalar": per_step_scalar(args[0], sizes["scalar_calls"]),
      "output_order": output_order(
          OUTPUT_ORDER_SHAPE["smoke" if flags.smoke else "full"],
          sizes["order_iters"], sizes["order_rounds"]),
  }
  _print(result)
  timing.write_json(flags.out, result)
  return result


if __name__ == "__main__":
  main()
