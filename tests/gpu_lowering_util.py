"""Helpers for tests of the GPU lowering: custom-call extraction, protos.

jaxlib's Triton call is a protobuf; the tests decode it with the few lines
of wire-format parsing below rather than depend on protobuf.
"""

from __future__ import annotations

import struct
import tempfile
import unittest
from unittest import mock
import zlib

import jax
from jax._src.lib.mlir import ir

from jt_dist._tools import export as _export
from jt_dist import _settings
from jt_dist._backend import cache as _cache
from jt_dist._gpu import lowering as _gpu_lowering
from jt_dist import _compat
from jt_dist._gpu import proto_wire as _proto_wire

HAS_TRITON_CALL = _compat.gpu_triton_module() is not None and hasattr(
    getattr(_compat.gpu_triton_module(), "_cuda_triton", None), "TritonKernel")
SKIP_REASON = (
    "jaxlib's Triton custom call for CUDA (jaxlib.gpu_triton._cuda_triton) is"
    " missing: install jax-cuda12-plugin (--no-deps, at the jax version) to"
    " cross-lower for CUDA on this host.")
HAS_ROCM_TRITON_CALL = _compat.gpu_triton_module() is not None and hasattr(
    getattr(_compat.gpu_triton_module(), "_hip_triton", None), "TritonKernel")
ROCM_SKIP_REASON = (
    "jaxlib's Triton custom call for ROCm (jaxlib.gpu_triton._hip_triton) is"
    " missing: install jax-rocm7-plugin (--no-deps, at the jax version; on a"
    " host without ROCm, conftest.py loads a stub HIP runtime for it, which"
    " needs a C compiler).")


def lower(f, *args, platform: str = "cuda"):
  """``jax.jit(f)`` traced and lowered for ``platform`` on this host."""
  # A fresh function each time: jit caches lowerings per function, and a
  # cached lowering would not run the lowering rule under test.
  fresh = lambda *a: f(*a)
  return jax.jit(fresh).trace(*args).lower(lowering_platforms=(platform,))


def decode(data: bytes) -> dict[int, list]:
  """Decodes one protobuf message into {field number: [values]}."""
  fields: dict[int, list] = {}
  for field in _proto_wire.parse_fields(data):
    fields.setdefault(field.number, []).append(field.value())
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


def legacy_opaque(lowered) -> bytes:
  """The backend config of the one legacy Triton custom call in ``lowered``."""
  module = lowered.compiler_ir("stablehlo")
  (opaque,) = [
      ir.StringAttr(op.attributes["backend_config"]).value_bytes
      for op in _export.walk_operations(module.operation)
      if op.name == "stablehlo.custom_call"
      and ir.StringAttr(op.attributes["call_target_name"]).value
      == "triton_kernel_call"]
  return opaque


def exported_triton_custom_calls(exported) -> list[dict]:
  """The Triton custom calls of a ``jax.export.Exported``, decoded."""
  from jax.interpreters import mlir  # pylint: disable=g-import-not-at-top

  with mlir.make_ir_context() as context:
    return module_triton_custom_calls(
        ir.Module.parse(exported.mlir_module(), context=context))


def module_triton_custom_calls(module) -> list[dict]:
  """The Triton custom calls of a StableHLO ``ir.Module``, decoded."""
  calls = []
  for op in _export.walk_operations(module.operation):
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


def keep_settings(test: unittest.TestCase) -> None:
  """Restores what the ``configure_*`` functions set once ``test`` is over.

  They replace ``_settings._configured`` whole, never change it in place,
  so putting back the object found now restores every one of them.
  """
  test.enterContext(mock.patch.object(
      _settings, "_configured", _settings._configured))  # pylint: disable=protected-access


def with_ttir():
  """Lowerings inside the block carry each kernel's TTIR, for tests to read."""
  return mock.patch.object(_gpu_lowering, "proto_choices",
                           _gpu_lowering.ProtoChoices(ttir=True))


class IsolatedCacheMixin(unittest.TestCase):
  """Gives each test an empty memory cache and its own disk cache dir."""

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.cache_dir = self._tmp.name
    keep_settings(self)
    _settings.configure_cache(disk_cache=True, cache_dir=self.cache_dir)
    _cache.memory_cache.clear()

    def restore():
      _cache.memory_cache.clear()
      self._tmp.cleanup()

    self.addCleanup(restore)


class JaxlibAutotuningMixin(unittest.TestCase):
  """Lowers autotuned kernels with every config, for jaxlib to time.

  Tests that read jaxlib's autotuned call need this: on a GPU host jt_dist
  would otherwise time the configs itself and lower the winner alone.
  """

  def setUp(self):
    super().setUp()
    keep_settings(self)
    _settings.configure_autotune(mode="jaxlib")
