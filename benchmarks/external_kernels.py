"""The ``external_kernels`` suite: Triton's tutorials and Liger-Kernel's
kernels through jt_dist, unchanged, checked against jax.numpy, timed (20
back-to-back jitted calls) and, on a GPU with PyTorch, timed against the
same launches from PyTorch.

The modules import torch, so they are not imported: each top-level
statement runs on its own, and those that need torch or the library's host
code are skipped (an ``if`` whose test needs them runs its first branch),
as are demos and benchmark runs (expressions, assignments of own calls).
The host helpers asking Triton's driver what GPU this is (``is_cuda`` ...)
are answered from JAX's device. A case is written as Triton's launch
``kernel[grid](*items, **kw)``; jt_dist gets ``docs/porting.md``'s
translation: arguments by keyword, ``Out`` in ``out_shape`` (``zero``:
``zeroed_outputs``), ``InOut`` as a ``jax.new_ref``.

The tutorials are found beside the tree (``shared/external/``) or at
``JT_DIST_TUTORIALS``; Liger-Kernel's source is an installed
``liger_kernel`` or the folder ``JT_DIST_LIGER_SRC`` that holds
``liger_kernel/``. What is absent is skipped, with a note saying why.
"""

from __future__ import annotations

import ast
import collections
import functools
import glob
import importlib.util
import os
import re
import signal
import traceback
import types
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton

import jt_dist
import timing

# ../shared/external/triton_tutorials from a clone, or from a worktree.
TUTORIALS = next((p for p in (
    os.path.join(up, "shared", "external", "triton_tutorials")
    for up in (os.path.dirname(timing.ROOT),
               os.path.dirname(os.path.dirname(timing.ROOT))))
                  if os.path.isdir(p)), "")
CASE_TIMEOUT_S = 300


# ----------------------------------------------------------------- loader
def _gpu():
  device = jax.devices()[0]
  return None if device.platform == "cpu" else device


def _capability() -> int:
  cc = getattr(_gpu(), "compute_capability", "0")  # The CPU's None: 0.
  return int(float(cc or 0) * 10)


HOST_HELPERS = {  # Answered from JAX's device, not Triton's driver.
    "is_cuda": lambda: True, "is_hip": lambda: False,
    "is_hip_cdna2": lambda: False, "is_hip_cdna3": lambda: False,
    "is_hopper": lambda: _capability() // 10 == 9,
    "is_blackwell": lambda: _capability() // 10 == 10,
    "supports_host_descriptor": lambda: _gpu() is None or _capability() >= 90,
    "supports_tma": lambda: _gpu() is None or _capability() >= 90,
    "supports_ws": lambda: False, "is_npu_available": lambda: False,
}


try:
  import torch as _TORCH  # pylint: disable=g-import-not-at-top
except ImportError:  # What the tutorials' config filters ask of torch.
  _TORCH = types.SimpleNamespace(cuda=types.SimpleNamespace(
      get_device_capability=lambda *_: divmod(_capability(), 10)))


def load(path: str) -> dict:
  """The namespace the module at ``path`` defines, without its torch."""
  tree = ast.parse(open(path).read(), path)
  ns = {"__name__": "external_" + os.path.basename(path)[:-3].replace(
      "-", "_"), "__file__": path, "torch": _TORCH}
  todo = list(tree.body)
  own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
  while todo:
    node = todo.pop(0)
    if isinstance(node, ast.Expr) or (isinstance(node, ast.Assign) and any(
        isinstance(c, ast.Call) and getattr(c.func, "id", None) in own
        for c in ast.walk(node.value))):
      continue  # A demo or a benchmark run: `benchmark.run(...)`.
    if isinstance(node, ast.If):
      try:
        test = eval(compile(ast.Expression(node.test), path, "eval"), ns)  # pylint: disable=eval-used
      except Exception:  # pylint: disable=broad-except
        test = True  # Needs the host library: its first branch.
      todo[:0] = node.body if test else node.orelse
      continue
    try:
      exec(compile(ast.Module([node], []), path, "exec"), ns)  # pylint: disable=exec-used
    except Exception:  # pylint: disable=broad-except
      pass  # torch, the library's host code, or what needs them.
    if isinstance(node, ast.FunctionDef) and node.name in HOST_HELPERS:
      ns[node.name] = HOST_HELPERS[node.name]
  return ns


