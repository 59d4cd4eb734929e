"""Timing an autotuned call's configs on one local device, outside any trace.

The choice is made while a call is lowered, possibly inside the user's
``jax.jit`` or ``jax.shard_map``, so the configs are timed in a thread of
their own, whose JAX context (traces, meshes) is fresh: each config alone,
as a one-device ``jax.jit`` of the primitive, on inputs of the call's shapes
(random normal floats; zero integers and bools, which kernels often use as
indices or offsets). Zeroed and aliased outputs are prepared by the call
itself, as in the real run; the caller's buffers are never touched.
"""

from __future__ import annotations

from concurrent import futures
import dataclasses
import functools
import logging
import statistics
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jt_dist import _errors
from jt_dist._core import primitive as _primitive

logger = logging.getLogger("jt_dist")


def single(spec, index: int):
  """``spec`` with only its launch ``index``: what every shard compiles."""
  return dataclasses.replace(spec, launches=(spec.launches[index],))


def _inputs(avals: Sequence[Any], device) -> list[Any]:
  rng = np.random.default_rng(0)
  return [jax.device_put(
      rng.standard_normal(a.shape).astype(np.dtype(a.dtype))
      if jnp.issubdtype(a.dtype, jnp.floating)
      else np.zeros(a.shape, np.dtype(a.dtype)), device) for a in avals]


def _compile(spec, index: int, inputs) -> tuple[Any, Exception | None]:
  """The compiled launch ``index`` alone, warmed up; or None and the error."""
  fn = jax.jit(functools.partial(_primitive.triton_call_p.bind,
                                 spec=single(spec, index)))
  try:
    compiled = fn.lower(*inputs).compile()
    jax.block_until_ready(compiled(*inputs))  # Loads the kernel; warms up.
  except Exception as e:  # pylint: disable=broad-except
    # As Triton's autotuner skips configs that fail to compile or run
    # (e.g. out of shared memory), so does this one, unless none is left.
    logger.warning("jt_dist: autotuning drops config %s of kernel %r: %s",
                   spec.launches[index].config.label, spec.info.name, e)
    return None, e
  return compiled, None


def _measure(spec, avals, device) -> list[float | None]:
  inputs = _inputs(avals, device)
  results = [_compile(spec, i, inputs) for i in range(len(spec.launches))]
  compiled = [c for c, _ in results]
  if all(c is None for c in compiled):
    first = results[0][1]
    raise _errors.AutotuneError(
        f"triton_call: no autotuning config of kernel {spec.info.name!r}"
        f" compiled and ran on {device}{_errors.process_note()}. The first"
        f" config ({spec.launches[0].config.label}) failed with"
        f" {type(first).__name__}: {first}") from first
  # Rounds over all configs, and launches per measurement: the interpreter
  # runs Python per program instance, so the CPU gets fewer.
  rounds, launches = (3, 1) if device.platform == "cpu" else (7, 10)
  samples: list[list[float]] = [[] for _ in compiled]
  for r in range(rounds):
    # Configs take turns, in an order rotated each round, so that a drift
    # in clocks or load favours none of them.
    order = list(range(len(compiled)))
    for i in order[r % len(order):] + order[:r % len(order)]:
      if compiled[i] is None:
        continue
      start = time.perf_counter()
      for _ in range(launches):
        out = compiled[i](*inputs)
      jax.block_until_ready(out)
      samples[i].append((time.perf_counter() - start) / launches)
  return [statistics.median(s) if s else None for s in samples]


def time_configs(spec, avals: Sequence[Any], device) -> list[float | None]:
  """Seconds per launch of each of ``spec``'s configs on ``device``.

  ``avals`` are those of its array operands (shard-local shapes). Each
  time is a median; None where the config failed to compile or run.
  """
  with futures.ThreadPoolExecutor(
      1, thread_name_prefix="jt_dist-autotune") as pool:
    return pool.submit(_measure, spec, avals, device).result()
