"""What the CPU interpreter cannot run, refused when the call is lowered.

Checked in the CPU lowering rule, before the host callback exists: a call
never reaches Triton's interpreter only to fail there from inside a
callback, and a call lowered for a GPU on this host (cross-lowering) is not
affected.
"""

from __future__ import annotations

import jax

from jt_dist import _compat
from jt_dist._core import kernel as _kernel


def check(spec) -> None:
  """Refuses a call the interpreter cannot run.

  Raises:
    NotImplementedError: the kernel is a Gluon kernel, or a descriptor
      rounds to TF32 on a Triton without it.
    ValueError: a launch asks for thread-block clusters (``num_ctas > 1``).
  """
  name = spec.info.name
  check_kernel(name, spec.info.fn)
  for op in spec.operands:
    if op.kind == "array" and op.type.startswith("tensordesc"):
      _compat.check_tf32_descriptor(op.value, name)
  for launch in spec.launches:
    if launch.config.num_ctas > 1:
      raise ValueError(
          f"triton_call: kernel {name!r} asks for num_ctas="
          f"{launch.config.num_ctas} (config: {launch.config.label}), a"
          " cluster of thread blocks; clusters are not available on the CPU"
          " (Triton's interpreter runs one program at a time), only on CUDA"
          " GPUs from Hopper (sm_90). Pass num_ctas=1 on the CPU.")


def check_kernel(name: str, fn) -> None:
  """Refuses a Gluon kernel: Triton's interpreter cannot run one.

  Raises:
    NotImplementedError: ``fn`` is a Gluon kernel.
  """
  if _compat.is_gluon(fn):
    raise NotImplementedError(
        f"triton_call: kernel {name!r} is a Gluon kernel"
        " (@triton.experimental.gluon.jit), and Triton's interpreter cannot"
        " run Gluon: its layouts and shared-memory operations exist only"
        " on GPUs. Run the call on a GPU (jax.jit(...).lower(...,"
        " lowering_platforms=('cuda',)) compiles it here without one), or"
        " write a @triton.jit version of the kernel for the CPU.")
