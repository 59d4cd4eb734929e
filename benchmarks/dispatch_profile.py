"""Where a tiny kernel's launch time goes: each choice of the lowering, priced.

jaxlib's Triton custom call does host work on every launch, and how much
depends on the custom-call target (FFI or legacy) and on what the
serialised call carries (PTX, TTIR, CUBIN module images, or 64 KiB of
padding that jaxlib ignores). Each variant below differs from jt_dist's
default in one of those, and all are measured in one interleaved run, two
ways:

- ``sync_us``: one call followed by a sync (median, with quartiles);
- ``async_us``: 500 calls back to back, synced once; for a kernel this
  small the GPU keeps up, so this is the host's cost of one launch.

The same is done for an autotuned add (4 configs), and for 16 adds in one
jitted function, where the FFI target lets XLA capture the launches in a
CUDA graph (command buffer) and the legacy target does not.
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import jt_dist
from jt_dist._gpu import lowering as _gpu_lowering
import kernels
import timing

_LEGACY = "triton_kernel_call"
_PAD = 64 * 1024
# Each variant: (custom-call target or None for the default, proto choices).
# The default is the FFI target with CUBINs and without TTIR; the legacy
# target never carries CUBINs. "legacy_with_ttir" carries what jax-triton's
# call carries. The padded ones add 64 KiB that jaxlib ignores, pricing
# each serialised byte per launch.
_VARIANTS = {
    "jt_dist": (None, {}),
    "jt_dist_with_ttir": (None, {"ttir": True}),
    "jt_dist_no_cubin": (None, {"module_images": False}),
    "jt_dist_pad_64KiB": (None, {"padding_bytes": _PAD}),
    "jt_dist_legacy": (_LEGACY, {}),
    "jt_dist_legacy_with_ttir": (_LEGACY, {"ttir": True}),
    "jt_dist_legacy_pad_64KiB": (_LEGACY, {"padding_bytes": _PAD}),
}


def _jt_dist_fn(target, choices, body, args):
  call = functools.partial(jt_dist.triton_call, custom_call_target_name=target)
  fn = jax.jit(lambda a, b: body(call, a, b))
  # Lowering happens at the first call, so it is made under the choices.
  with mock.patch.object(_gpu_lowering, "proto_choices",
                         _gpu_lowering.ProtoChoices(**choices)):
    jax.block_until_ready(fn(*args))
  return fn


def _variants(body, args, libs, xla_body):
  fns = {name: _jt_dist_fn(target, choices, body, args)
         for name, (target, choices) in _VARIANTS.items()}
  if "jax_triton" in libs:
    fns["jax_triton"] = jax.jit(
        lambda a, b: body(libs["jax_triton"], a, b))
  fns["xla"] = jax.jit(xla_body)
  return fns


def _measure(results, label, fns, args, expected, sizes, record):
  for name, fn in fns.items():
    np.testing.assert_allclose(np.asarray(fn(*args)), expected, rtol=1e-6,
                               err_msg=f"{label}: {name}")
  samples = timing.per_call_samples(fns, args, calls=sizes["calls"])
  chained = timing.interleaved_chained_seconds(
      fns, args, iters=sizes["chain_iters"])
  for name in fns:
    p25, p50, p75 = np.percentile(samples[name], [25, 50, 75]) * 1e6
    record(results, label, name, sync_us=p50, sync_p25_us=p25, sync_p75_us=p75,
           async_us=chained[name] * 1e6)


def _chain16(call, a, b):
  for _ in range(16):
    a = kernels.add(call, a, b)
  return a


def _xla_chain16(a, b):
  for _ in range(16):
    a = a + b
  return a


def bench_dispatch_profile(results, sizes, libs, record):
  """Per-launch host cost of each lowering choice; see the module doc."""
  key = jax.random.key(11)
  x = jax.random.normal(key, (1024,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (1024,), jnp.float32)
  args = (x, y)
  cases = [
      ("profile_add_1024", kernels.add, lambda a, b: a + b),
      ("profile_add_1024_autotuned",
       functools.partial(kernels.add, autotuned=True), lambda a, b: a + b),
      ("profile_16_adds_one_jit", _chain16, _xla_chain16),
  ]
  for label, body, xla_body in cases:
    fns = _variants(body, args, libs, xla_body)
    expected = np.asarray(jax.jit(xla_body)(x, y))
    _measure(results, label, fns, args, expected, sizes, record)
