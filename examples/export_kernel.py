"""Exporting a function that calls a Triton kernel with ``jax.export``.

``--save DIR`` exports ``scaled_add`` (``x * 2.5 + y`` on 4096 float32s)
for CUDA, for the compute capability given (90 by default: H100/H200),
twice: with PTX only, and with a CUBIN besides. It needs no GPU (JAX's CUDA
plugin lets a CPU host lower for CUDA). ``--run DIR`` loads every artifact
in DIR on a GPU host, checks it against this host's GPU and versions, runs
it on seeded random inputs, and compares with NumPy.

    python examples/export_kernel.py --save examples/artifacts
    python examples/export_kernel.py --run examples/artifacts   # GPU host

examples/artifacts/ holds artifacts made this way with Triton 3.6 (whose
PTX the jaxlib of a Triton 3.6 host assembles), for sm_90.
"""

from __future__ import annotations

import jt_dist  # pylint: disable=g-bad-import-order

import argparse
import glob
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

N = 4096
ALPHA = 2.5
SUFFIX = ".jax_exported"


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, alpha, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x * alpha + y, mask=mask)


def scaled_add(x: jax.Array, y: jax.Array) -> jax.Array:
  """``x * ALPHA + y`` for two 1-D float32 arrays of one shape."""
  return jt_dist.triton_call(
      x, y, ALPHA, x.size,
      kernel=scaled_add_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
      BLOCK=256)


def export(compute_capability: int = 90, cubin: bool = False):
  """``scaled_add`` exported for CUDA; needs no GPU on this host."""
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  with jt_dist.export_options(compute_capability=compute_capability,
                              cubin=cubin):
    return jax.export.export(
        jax.jit(scaled_add), platforms=["cuda"],
        disabled_checks=jt_dist.export_safety_checks())(spec, spec)


def artifact_name(compute_capability: int, cubin: bool) -> str:
  kind = "cubin" if cubin else "ptx"
  return f"scaled_add_sm{compute_capability}_{kind}{SUFFIX}"


def save(directory: str, compute_capability: int = 90) -> list[str]:
  """Writes the PTX and the CUBIN artifact into ``directory``."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for cubin in (False, True):
    exported = export(compute_capability, cubin)
    path = os.path.join(directory, artifact_name(compute_capability, cubin))
    with open(path, "wb") as f:
      f.write(exported.serialize())
    (call,) = jt_dist.exported_versions(exported)
    print(f"wrote {path} ({os.path.getsize(path)} bytes): {call}")
    paths.append(path)
  return paths


def run(path: str, seed: int = 0) -> float:
  """Loads one artifact, checks it can run here, runs it against NumPy.

  Returns:
    The largest absolute difference from NumPy.

  Raises:
    jt_dist.ExportError: the artifact's kernels do not run on this GPU.
  """
  with open(path, "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  for note in jt_dist.check_exported(exported):
    print(f"note: {note}")
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(N, dtype=np.float32)
  y = rng.standard_normal(N, dtype=np.float32)
  out = np.asarray(jax.jit(exported.call)(jnp.asarray(x), jnp.asarray(y)))
  expected = x * np.float32(ALPHA) + y
  error = float(np.max(np.abs(out - expected)))
  (call,) = jt_dist.exported_versions(exported)
  print(f"{os.path.basename(path)} ({call.binary}, sm_"
        f"{call.compute_capability}, Triton {call.triton}, jaxlib"
        f" {call.jaxlib}) on {jax.devices()[0]}: max |error| vs NumPy ="
        f" {error:.3g}")
  return error


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  action = parser.add_mutually_exclusive_group(required=True)
  action.add_argument("--save", metavar="DIR", help="export into DIR")
  action.add_argument("--run", metavar="DIR",
                      help="run every artifact in DIR (needs a CUDA GPU)")
  parser.add_argument("--compute-capability", type=int, default=90)
  args = parser.parse_args(argv)
  if args.save:
    save(args.save, args.compute_capability)
    return 0
  paths = sorted(glob.glob(os.path.join(args.run, "*" + SUFFIX)))
  if not paths:
    print(f"no *{SUFFIX} files in {args.run}", file=sys.stderr)
    return 1
  try:
    errors = [run(path) for path in paths]
  except jt_dist.ExportError as e:  # E.g. no CUDA GPU, or another one.
    print(f"error: {e}", file=sys.stderr)
    return 2
  # A fused multiply-add rounds once where NumPy rounds twice: |error| stays
  # within an ulp of the result (< 1e-5 for these magnitudes).
  return 0 if max(errors) < 1e-5 else 1


if __name__ == "__main__":
  sys.exit(main())
