"""``kernel_metadata``: what ``kernel.warmup(...)`` tells about a compiled
kernel (registers, shared memory, warps), for the device a call runs on."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from jt_dist import _compat
from jt_dist._autotune import choose as _choose
from jt_dist._backend import target as _target
from jt_dist._gpu import compile as _compile
from jt_dist._sharding import local_call as _local_call


@dataclasses.dataclass(frozen=True)
class KernelMetadata:
  """One config of a kernel as compiled for a device.

  What Triton's ``CompiledKernel`` reports: ``kernel.n_regs`` is
  ``n_regs`` here, ``kernel.metadata.shared`` is ``shared``.

  Attributes:
    name: the compiled kernel's name.
    target: what it was compiled for: ``"sm_90"``, a gfx arch such as
      ``"gfx942"``, or ``"cpu"``.
    config: the config's label, e.g. ``"BLOCK: 128, num_warps: 4, ..."``.
    num_warps: warps per program.
    num_stages: software-pipelining stages.
    num_ctas: programs per cluster.
    shared: bytes of shared memory per program (0 on the CPU).
    n_regs: registers per thread, or None where unknown: on the CPU, which
      has no register file, and where Triton's GPU driver cannot load the
      kernel.
    n_spills: registers spilled to local memory per thread, or None where
      ``n_regs`` is.
    warp_size: threads per warp (32 on CUDA, 64 on ROCm's CDNA GPUs),
      None on the CPU.
  """

  name: str
  target: str
  config: str
  num_warps: int
  num_stages: int
  num_ctas: int
  shared: int
  n_regs: int | None
  n_spills: int | None
  warp_size: int | None


def _gpu_target(device) -> _target.Target:
  version = str(getattr(device.client, "platform_version", "")).lower()
  if "rocm" in version or "hip" in version:
    return _target.Target("rocm", _target.rocm_arch(device))
  return _target.Target("cuda", _target.cuda_capability(device))


def _one(spec, launch, device) -> KernelMetadata:
  config = launch.config
  facts = dict(name=spec.info.name, config=config.label,
               num_warps=config.num_warps, num_stages=config.num_stages,
               num_ctas=config.num_ctas)
  if device.platform == "cpu":
    return KernelMetadata(target="cpu", shared=0, n_regs=None,
                          n_spills=None, warp_size=None, **facts)
  target = _gpu_target(device)
  cuda = target.platform == "cuda"
  compiled, _ = _compile.compiled_kernel(spec, launch, target,
                                         object_file=cuda)
  n_regs, n_spills = _compat.loaded_registers(
      compiled.name, compiled.object_file if cuda else compiled.binary,
      compiled.shared_mem, device.local_hardware_id)
  return KernelMetadata(**{**facts, "name": compiled.name,
                           "num_warps": compiled.num_warps},
                        target=target.describe(), shared=compiled.shared_mem,
                        n_regs=n_regs,
                        n_spills=n_spills, warp_size=target.warp_size)


def kernel_metadata(kernel: Any, *args: Any, out_shape: Any = None,
                    grid: Any = 1, device: Any = None,
                    **kwargs: Any) -> KernelMetadata | list[KernelMetadata]:
  """Compiles a kernel call for a device without running it, as Triton's
  ``kernel.warmup(...)`` does, and reports what the compiler chose.

  Called with ``triton_call``'s arguments, e.g. to size a persistent grid by
  occupancy as Triton's fused-softmax tutorial does:

      info = jt_dist.kernel_metadata(softmax_kernel, x, x.shape[0],
                                     out_shape=x, BLOCK_SIZE=1024,
                                     num_warps=8)
      occupancy = 65536 // (info.n_regs * info.warp_size * info.num_warps)

  Args:
    kernel: a ``@triton.jit`` kernel, optionally autotuned.
    *args: its arguments as for ``triton_call``: arrays, or anything with
      ``.shape`` and ``.dtype`` (``jax.ShapeDtypeStruct``s, tracers), and
      scalars.
    out_shape: the outputs, as for ``triton_call``.
    grid: as for ``triton_call``; the default suits kernels whose grid does
      not matter to the compiler.
    device: the device to compile for; by default JAX's first device.
    **kwargs: ``triton_call``'s options and the kernel's metaparams.

  Returns:
    The ``KernelMetadata`` of the call's config; for a kernel wrapped in
    ``@triton.autotune``, a list with one per config left after pruning,
    as Triton's ``Autotuner.warmup`` returns. On the CPU nothing is
    compiled: ``target`` is ``"cpu"``, ``shared`` 0, and ``n_regs``,
    ``n_spills`` and ``warp_size`` None.
  """
  options, metaparams = _local_call.options_from_keywords(kernel, kwargs)
  _, spec, _ = _local_call.check_binding(args, kernel, out_shape, grid,
                                         options, metaparams)
  device = jax.devices()[0] if device is None else device
  found = [_one(single, single.launches[0], device)
           for single in (_choose.single(spec, i)
                          for i in range(len(spec.launches)))]
  if isinstance(kernel, _compat.Autotuner):
    return found
  return found[0]
