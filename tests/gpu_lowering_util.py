"""Helpers for tests of what a call binds and lowers: jaxprs, custom calls.

jaxlib's Triton call is a protobuf; the tests decode it with the few lines
of wire-format parsing below rather than depend on protobuf, or on
jt_dist's own reader: what jt_dist writes is read back independently.
Everything here goes through jax, jaxlib and environment variables, never
jt_dist's private modules, so that the tests using it survive a refactor.
"""

from __future__ import annotations

import importlib
import os
import struct
import tempfile
import unittest
from unittest import mock
import zlib

import jax
from jax.extend import core as jax_core
from jax.interpreters import mlir

ir = mlir.ir


def plugin(platform: str):
  """jaxlib's Triton bindings for ``platform``, or None where not installed."""
  try:
    module = importlib.import_module("jaxlib.gpu_triton")
  except ImportError:
    return None
  found = getattr(module, "_cuda_triton" if platform == "cuda"
                  else "_hip_triton", None)
  return found if hasattr(found, "TritonKernel") else None


HAS_TRITON_CALL = plugin("cuda") is not None
SKIP_REASON = (
    "jaxlib's Triton custom call for CUDA (jaxlib.gpu_triton._cuda_triton) is"
    " missing: install jax-cuda12-plugin (--no-deps, at the jax version) to"
    " cross-lower for CUDA on this host.")
HAS_ROCM_TRITON_CALL = plugin("rocm") is not None
ROCM_SKIP_REASON = (
    "jaxlib's Triton custom call for ROCm (jaxlib.gpu_triton._hip_triton) is"
    " missing: install jax-rocm7-plugin (--no-deps, at the jax version; on a"
    " host without ROCm, conftest.py loads a stub HIP runtime for it, which"
    " needs a C compiler).")


def bound_calls(f, *args) -> list:
  """The ``jt_dist_triton_call`` equations of ``jax.make_jaxpr(f)(*args)``.

  Nested jaxprs (an eager call's own jit, a shard_map, a cond) included;
  each equation's ``params["spec"]`` is what the call bound.
  """
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "jt_dist_triton_call":
        found.append(eqn)
      for sub in jax_core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(f)(*args).jaxpr)
  return found


def lower(f, *args, platform: str = "cuda"):
  """``jax.jit(f)`` traced and lowered for ``platform`` on this host."""
  # A fresh function each time: jit caches lowerings per function, and a
  # cached lowering would not run the lowering rule under test.
  fresh = lambda *a: f(*a)
  return jax.jit(fresh).trace(*args).lower(lowering_platforms=(platform,))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, pos


def decode(data: bytes) -> dict[int, list]:
  """Decodes one protobuf message into {field number: [values]}.

  A varint's value is its integer; any other field's is its bytes.
  """
  fields: dict[int, list] = {}
  pos = 0
  while pos < len(data):
    tag, pos = _varint(data, pos)
    wire_type = tag & 7
    if wire_type == 0:
      value, pos = _varint(data, pos)
    else:
      if wire_type == 2:
        size, pos = _varint(data, pos)
      else:  # Fixed 64 (1) or 32 (5) bits.
        size = {1: 8, 5: 4}[wire_type]
      value, pos = data[pos:pos + size], pos + size
      assert pos <= len(data), f"field {tag >> 3} runs past the message"
    fields.setdefault(tag >> 3, []).append(value)
  return fields


def _module_image(call: dict[int, list]) -> dict | None:
  # A later occurrence of the singular ``kernel`` field merges into the
  # first, as protobuf parsers do; the module image may be in either.
  for raw in call[1]:
    kernel = decode(raw)
    if 11 in kernel:
      image = decode(kernel[11][0])
      return {"object_file": image[1][0], "kernel_name": image[2][0].decode(),
              "shared_mem": image.get(3, [0])[0]}
  return None


def decode_kernel_call(data: bytes) -> dict:
  """A ``TritonKernelCall`` as a dict of its kernel, grid and parameters."""
  call = decode(data)
  kernel = decode(call[1][0])
  params = []
  for raw in call.get(5, []):
    param = decode(raw)
    if 1 in param:
      array = decode(param[1][0])
      params.append(("array", array.get(1, [0])[0], array.get(2, [0])[0]))
    elif 2 in param:
      params.append(("bool", bool(param[2][0])))
    elif 3 in param:
      value = param[3][0]
      params.append(("i32", value - (1 << 64) if value >= 1 << 63 else value))
    elif 5 in param:
      value = param[5][0]
      params.append(("i64", value - (1 << 64) if value >= 1 << 63 else value))
    elif 7 in param:
      params.append(("f32", struct.unpack("<f", param[7][0])[0]))
    elif 9 in param:  # A host TMA descriptor (jaxlib 0.11.2 and later).
      params.append(("tma", decode(param[9][0])))
    else:
      params.append(("other", sorted(param)))
  return {
      "name": kernel[1][0].decode(),
      "num_warps": kernel.get(2, [0])[0],
      "num_ctas": kernel.get(10, [1])[0],
      "shared_mem": kernel.get(3, [0])[0],
      "ptx": kernel.get(4, [b""])[0].decode(),
      "ttir": kernel.get(5, [b""])[0].decode(),
      "compute_capability": kernel.get(6, [0])[0],
      "grid": tuple(call.get(i, [0])[0] for i in (2, 3, 4)),
      "params": params,
      "module_image": _module_image(call),
  }


