"""Timing an autotuned call's configs on one local device, outside any trace.

The choice is made while a call is lowered, possibly inside the user's
``jax.jit`` or ``jax.shard_map``. The configs are timed in a thread of their
own, whose JAX context (traces, meshes) is fresh: each config is lowered
alone as a one-device ``jax.jit`` of the primitive and run on inputs of the
call's shapes. Floating-point inputs are random normals; integer and bool
inputs are zeros, since kernels often use them as indices or offsets.
Zeroed and aliased outputs are prepared by the kernel call itself, exactly as
in the real run; the caller's buffers are never touched.
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


@dataclasses.dataclass(frozen=True)
class Plan:
  """How much to time: rounds over all configs, launches per measurement."""

  rounds: int = 7
  launches: int = 10


GPU_PLAN = Plan()
# The interpreter runs Python per program instance: one launch per round.
CPU_PLAN = Plan(rounds=3, launches=1)


def single(spec, index: int):
  """``spec`` with only its launch ``index``: what every shard compiles."""
  return dataclasses.replace(spec, launches=(spec.launches[index],))


def _inputs(avals: Sequence[Any], device) -> list[Any]:
  rng = np.random.default_rng(0)
  arrays = []
  for aval in avals:
    dtype = np.dtype(aval.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
      host = rng.standard_normal(aval.shape).astype(dtype)
    else:
      host = np.zeros(aval.shape, dtype)
    arrays.append(jax.device_put(host, device))
  return arrays


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


def _compiled_launches(spec, inputs, device) -> list[Any]:
  """Every launch compiled alone; AutotuneError if none compiles and runs."""
  results = [_compile(spec, i, inputs) for i in range(len(spec.launches))]
  if all(compiled is None for compiled, _ in results):
    first = results[0][1]
    raise _errors.AutotuneError(
        f"triton_call: no autotuning config of kernel {spec.info.name!r}"
        f" compiled and ran on {device}{_errors.process_note()}. The first"
        f" config ({spec.launches[0].config.label}) failed with"
        f" {type(first).__name__}: {first}") from first
  return [compiled for compiled, _ in results]


def _measure(spec, avals, device, plan: Plan) -> list[float | None]:
  inputs = _inputs(avals, device)
  compiled = _compiled_launches(spec, inputs, device)
  samples: list[list[float]] = [[] for _ in compiled]
  for r in range(plan.rounds):
    # Configs take turns, in an order rotated each round, so that a drift
    # in clocks or load favours none of them.
    order = list(range(len(compiled)))
    order = order[r % len(order):] + order[:r % len(order)]
    for i in order:
      if compiled[i] is None:
        continue
      start = time.perf_counter()
      for _ in range(plan.launches):
        out = compiled[i](*inputs)
      jax.block_until_ready(out)
      samples[i].append((time.perf_counter() - start) / plan.launches)
  return [statistics.median(s) if s else None for s in samples]


def time_configs(spec, avals: Sequence[Any], device,
                 plan: Plan) -> list[float | None]:
  """Seconds per launch of each of ``spec``'s configs on ``device``.

  ``avals`` are those of its array operands (shard-local shapes). Each
  time is a median; None where the config failed to compile or run.
  """
  with futures.ThreadPoolExecutor(
      1, thread_name_prefix="jt_dist-autotune") as pool:
    return pool.submit(_measure, spec, avals, device, plan).result()
