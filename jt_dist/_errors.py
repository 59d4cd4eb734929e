"""Exception types raised by jt_dist.

Every error subclasses a builtin (``ValueError``, ``TypeError``,
``IndexError``, ``RuntimeError`` or ``NotImplementedError``) so that callers
who catch the builtin keep working.
"""

from __future__ import annotations

from typing import Any, Callable

import jax


class KernelBindingError(TypeError):
  """The arguments of a call do not bind the kernel's parameters.

  Raised when positional arguments, outputs and metaparams do not bind every
  kernel parameter exactly once, or a metaparam names no kernel parameter.
  """


class DevicePlacementError(ValueError):
  """The array arguments of a call do not live where the kernel can run.

  A Triton kernel sees raw pointers into one device's memory. Inputs that are
  sharded or replicated over several devices, or that sit on different
  devices, have to go through ``jt_dist.sharded_triton_call`` or
  ``jax.shard_map`` instead.
  """


class AutoAxesError(DevicePlacementError, NotImplementedError):
  """A call with a sharding rule cannot be split over automatic mesh axes.

  On ``AxisType.Auto`` axes XLA chooses the layout after tracing. On GPUs
  jt_dist hands such calls to XLA's partitioner; on the CPU it cannot (the
  kernel is a host callback), nor anywhere when the shardings were given
  only to ``jax.jit``. Make the axes explicit
  (``jax.make_mesh(..., axis_types=(AxisType.Explicit,) * n)``). It is a
  ``DevicePlacementError`` (the call cannot run where its inputs are) and a
  ``NotImplementedError``.
  """


class ExportError(ValueError):
  """A kernel call cannot be exported, or an exported one cannot run here.

  Raised when ``jax.export`` lowers a call for CUDA without a
  ``compute_capability``, and by ``jt_dist.check_exported`` when an
  artifact's kernels were compiled for a GPU unlike the one at hand.
  """


class ShardingSpecError(ValueError):
  """The partition specs or mesh given to ``sharded_triton_call`` are invalid.

  Among them: an output that varies over a mesh axis (an input is split
  over it) whose ``out_specs`` entry does not name it, ``P()`` by default;
  the message gives the spec it needs, or ``out_reduce`` for partial
  results.
  """


class OutOfBoundsAccessError(IndexError):
  """A kernel run through the CPU interpreter accessed memory outside a buffer.

  Raised before the access touches memory. The message names the kernel, the
  parameter the pointer came from, the program id, the offending element
  offsets, the buffer's size and the mask in force. Set
  ``JT_DIST_BOUNDS_CHECK=0`` to run unchecked.
  """


class UnwrittenOutputReadError(ValueError):
  """A kernel read output memory that nothing had written yet.

  Outputs start undefined on a GPU (jaxlib does not clear them) unless they
  are aliased to an input or listed in ``zeroed_outputs``; the CPU
  interpreter tracks which bytes a launch wrote and refuses such reads.
  With ``debug=True`` it also refuses a launch that leaves part of an
  output unwritten, which the caller would read next (without ``debug``,
  a ``RuntimeWarning``, once per kernel).
  """


class KernelLaunchError(RuntimeError):
  """The device reported an illegal address or failed launch for a kernel.

  Raised by an eager ``triton_call`` around jaxlib's runtime error, naming
  the kernel and its launch (grid, config); the original error is chained.
  """


class KernelAssertionError(KernelLaunchError, AssertionError):
  """A kernel's ``tl.device_assert`` or ``tl.static_assert`` failed.

  Raised on the CPU interpreter, where ``debug=True`` turns device-side
  asserts on (``tl.static_assert`` is always on, as when compiling). The
  message names the kernel, the program id and the assert's own message.
  It is a ``KernelLaunchError`` (on a GPU a failed device assert surfaces as
  one) and an ``AssertionError``.
  """


class KernelTypeError(TypeError):
  """A kernel applies an operation to a dtype Triton cannot compile it for.

  Raised on the CPU interpreter for arithmetic, comparisons, minimum,
  maximum, reductions and scans on float8 values, for math functions on
  operands they do not take (``tl.exp`` on bfloat16, say), and for a loop
  bound, step or index that is a pointer or a float (a jax array, even 0-d,
  reaches a kernel as a pointer), all of which Triton refuses to compile
  too. The message names the kernel, the program id, the operation or
  conversion and the dtype.
  """


class VectorisedMismatchError(RuntimeError):
  """A CPU launch wrote different bytes vectorised and one program at a time.

  Raised under ``JT_DIST_VECTORIZE=check``, which runs every CPU launch both
  ways. The message names the kernel, the buffer and the first element that
  differs; the outputs are those of the run one program at a time.
  """


class AutotuneError(RuntimeError):
  """jt_dist could not choose one autotuning config for every shard.

  Raised when no config of an autotuned kernel runs, or when a process of a
  multi-process run waits in vain for process 0's choice.
  """


def process_note() -> str:
  """``" (in process 1 of 2)"`` in a multi-process run, else ``""``."""
  if jax.process_count() == 1:
    return ""
  return f" (in process {jax.process_index()} of {jax.process_count()})"


def call_user(fn: Callable[..., Any], role: str, *args: Any,
              **kwargs: Any) -> Any:
  """``fn(*args, **kwargs)``; what it raises (type kept) notes ``fn``."""
  try:
    return fn(*args, **kwargs)
  except Exception as e:
    name = getattr(fn, "__qualname__", None) or repr(fn)
    if (code := getattr(fn, "__code__", None)) is not None:
      name += f" ({code.co_filename}:{code.co_firstlineno})"
    e.add_note(f"jt_dist: raised by {role} {name}.")
    raise


def raise_if_scalar_pointer(error: Exception, spec, shapes) -> None:
  """Raises a ``KernelTypeError`` naming 0-d arrays a kernel used as numbers:
  a 0-d array binds a pointer parameter (as in jax-triton), and Triton's
  ``error`` about pointers or a static assert does not name the parameter."""
  # Triton chains errors from called functions (tl.rand's static assert).
  chain, cause = [], error
  while cause is not None and len(chain) < 8:
    chain.append(str(cause))
    cause = cause.__cause__
  if not any("pointer" in t or "static_assert" in t for t in chain):
    return
  loaded = getattr(spec.info.python_fn, "loaded_by_value", ())
  names = [op.label for op in spec.operands
           if op.kind == "array" and op.index < len(shapes)
           and tuple(shapes[op.index]) == () and op.name not in loaded]
  if not names:
    return
  listed = ", ".join(repr(n) for n in names)
  plural = len(names) > 1
  raise KernelTypeError(
      f"{error} (In kernel {spec.info.name!r}, parameter{'s' if plural else ''}"
      f" {listed} {'are' if plural else 'is'} bound to a 0-d array, which a"
      " kernel receives as a pointer, as in jax-triton; under jax.jit every"
      " argument is an array. To pass the value, wrap it:"
      " jt_dist.runtime_scalar(x); to keep the pointer, read it with"
      " tl.load.)") from error