def decode_any_call(data: bytes) -> dict:
  """A ``TritonAnyKernelCall``: plain or autotuned, with name and metadata."""
  message = decode(data)
  result = {
      "name": message.get(4, [b""])[0].decode(),
      "metadata": message.get(3, [b""])[0],
  }
  if 1 in message:
    result["calls"] = [decode_kernel_call(message[1][0])]
    result["autotuned"] = False
    return result
  tuned = decode(message[2][0])
  result["autotuned"] = True
  result["tuning_name"] = tuned[1][0].decode()
  result["calls"] = [decode_kernel_call(b"".join(decode(c)[1]))
                     for c in tuned[2]]
  result["descriptions"] = [decode(c)[2][0].decode() for c in tuned[2]]
  result["aliases"] = [
      tuple(decode(a).get(i, [0])[0] for i in (1, 2, 3))
      for a in tuned.get(3, [])]
  return result


def triton_custom_calls(lowered) -> list[dict]:
  """The Triton custom calls of a ``jax.stages.Lowered``, decoded."""
  return module_triton_custom_calls(lowered.compiler_ir("stablehlo"))


def walk_operations(operation):
  """Yields ``operation`` and every operation nested in its regions."""
  yield operation
  for region in operation.regions:
    for block in region.blocks:
      for op in block.operations:
        yield from walk_operations(op.operation)


def legacy_opaque(lowered) -> bytes:
  """The backend config of the one legacy Triton custom call in ``lowered``."""
  module = lowered.compiler_ir("stablehlo")
  (opaque,) = [
      ir.StringAttr(op.attributes["backend_config"]).value_bytes
      for op in walk_operations(module.operation)
      if op.name == "stablehlo.custom_call"
      and ir.StringAttr(op.attributes["call_target_name"]).value
      == "triton_kernel_call"]
  return opaque


def exported_triton_custom_calls(exported) -> list[dict]:
  """The Triton custom calls of a ``jax.export.Exported``, decoded."""
  with mlir.make_ir_context() as context:
    return module_triton_custom_calls(
        ir.Module.parse(exported.mlir_module(), context=context))


def module_triton_custom_calls(module) -> list[dict]:
  """The Triton custom calls of a StableHLO ``ir.Module``, decoded."""
  calls = []
  for op in walk_operations(module.operation):
    if op.name != "stablehlo.custom_call":
      continue
    attrs = op.attributes
    target = ir.StringAttr(attrs["call_target_name"]).value
    if not target.startswith("triton_kernel_call"):
      continue
    if target == "triton_kernel_call_ffi":
      config = ir.DictAttr(attrs["mhlo.backend_config"])
      opaque = ir.StringAttr(config["opaque"]).value_bytes
    else:
      opaque = ir.StringAttr(attrs["backend_config"]).value_bytes
    aliases = (str(attrs["output_operand_aliases"])
               if "output_operand_aliases" in attrs else "")
    calls.append({"target": target, "aliases_text": aliases,
                  "opaque_bytes": len(opaque),
                  **decode_any_call(zlib.decompress(opaque))})
  return calls


class IsolatedCacheMixin(unittest.TestCase):
  """Gives each test its own disk cache dir, through the environment.

  The suite leaves no ``configure_cache`` override behind (tests that set
  one restore it), so ``JT_DIST_CACHE_DIR`` and ``JT_DIST_DISK_CACHE``
  decide where kernels go.
  """

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self.cache_dir = self._tmp.name
    self.enterContext(mock.patch.dict(os.environ, {
        "JT_DIST_CACHE_DIR": self.cache_dir, "JT_DIST_DISK_CACHE": "1"}))


class JaxlibAutotuningMixin(unittest.TestCase):
  """Lowers autotuned kernels with every config, for jaxlib to time.

  Tests that read jaxlib's autotuned call need this: on a GPU host jt_dist
  would otherwise time the configs itself and lower the winner alone.
  """

  def setUp(self):
    super().setUp()
    self.enterContext(mock.patch.dict(os.environ,
                                      {"JT_DIST_AUTOTUNE": "jaxlib"}))
