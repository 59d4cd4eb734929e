"""1 -> 2 GPU scaling, and the plain-jit case, for jt_dist, jax-triton, XLA.

Strong scaling: the same global problem on a 1-device and a 2-device mesh;
the scaling factor is t(1 device) / t(2 devices). Where the problem splits
along its leading axis, one shard's problem alone on one device is timed
too: t(2 devices) / t(one shard alone) is what distributing costs beyond
the kernel's own efficiency at half the size. The three are timed in turns.
"""

import functools
import math
import os
import sys

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jt_dist  # pylint: disable=g-import-not-at-top
import kernels  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top
from examples import sharded_attention  # pylint: disable=g-import-not-at-top


def _mesh(count, names=("x",)):
  shape = (count,) + (1,) * (len(names) - 1)
  return jax.make_mesh(shape, names, devices=jax.devices()[:count],
                       axis_types=(AxisType.Auto,) * len(names))


def _put(x, mesh, spec):
  return jax.device_put(x, NamedSharding(mesh, spec))


# --- The kernels over a mesh, one way per library ---------------------------


def _jt_add(mesh):
  return jax.jit(lambda a, b: jt_dist.sharded_triton_call(
      a, b, jt_dist.shard_size(0), kernel=kernels.add_kernel,
      out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
      grid=lambda m: (triton.cdiv(m["n_elements"], m["BLOCK"]),),
      mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
      BLOCK=kernels.ADD_BLOCK))


def _hand_shard_map(mesh, body, in_specs, out_specs):
  # jax-triton gives no varying-axes types, so check_vma must be off.
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                               out_specs=out_specs, check_vma=False))


def _matmul_grid(meta):
  return (triton.cdiv(meta["M"], meta["BLOCK_M"])
          * triton.cdiv(meta["N"], meta["BLOCK_N"]),)


def _jt_matmul_rows(mesh, autotuned=False):
  options = {} if autotuned else {**kernels.MATMUL_OPTIONS,
                                  **kernels.MATMUL_CONFIG}
  kernel = kernels.matmul_autotuned if autotuned else kernels.matmul_kernel

  def fn(a, b):
    return jt_dist.sharded_triton_call(
        a, b, jt_dist.shard_size(0, axis=0), b.shape[1], a.shape[1],
        kernel=kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
        grid=_matmul_grid, mesh=mesh, in_specs=(P("x"), P()),
        out_specs=P("x"), **options)
  return jax.jit(fn)


def _jt_matmul_k(mesh):
  def fn(a, b):
    return jt_dist.sharded_triton_call(
        a, b, a.shape[0], b.shape[1], jt_dist.shard_size(0, axis=1),
        kernel=kernels.matmul_kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32),
        grid=_matmul_grid, mesh=mesh, in_specs=(P(None, "x"), P("x")),
        out_specs=P(), out_reduce=("sum", "x"), **kernels.MATMUL_OPTIONS,
        **kernels.MATMUL_CONFIG)
  return jax.jit(fn)


def _xla_attention(q, k, v):
  scores = jnp.einsum("bhqd,bhkd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  p = jax.nn.softmax(scores / math.sqrt(q.shape[-1]), axis=-1)
  return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v)


