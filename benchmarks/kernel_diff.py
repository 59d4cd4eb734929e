"""Why one library's kernel runs faster than the other's: the diff, on one GPU.

For the keyword-form matmul of ``scaling.py`` at M = 1024 (one shard of
8192 rows over 8 GPUs) and M = 8192, this lowers jt_dist's call (each
custom-call target and payload) and jax-triton's, and prints:

- what each serialised call carries: its size, the kernel's launch
  parameters (warps, shared memory, grid, parameter divisibility) and
  whether the PTX of the two libraries is the same text;
- each CUBIN's registers and spills, for jt_dist's (Triton's ``ptxas``) and
  for jax-triton's PTX assembled by the CUDA toolkit's ``ptxas``, which is
  what jaxlib uses;
- the time of each form, interleaved, on one GPU.

    python benchmarks/kernel_diff.py --out benchmarks/results/h200x1/kernel_diff.json
"""

import argparse
import difflib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top
import jt_dist  # pylint: disable=g-import-not-at-top
from jt_dist._gpu import lowering as _gpu_lowering  # pylint: disable=g-import-not-at-top
import scaling  # pylint: disable=g-import-not-at-top
import timing  # pylint: disable=g-import-not-at-top

_LEGACY = "triton_kernel_call"


def _forms(problem, jax_triton):
  """name -> (step, proto choices)."""
  forms = {
      "jt_dist": (functools.partial(problem.local, jt_dist.triton_call), {}),
      "jt_dist[FFI, no CUBIN]": (
          functools.partial(problem.local, jt_dist.triton_call),
          {"module_images": False}),
      "jt_dist[legacy]": (functools.partial(
          problem.local, jt_dist.triton_call,
          custom_call_target_name=_LEGACY), {}),
  }
  if jax_triton is not None:
    forms["jax_triton"] = (functools.partial(
        problem.local, jax_triton.triton_call), {})
  return forms


def _assemble(ptx: str, ptxas: str, folder: str, name: str) -> dict:
  """Assembles ``ptx`` with ``ptxas`` for sm_90a; registers and spills."""
  src = os.path.join(folder, f"{name}.ptx")
  out = os.path.join(folder, f"{name}.cubin")
  with open(src, "w") as f:
    f.write(ptx)
  result = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", out],
                          capture_output=True, text=True, check=False)
  return {"ptxas": ptxas, "returncode": result.returncode,
          "report": (result.stdout + result.stderr).strip()[-600:]}


def _resource_usage(cubin: bytes, folder: str, name: str) -> str:
  path = os.path.join(folder, f"{name}.cubin")
  with open(path, "wb") as f:
    f.write(cubin)
  tool = shutil.which("cuobjdump")
  if tool is None:
    return "cuobjdump not found"
  result = subprocess.run([tool, "-res-usage", path], capture_output=True,
                          text=True, check=False)
  return (result.stdout + result.stderr).strip()[-600:]


def _ptxas_versions():
  found = {}
  for label, path in (("toolkit", shutil.which("ptxas")),
                      ("triton", _triton_ptxas())):
    if path:
      result = subprocess.run([path, "--version"], capture_output=True,
                              text=True, check=False)
      found[label] = {"path": path, "version": result.stdout.strip()[-80:]}
  return found


def _triton_ptxas():
  try:
    from triton.backends.nvidia import compiler  # pylint: disable=g-import-not-at-top
    try:
      return compiler.get_ptxas(90).path  # Triton >= 3.7 takes the arch.
    except TypeError:
      return compiler.get_ptxas().path
  except Exception:  # pylint: disable=broad-except
    return None


def diff_rows(rows, jax_triton, folder):
  """Lowers every form at ``rows`` rows; what each call carries."""
  problem = scaling.Matmul(scaling.SIZES["full"])
  args = problem.inputs(rows, jax.random.key(rows))
  report = {}
  for name, (step, choices) in _forms(problem, jax_triton).items():
    with mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(**choices)):
      lowered = jax.jit(step).trace(*args).lower()
    (call,) = util.triton_custom_calls(lowered)
    kernel = call["calls"][0]
    report[name] = {
        "target": call["target"], "opaque_bytes": call["opaque_bytes"],
        "num_warps": kernel["num_warps"], "shared_mem": kernel["shared_mem"],
        "grid": kernel["grid"], "params": kernel["params"],
        "ptx_bytes": len(kernel["ptx"]),
        "cubin_bytes": len((kernel["module_image"] or {}).get(
            "object_file", b""))}
    report[name]["_ptx"] = kernel["ptx"]
    if kernel["module_image"]:
      report[name]["cubin_resources"] = _resource_usage(
          kernel["module_image"]["object_file"], folder, f"{name}-{rows}")
  if "jax_triton" in report:
    ours = report["jt_dist"]["_ptx"].splitlines()
    theirs = report["jax_triton"]["_ptx"].splitlines()
    report["ptx_same_text"] = ours == theirs
    report["ptx_diff"] = list(difflib.unified_diff(
        theirs, ours, "jax_triton", "jt_dist", n=0, lineterm=""))[:80]
    for label, info in _ptxas_versions().items():
      report[f"jax_triton_ptx_assembled_by_{label}"] = _assemble(
          report["jax_triton"]["_ptx"], info["path"], folder,
          f"jax_triton-{rows}-{label}")
      report[f"jt_dist_ptx_assembled_by_{label}"] = _assemble(
          report["jt_dist"]["_ptx"], info["path"], folder,
          f"jt_dist-{rows}-{label}")
  for entry in report.values():
    if isinstance(entry, dict):
      entry.pop("_ptx", None)
  return report, problem, args


def time_forms(problem, args, jax_triton, iters=20, rounds=15):
  calls = {}
  reference = np.asarray(jax.jit(problem.reference)(*args), np.float32)
  for name, (step, choices) in _forms(problem, jax_triton).items():
    with mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(**choices)):
      fn = jax.jit(step).trace(*args).lower().compile()
    error = timing.relative_error(np.asarray(fn(*args), np.float32), reference)
    assert error < 2e-2, (name, error)
    calls[name] = (fn, args)
  seconds = timing.interleaved_chained_each(calls, iters=iters, rounds=rounds,
                                           shuffle_seed=0, settle=True)
  work = problem.work(args[0].shape[0])
  return {name: {"ms": s * 1e3, "TFLOPs": work / s}
          for name, s in seconds.items()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  try:
    import jax_triton  # pylint: disable=g-import-not-at-top
  except Exception:  # pylint: disable=broad-except
    jax_triton = None
  result = {"environment": timing.environment(), "ptxas": _ptxas_versions()}
  with tempfile.TemporaryDirectory() as folder:
    for rows in (1024, 8192):
      report, problem, inputs = diff_rows(rows, jax_triton, folder)
      inputs = tuple(jax.device_put(a, jax.devices()[0]) for a in inputs)
      report["timing"] = time_forms(problem, inputs, jax_triton)
      result[f"rows_{rows}"] = report
  print(json.dumps(result, indent=1, default=str))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
  main()