# ------------------------------------------------------------- the launches
class Out(typing.NamedTuple):
  shape: tuple
  dtype: Any
  zero: bool = False
  desc: tuple = ()  # (shape, strides, block_shape): a TensorDescriptor.


Zeros = functools.partial(Out, zero=True)  # Triton's torch.zeros.


InOut = collections.namedtuple("InOut", "value")  # Updated in place.
Desc = collections.namedtuple("Desc", "value shape strides block")


def launch_jt(kernel, grid, items, kw):
  """``kernel[grid](*items, **kw)`` as the porting guide translates it."""
  names = getattr(kernel, "arg_names", None) or kernel.fn.arg_names
  outs, zeroed, args, refs = [], [], {}, []
  for name, item in list(zip(names, items)) + list(kw.items()):
    if isinstance(item, Out):
      struct = jax.ShapeDtypeStruct(item.shape, item.dtype)
      outs.append(jt_dist.TensorDescriptor(struct, *item.desc)
                  if item.desc else struct)
      zeroed += [len(outs) - 1] * item.zero
    elif isinstance(item, InOut):
      refs.append(jax.new_ref(item.value))
      args[name] = refs[-1]
    elif isinstance(item, Desc):
      args[name] = jt_dist.TensorDescriptor(item.value, item.shape,
                                            item.strides, item.block)
    else:
      args[name] = item
  result = jt_dist.triton_call(kernel=kernel, grid=grid, out_shape=outs,
                               zeroed_outputs=zeroed, **args)
  return list(result) + [r[...] for r in refs]


def torch_args(items, kw):
  """The launch's arguments as torch tensors of the same values."""
  import torch  # pylint: disable=g-import-not-at-top
  from triton.tools.tensor_descriptor import TensorDescriptor  # pylint: disable=g-import-not-at-top

  def convert(x):
    if isinstance(x, Out):
      dtype = getattr(torch, np.dtype(x.dtype).name)
      t = (torch.zeros if x.zero else torch.empty)(x.shape, dtype=dtype,
                                                   device="cuda")
      return TensorDescriptor(t, *x.desc) if x.desc else t
    if isinstance(x, Desc):
      return TensorDescriptor(convert(x.value), *x[1:])
    if isinstance(x, InOut):
      return convert(x.value)
    if isinstance(x, (jax.Array, np.ndarray)):
      return torch.from_dlpack(jnp.asarray(x)).clone()
    return x

  return [convert(i) for i in items], {k: convert(v) for k, v in kw.items()}


# ------------------------------------------------------------------ cases
def _rng(seed=0):
  return np.random.default_rng(seed)

def _normal(shape, dtype=jnp.float32, seed=0):
  return jnp.asarray(_rng(seed).standard_normal(shape), dtype)

_np2 = triton.next_power_of_2
CASES = {}

def case(name, source, quick=True):
  def register(fn):
    CASES[name] = (source, fn, quick)
    return fn
  return register

@case("01 vector add", "t:01-vector-add.py")
def _add(ns, launch, small):
  n = 3000 if small else 1 << 24
  x, y = _normal((n,)), _normal((n,), seed=1)
  grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
  (out,) = launch(ns["add_kernel"], grid,
                  [x, y, Out((n,), jnp.float32), n], {"BLOCK_SIZE": 1024})
  return [out], [x + y]