def _cases(libs, sizes):
  """(name, axis names, make_inputs(mesh), {impl: make_fn(mesh)}, work, unit,
  in_specs or None): in_specs say which inputs a shard-alone run halves."""
  n = sizes["scale_add"]
  m = sizes["scale_matmul"]
  att = sizes["attention"]
  jt = libs.get("jax_triton")
  key = jax.random.key(7)

  def add_inputs(mesh):
    x = jax.random.normal(key, (n,), jnp.float32)
    y = jax.random.normal(jax.random.fold_in(key, 1), (n,), jnp.float32)
    return _put(x, mesh, P("x")), _put(y, mesh, P("x"))

  def mm_inputs(a_spec, b_spec):
    def make(mesh):
      a = jax.random.normal(key, (m, m), jnp.bfloat16)
      b = jax.random.normal(jax.random.fold_in(key, 2), (m, m), jnp.bfloat16)
      return _put(a, mesh, a_spec), _put(b, mesh, b_spec)
    return make

  def att_inputs(mesh):
    qkv = [jax.random.normal(jax.random.fold_in(key, i), att, jnp.bfloat16)
           for i in range(3)]
    return tuple(_put(t, mesh, P("b", "h")) for t in qkv)

  add_impls = {"jt_dist": _jt_add, "xla": lambda mesh: jax.jit(jnp.add)}
  rows_impls = {"jt_dist": _jt_matmul_rows,
                "jt_dist_autotuned": functools.partial(
                    _jt_matmul_rows, autotuned=True),
                "xla": lambda mesh: jax.jit(kernels.xla_matmul)}
  k_impls = {"jt_dist": _jt_matmul_k,
             "xla": lambda mesh: jax.jit(lambda a, b: jnp.dot(
                 a, b, preferred_element_type=jnp.float32))}
  att_impls = {
      "jt_dist": lambda mesh: jax.jit(functools.partial(
          _jt_attention, mesh=mesh)),
      "xla": lambda mesh: jax.jit(_xla_attention)}
  if jt is not None:
    add_impls["jax_triton_shard_map"] = lambda mesh: _hand_shard_map(
        mesh, lambda a, b: kernels.add(jt, a, b), (P("x"), P("x")), P("x"))
    rows_impls["jax_triton_shard_map"] = lambda mesh: _hand_shard_map(
        mesh, lambda a, b: kernels.matmul(jt, a, b), (P("x"), P()), P("x"))
    k_impls["jax_triton_shard_map"] = lambda mesh: _hand_shard_map(
        mesh, lambda a, b: jax.lax.psum(kernels.matmul(
            jt, a, b, out_dtype=jnp.float32), "x"), (P(None, "x"), P("x")),
        P())
    att_impls["jax_triton_shard_map"] = lambda mesh: _hand_shard_map(
        mesh, functools.partial(_jax_triton_attention, jt),
        (P("b", "h"),) * 3, P("b", "h"))
  x, bh = ("x",), ("b", "h")
  return [
      ("add_fp32", x, add_inputs, add_impls, 12 * n / 1e9, "GBps",
       (P("x"), P("x"))),
      ("matmul_rows_bf16", x, mm_inputs(P("x"), P()), rows_impls,
       2 * m**3 / 1e12, "TFLOPs", (P("x"), P())),
      ("matmul_ksplit_bf16", x, mm_inputs(P(None, "x"), P("x")), k_impls,
       2 * m**3 / 1e12, "TFLOPs", None),
      ("attention_bf16", bh, att_inputs, att_impls,
       4 * att[0] * att[1] * att[2] ** 2 * att[3] / 1e12, "TFLOPs",
       (P("b", "h"),) * 3),
  ]


def _attention_blocks():
  return (64, 64) if jax.devices()[0].platform != "cpu" else (16, 16)


def _jax_triton_attention(call, q, k, v):
  batch, heads, seq, dim = q.shape  # Shard-local, written out by hand.
  block_m, block_n = _attention_blocks()
  # jax-triton 0.3.1 types a Python float as fp64, which breaks the kernel's
  # fp32 loop-carried softmax state; np.float32 is its way to pass fp32.
  return call(q, k, v, seq, np.float32(1.0 / math.sqrt(dim)),
              kernel=sharded_attention.attention_kernel,
              out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
              grid=(triton.cdiv(seq, block_m), batch * heads), HEAD_DIM=dim,
              BLOCK_M=block_m, BLOCK_N=block_n)


def _jt_attention(q, k, v, mesh):
  return sharded_attention.attention(q, k, v, mesh, *_attention_blocks())