@case("02 fused softmax", "t:02-fused-softmax.py")
def _softmax(ns, launch, small):
  m, n = (64, 781) if small else (4096, 1823)
  x = _normal((m, n))
  (y,) = launch(ns["softmax_kernel"], (min(m, 132),),
                [Out((m, n), jnp.float32), x, n, n, m, n],
                {"BLOCK_SIZE": _np2(n), "num_stages": 2})
  return [y], [jax.nn.softmax(x, axis=1)]

def _tile_grid(m, n, most=None):  # A program per tile, or at most `most`.
  return lambda meta: (min(most or 2**31 - 1, triton.cdiv(
      m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"])),)

def _matmul_items(m, n, k, a, b):
  return [a, b, Out((m, n), jnp.float16), m, n, k, k, 1, n, 1, n, 1]

@case("03 matmul (autotuned)", "t:03-matrix-multiplication.py", quick=False)
def _matmul(ns, launch, small):
  m = n = k = 128 if small else 4096
  a, b = _normal((m, k), jnp.float16), _normal((k, n), jnp.float16, 1)
  (c,) = launch(ns["matmul_kernel"], _tile_grid(m, n),
                _matmul_items(m, n, k, a, b),
                {"ACTIVATION": ""})
  return [c], [(a.astype(jnp.float32) @ b.astype(jnp.float32))]

def _ln_inputs(small):
  m, n = (16, 300) if small else (4096, 8192)
  return (m, n, _normal((m, n)), _normal((n,), seed=1),
          _normal((n,), seed=2))

def _ln_ref(x, w, b, eps=1e-5):
  mean, var = x.mean(1), x.var(1)
  rstd = 1 / jnp.sqrt(var + eps)
  return (x - mean[:, None]) * rstd[:, None] * w + b, mean, rstd

@case("05 layer norm forward", "t:05-layer-norm.py")
def _ln_fwd(ns, launch, small):
  m, n, x, w, b = _ln_inputs(small)
  f32 = jnp.float32
  outs = launch(ns["_layer_norm_fwd_fused"], (m,),
                [x, Out((m, n), f32), w, b, Out((m,), f32), Out((m,), f32),
                 n, n, 1e-5], {"BLOCK_SIZE": min(_np2(n), 1024),
                               "num_warps": 4})
  return outs, list(_ln_ref(x, w, b))

@case("05 layer norm backward (locks)", "t:05-layer-norm.py", quick=False)
def _ln_bwd(ns, launch, small):
  m, n, x, w, b = _ln_inputs(small)
  dy, f32, group = _normal((m, n), seed=3), jnp.float32, 8
  _, mean, rstd = _ln_ref(x, w, b)
  block = _np2(n)
  dx, pdw, pdb, _ = launch(
      ns["_layer_norm_bwd_dx_fused"], (m,),
      [Out((m, n), f32), dy, Zeros((group, n), f32), Zeros((group, n), f32),
       x, w, mean, rstd, Zeros((2 * group,), jnp.int32), n, n],
      {"BLOCK_SIZE_N": block, "GROUP_SIZE_M": group, "num_warps": 4})
  dw, db = launch(ns["_layer_norm_bwd_dwdb"], lambda meta: (
      triton.cdiv(n, meta["BLOCK_SIZE_N"]),),
      [pdw, pdb, Out((n,), f32), Out((n,), f32), min(group, m), n],
      {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128})
  _, vjp = jax.vjp(lambda x, w, b: _ln_ref(x, w, b)[0], x, w, b)
  return [dx, dw, db], list(vjp(dy))

def _attention_ref(q, k, v, causal, scale):
  s = jnp.einsum("zhqd,zhkd->zhqk", q.astype(jnp.float32),
                 k.astype(jnp.float32)) * scale
  if causal:
    n = q.shape[2]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
  return jnp.einsum("zhqk,zhkd->zhqd", jax.nn.softmax(s, -1),
                    v.astype(jnp.float32))

def _attn_forward(ns, launch, small, causal):
  z, h, n, d = (1, 2, 128, 64) if small else (4, 32, 4096, 64)
  q, k, v = (_normal((z, h, n, d), jnp.float16, s) for s in range(3))
  rows, scale = z * h * n, 0.5
  desc = lambda x: Desc(x.reshape(rows, d), (rows, d), (d, 1), (1, 1))
  grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), z * h, 1)
  m, o = launch(ns["_attn_fwd"], grid, [
      scale, Out((z, h, n), jnp.float32), z, h, desc(q), desc(k), desc(v),
      Out((rows, d), jnp.float16, desc=((rows, d), (d, 1), (1, 1)))],
      {"N_CTX": n, "HEAD_DIM": d, "FP8_OUTPUT": False,
       "STAGE": 3 if causal else 1, "warp_specialize": False,
       "IS_HOPPER": HOST_HELPERS["is_hopper"]()})
  return (q, k, v, m, o.reshape(z, h, n, d)), _attention_ref(q, k, v, causal,
                                                             scale)

for _causal in (False, True):
  case(f"06 attention forward{' causal' if _causal else ''}",
       "t:06-fused-attention.py")(
           lambda ns, launch, small, c=_causal: (
               lambda r: ([r[0][4]], [r[1]]))(
                   _attn_forward(ns, launch, small, c)))

@case("06 attention backward", "t:06-fused-attention.py", quick=False)
def _attn_backward(ns, launch, small):
  (q, k, v, m, o), _ = _attn_forward(ns, launch, small, True)
  z, h, n, d = q.shape
  do, f32, scale = _normal(q.shape, jnp.float16, 5), jnp.float32, 0.5
  (delta,) = launch(ns["_attn_bwd_preprocess"], (n // 128, z * h),
                    [o, do, Out((z, h, n), f32), z, h, n],
                    {"BLOCK_M": 128, "HEAD_DIM": d})
  arg_k = (k * (scale * 1.4426950408889634)).astype(k.dtype)
  f16 = jnp.float16
  dq, dk, dv = launch(ns["_attn_bwd"], (n // 128, 1, z * h), [
      q, arg_k, v, scale, do, Out(q.shape, f16), Out(q.shape, f16),
      Out(q.shape, f16), m, delta, h * n * d, n * d, d, 1, h, n],
      {"BLOCK_M1": 32, "BLOCK_N1": 128, "BLOCK_M2": 128, "BLOCK_N2": 32,
       "BLK_SLICE_FACTOR": 2, "HEAD_DIM": d, "num_warps": 4,
       "num_stages": 5, "CAUSAL": True})
  _, vjp = jax.vjp(lambda q, k, v: _attention_ref(q, k, v, True, scale),
                   q, k, v)
  return [dq, dk, dv], list(vjp(do.astype(f32)))

@case("08 grouped GEMM", "t:08-grouped-gemm.py", quick=False)
def _grouped(ns, launch, small):
  del ns, launch, small
  raise NotImplementedError(
      "takes arrays of device pointers (int64 data_ptr()s), which JAX does"
      " not expose: a documented limit")

def _persistent(kernel, extra, descriptors=False):
  def run(ns, launch, small):
    m = n = k = 256 if small else 8192
    a, b = _normal((m, k), jnp.float16), _normal((k, n), jnp.float16, 1)
    sms = 132 if _gpu() else 2  # Fewer than the tiles: programs loop.
    # The host TMA kernel is not persistent: a program per tile.
    grid = _tile_grid(m, n, None if descriptors == "host" else sms)
    if descriptors == "host":
      bt = b.T.copy()  # The TMA kernel takes b transposed.
      items = [Desc(a, (m, k), (k, 1), (1, 1)), Desc(bt, (n, k), (k, 1),
                                                     (1, 1)),
               Out((m, n), jnp.float16, desc=((m, n), (n, 1), (1, 1))),
               m, n, k]
    elif descriptors:
      items = [a, b.T.copy(), Out((m, n), jnp.float16), m, n, k]
    else:
      items = _matmul_items(m, n, k, a, b)
    (c,) = launch(ns[kernel], grid, items, extra(sms))
    return [c], [a.astype(jnp.float32) @ b.astype(jnp.float32)]
  return run

case("09 persistent matmul", "t:09-persistent-matmul.py", quick=False)(
    _persistent("matmul_kernel_persistent", lambda sms: {"NUM_SMS": sms}))
case("09 matmul, device descriptors", "t:09-persistent-matmul.py",
     quick=False)(_persistent(
         "matmul_kernel_descriptor_persistent", lambda sms: {
             "NUM_SMS": sms, "WARP_SPECIALIZE": False, "FLATTEN": False},
         descriptors=True))
case("09 matmul, host TMA", "t:09-persistent-matmul.py", quick=False)(
    _persistent("matmul_kernel_tma", lambda sms: {
        "FP8_OUTPUT": False, "WARP_SPECIALIZE": False}, descriptors="host"))

def _rows(small, n_small=300, n_large=4096, m_large=4096):
  return (8, n_small) if small else (m_large, n_large)

@case("liger rms_norm", "l:rms_norm.py")
def _rms(ns, launch, small):
  m, n = _rows(small)
  x, w = _normal((m, n)), _normal((n,), seed=1)
  y, rstd = launch(ns["_rms_norm_forward_kernel"], (m,), [
      Out((m, n), jnp.float32), n, x, n, w, 1, Out((m,), jnp.float32), 1, n,
      1e-6, 0.0, 0], {"elementwise_affine": True, "BLOCK_SIZE": _np2(n),
                      "num_warps": 4})
  r = 1 / jnp.sqrt((x * x).mean(1) + 1e-6)
  return [y, rstd], [x * r[:, None] * w, r]

@case("liger layer_norm", "l:layer_norm.py")
def _liger_ln(ns, launch, small):
  m, n, x, w, b = _ln_inputs(small)
  f32 = jnp.float32
  y, mean, rstd = launch(ns["_layer_norm_forward_kernel"], (m,), [
      Out((m, n), f32), n, x, n, w, 1, b, 1, Out((m,), f32), 1,
      Out((m,), f32), 1, n, 1e-5], {"BLOCK_SIZE": _np2(n), "num_warps": 4})
  return [y, mean, rstd], list(_ln_ref(x, w, b))

def _gated(kernel, ref, scalars):
  def run(ns, launch, small):
    m, n = _rows(small)
    a, b = _normal((m, n)), _normal((m, n), seed=1)
    (c,) = launch(ns[kernel], (m,), [a, b, Out((m, n), jnp.float32), n,
                                     *scalars], {"n_cols": n,
                                                 "BLOCK_SIZE": _np2(n),
                                                 "num_warps": 4})
    return [c], [ref(a, b)]
  return run

case("liger swiglu", "l:swiglu.py")(_gated(
    "_swiglu_forward_kernel", lambda a, b: jax.nn.silu(a) * b, [1.0]))
case("liger geglu", "l:geglu.py")(_gated(
    "_geglu_tanh_forward_kernel",
    lambda a, b: jax.nn.gelu(a, approximate=True) * b, []))

@case("liger rope", "l:rope.py")
def _rope(ns, launch, small):
  bs, sl, qh, kh, hd = (1, 8, 4, 2, 64) if small else (8, 2048, 32, 8, 128)
  q, k = _normal((bs, sl, qh, hd)), _normal((bs, sl, kh, hd), seed=1)
  angle = _normal((1, sl, hd // 2), seed=2)
  cos = jnp.cos(jnp.concatenate([angle, angle], -1))
  sin = jnp.sin(jnp.concatenate([angle, angle], -1))
  qo, ko = launch(ns["_triton_rope"], (bs * sl,), [
      InOut(q), qh * hd, InOut(k), kh * hd, cos, hd, sin, hd, sl, bs, 1, qh,
      kh, hd, _np2(qh), _np2(kh), _np2(hd), _np2(hd), hd],
      {"BLOCK_SIZE": max(_np2(qh), _np2(kh)), "BACKWARD_PASS": False})
  half = lambda x: jnp.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
  rot = lambda x: x * cos[:, :, None] + half(x) * sin[:, :, None]
  return [qo, ko], [rot(q), rot(k)]

def _ce(logits, y, ns, launch):
  bt, v = logits.shape
  (loss,) = launch(ns["liger_cross_entropy_kernel"], (bt,), [], dict(
      X_ptr=InOut(logits), X_stride=v, Y_ptr=y, Y_stride=1, weight_ptr=None,
      loss_ptr=Out((bt,), jnp.float32), z_loss_ptr=None, loss_stride=1,
      token_accuracy_ptr=None, token_accuracy_stride=0,
      predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=v,
      n_non_ignore=bt, sum_non_ignore_weight=float(bt), weight_sum=0.0,
      ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0,
      reduction="mean", softcap=None, RETURN_Z_LOSS=False,
      RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=False,
      BLOCK_SIZE=min(32768, _np2(v)), HAS_WEIGHT=False,
      HAS_SOFTCAPPING=False, HAS_GRADIENTS=False, num_warps=32))[:1]
  ref = (jax.nn.logsumexp(logits, 1)
         - jnp.take_along_axis(logits, y[:, None], 1)[:, 0]) / bt
  return [loss], [ref]

@case("liger cross_entropy", "l:cross_entropy.py")
def _cross_entropy(ns, launch, small):
  bt, v = (8, 1000) if small else (4096, 32000)
  y = jnp.asarray(_rng(1).integers(0, v, bt), jnp.int32)
  return _ce(_normal((bt, v)), y, ns, launch)

@case("liger fused_linear_cross_entropy", "l:cross_entropy.py")
def _flce(ns, launch, small):
  # Liger's fused linear CE runs this kernel on chunks of x @ W.T.
  bt, hd, v = (8, 64, 1000) if small else (4096, 4096, 32000)
  x, w = _normal((bt, hd)), _normal((v, hd), seed=2) / 8
  y = jnp.asarray(_rng(1).integers(0, v, bt), jnp.int32)
  return _ce(x @ w.T, y, ns, launch)

@case("liger kl_div", "l:kl_div.py")
def _kl_div(ns, launch, small):
  bt, v = _rows(small, 1000, 32000)
  y = jax.nn.log_softmax(_normal((bt, v)), 1)
  gt = jax.nn.softmax(_normal((bt, v), seed=1), 1)
  (loss,) = launch(ns["_kldiv_kernel_forward"], (bt,), [
      y, v, gt, v, Zeros((bt,), jnp.float32), 1, v],
      {"eps": 1e-10, "BLOCK_SIZE": min(16384, _np2(v)), "num_warps": 4,
       "log_target": False, "reduction": 3})
  return [loss], [(gt * (jnp.log(jnp.maximum(gt, 1e-10)) - y)).sum(1)]

def _liger_softmax(kernel, block):
  def run(ns, launch, small):
    m, n = _rows(small, 300, 4096)
    x = _normal((m, n))
    (y,) = launch(ns[kernel], (m,), [Out((m, n), jnp.float32), n, x, n, n],
                  {"BLOCK_SIZE": block(n), "num_warps": 4})
    return [y], [jax.nn.softmax(x, 1)]
  return run

case("liger softmax (single block)", "l:softmax.py")(_liger_softmax(
    "_softmax_single_block_forward_kernel", _np2))
case("liger softmax (multi block)", "l:softmax.py")(_liger_softmax(
    "_softmax_multi_block_forward_kernel", lambda n: 128))


# ----------------------------------------------------------------- runner
def _source(spec: str, liger: str) -> str:
  kind, name = spec.split(":")
  if kind == "t":
    return os.path.join(os.environ.get("JT_DIST_TUTORIALS", TUTORIALS), name)
  return os.path.join(liger, "liger_kernel", "ops", name)


# Why a kernel fails, in a few words (the whole error is kept as "detail").
CAUSES = (
    (r"block_shape = .*cannot do to a JAX array",
     "a pre_hook sized a plain array"),
    (r"libdevice\.\w+ \(CUDA's \w+\) is not computed",
     "CPU: a libdevice function it does not compute"),
    (r"'dtype' object is not callable", "Triton refuses tl.float32(x)"),
    (r"device pointers", "device pointer arrays: a documented limit"),
    (r"TimeoutError", f"ran past {CASE_TIMEOUT_S} s"),
)


def _why(detail: str) -> str:
  for pattern, words in CAUSES:
    if re.search(pattern, detail):
      return words
  return detail[:60]


def _alarm(signum, frame):
  raise TimeoutError(f"ran past {CASE_TIMEOUT_S} s")


def _times(launches, rounds):
  """µs per round of the case's launches: back-to-back jitted calls, and
  (on a GPU with PyTorch) back-to-back PyTorch launches of the same configs."""
  leaves, tree = jax.tree_util.tree_flatten(launches)
  where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
  # What a launch updates in place is donated, as a JAX loop over such a
  # buffer does (else XLA copies it first): the update is the next input.
  in_outs = [[x.value for x in (*items, *kw.values()) if isinstance(x, InOut)]
             for _, _, items, kw in launches]
  slots = [next(k for k, i in enumerate(where) if leaves[i] is v)
           for vs in in_outs for v in vs]
  args = [jnp.copy(leaves[i]) if k in slots else leaves[i]
          for k, i in enumerate(where)]

  def body(*arrays):  # The arrays as arguments, not constants.
    filled = list(leaves)
    for i, array in zip(where, arrays):
      filled[i] = array
    outs = [launch_jt(*l) for l in jax.tree_util.tree_unflatten(tree, filled)]
    cuts = [len(out) - len(vs) for out, vs in zip(outs, in_outs)]
    # Each update once: an array returned twice is a second buffer, a copy.
    return ([o[:c] for o, c in zip(outs, cuts)],
            [u for o, c in zip(outs, cuts) for u in o[c:]])

  jitted = jax.jit(body, donate_argnums=tuple(slots))

  def step():  # Returns what to wait for: the updates too (rope has no outs).
    outs, updates = jitted(*args)
    for k, update in zip(slots, updates):
      args[k] = update
    return outs, updates

  calls = {"jt_dist_us": (step, ())}
  torch = None
  if _gpu() is not None and importlib.util.find_spec("torch") is not None:
    import torch  # pylint: disable=g-import-not-at-top
    triton.set_allocator(lambda size, _, __: torch.empty(  # As 09 sets it.
        size, device="cuda", dtype=torch.int8))
    ready = [(k, g, *torch_args(i, kw)) for k, g, i, kw in launches]

    def torch_step():
      for kernel, grid, args, kwargs in ready:
        kernel[grid](*args, **kwargs)
      torch.cuda.synchronize()

    calls["torch_us"] = (torch_step, ())
  times = {k: s * 1e6 for k, s in timing.chained(
      calls, iters=20 if _gpu() else 1, rounds=rounds).items()}
  if torch is not None:
    times["jt_dist / PyTorch"] = times["jt_dist_us"] / times["torch_us"]
  return times


def run_case(name, liger, small, rounds=0):
  """One case's row: whether it passes unchanged, why not, and its times."""
  source, fn, _ = CASES[name]
  result = {"case": "Triton's tutorials" if source[0] == "t" else
                    "Liger-Kernel", "impl": name}
  signal.signal(signal.SIGALRM, _alarm)
  signal.alarm(CASE_TIMEOUT_S)
  try:
    ns = load(_source(source, liger))
    launches = []
    got, expected = fn(ns, lambda *l: launches.append(l) or launch_jt(*l),
                       small)
    errors = [float(jnp.max(jnp.abs(jnp.asarray(g, jnp.float32)
                                    - jnp.asarray(e, jnp.float32))))
              for g, e in zip(got, expected)]
    tolerance = 2e-2 if any(g.dtype == jnp.float16 for g in got) else 1e-3
    scale = max(float(jnp.max(jnp.abs(e))) for e in expected) or 1.0
    passed = max(errors) <= tolerance * max(scale, 1.0)
    result.update(unchanged="yes" if passed else "no",
                  result="pass" if passed else "fails",
                  why="" if passed else "wrong answer",
                  max_error=max(errors))
    if passed and rounds:
      result.update(_times(launches, rounds))
  except Exception as e:  # pylint: disable=broad-except
    frame = traceback.extract_tb(e.__traceback__)[-1]
    lines = [l for l in str(e).splitlines() if l.strip(" -^")]  # First, last.
    detail = (f"{type(e).__name__}: {' … '.join(dict.fromkeys(lines[:1] + lines[-1:]))[:400]}"
              f" (at {os.path.basename(frame.filename)}:{frame.lineno})")
    result.update(unchanged="no", result="fails", why=_why(detail),
                  detail=detail)
  finally:
    signal.alarm(0)
  return result


def liger_source():
  """``(folder holding liger_kernel/, its version)``, or ``(None, why)``."""
  if given := os.environ.get("JT_DIST_LIGER_SRC"):
    folder = given
  elif (spec := importlib.util.find_spec("liger_kernel")) is not None:
    folder = os.path.dirname(list(spec.submodule_search_locations)[0])
  else:
    return None, ("Liger-Kernel's cases skipped: liger_kernel is not"
                  " installed and JT_DIST_LIGER_SRC is not set (pip install"
                  " --no-deps liger-kernel==0.8.5)")
  if not os.path.isdir(os.path.join(folder, "liger_kernel", "ops")):
    return None, (f"Liger-Kernel's cases skipped: {folder} holds no"
                  " liger_kernel/ops/")
  info = glob.glob(os.path.join(folder, "liger_kernel-*.dist-info"))
  return folder, (os.path.basename(info[0])[13:-10] if info else "")


def external_kernels(quick):
  """Every case (quick: the quick ones), at the CPU interpreter's sizes on
  the CPU and at full sizes on a GPU."""
  small = quick or _gpu() is None
  liger, version = liger_source()
  notes = [] if liger else [version]
  names = [n for n, (source, _, q) in CASES.items()
           if (q or not quick) and (liger or source.startswith("t:"))]
  tutorials = os.environ.get("JT_DIST_TUTORIALS", TUTORIALS)
  if not os.path.isdir(tutorials):
    notes.append("Triton's tutorials skipped: not found beside the tree"
                 " (shared/external/triton_tutorials) nor at"
                 " JT_DIST_TUTORIALS")
    names = [n for n in names if not CASES[n][0].startswith("t:")]
  rows = [run_case(n, liger, small, rounds=2 if quick else 5) for n in names]
  for row in rows:
    if row["case"] == "Liger-Kernel" and version:
      row["case"] = f"Liger-Kernel {version}"
  timed = {r["case"] for r in rows if "jt_dist_us" in r}
  return {"sizes": {"small": small}, "results": rows or [
      {"case": "skipped", "impl": "every case", "why": "; ".join(notes)}],
          "notes": notes, "plots": [
              {"case": c, "log": True, "metrics": [m for m in (
                  "jt_dist_us", "torch_us") if any(m in r for r in rows)]}
              for c in sorted(timed)]}


SUITES = {"external_kernels": external_kernels}