def bench_multi(results, sizes, libs, record):
  """Times every case on 1 and 2 devices and records the scaling factor."""
  if len(jax.devices()) < 2:
    record(results, "multi_gpu", "skipped",
           reason=f"needs >=2 devices, found {len(jax.devices())}")
    return
  for name, names, make_inputs, impls, work, unit, specs in _cases(
      libs, sizes):
    for impl, make_fn in impls.items():
      try:
        seconds = _one_and_two(names, make_inputs, make_fn, specs, sizes)
      except Exception as e:  # pylint: disable=broad-except
        # One failing implementation must not lose the others' numbers.
        record(results, f"scale_{name}", impl,
               error=f"{type(e).__name__}: {e}"[:300])
        continue
      shard = seconds.pop("shard", None)
      extra = {} if shard is None else {
          "ms_shard_alone_1gpu": shard * 1e3,
          "ms_2gpu_over_shard_alone": seconds[2] / shard}
      record(results, f"scale_{name}", impl,
             **{f"ms_{c}gpu": s * 1e3 for c, s in seconds.items()},
             **{f"{unit}_{c}gpu": work / s for c, s in seconds.items()},
             scaling=seconds[1] / seconds[2], **extra)
  _plain_jit(results, sizes, libs, record)


def _first_half(x, spec, device):
  if spec and spec[0] is not None:
    x = x[: x.shape[0] // 2]
  return jax.device_put(x, device)


def _check(fn, inputs, reference, label):
  out = np.asarray(fn(*inputs), np.float32)
  error = timing.relative_error(out, reference[: out.shape[0]])
  assert error < 2e-2, (label, error)


def _one_and_two(names, make_inputs, make_fn, specs, sizes):
  """Seconds per call: 1-device mesh, 2-device mesh, one shard alone."""
  calls = {}
  for count in (1, 2):
    mesh = _mesh(count, names)
    calls[count] = (make_fn(mesh), make_inputs(mesh))
  reference = np.asarray(calls[1][0](*calls[1][1]), np.float32)
  _check(*calls[2], reference, "2 devices")
  if specs is not None:
    device = jax.devices()[0]
    halves = tuple(_first_half(x, spec, device)
                   for x, spec in zip(calls[1][1], specs))
    calls["shard"] = (calls[1][0], halves)
    _check(*calls["shard"], reference, "one shard alone")
  return timing.interleaved_chained_each(calls, iters=sizes["iters"])


def _plain_jit(results, sizes, libs, record):
  """Sharded inputs under plain jax.jit, with no shard_map around the call."""
  n = sizes["scale_add"]
  key = jax.random.key(9)
  x = jax.random.normal(key, (n,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (n,), jnp.float32)
  one = (jax.device_put(x, jax.devices()[0]), jax.device_put(y, jax.devices()[0]))
  mesh = _mesh(2)
  two = (_put(x, mesh, P("x")), _put(y, mesh, P("x")))
  for impl, call in libs.items():
    fn = jax.jit(lambda a, b, c=call: kernels.add(c, a, b))
    single = timing.chained_seconds(fn, one, iters=sizes["iters"])
    try:
      out = fn(*two)
    except Exception as e:  # pylint: disable=broad-except
      record(results, "plain_jit_sharded_add", impl,
             outcome=f"refused: {type(e).__name__}", ms_1gpu=single * 1e3)
      continue
    np.testing.assert_allclose(np.asarray(out), np.asarray(x + y), rtol=1e-6)
    sharded = timing.chained_seconds(fn, two, iters=sizes["iters"])
    record(results, "plain_jit_sharded_add", impl,
           outcome=f"ran on {len(out.sharding.device_set)} devices",
           ms_1gpu=single * 1e3, ms_sharded_2gpu=sharded * 1e3,
           GBps_sharded=12 * n / sharded / 1e9,
           slowdown_vs_1gpu=sharded / single)
