"""Choosing the one config every shard of an autotuned call runs.

The choice is made as the call is lowered (its device is then known), and
the call is lowered with that config alone. Precedence: process 0's choice
(sent through jax.distributed's key-value store), a pin, a choice made
earlier (memory, then disk), timing on one local device (on the CPU, the
first config unless timing is asked for). With ``JT_DIST_AUTOTUNE=jaxlib``,
or no local device (cross-lowering), jaxlib times the configs per process.

Timing may happen inside the user's ``jax.jit`` or ``jax.shard_map``, so it
runs in a thread of its own, whose JAX context is fresh: each config as a
one-device ``jax.jit`` on inputs of its own (zero integers: kernels often
use them as indices), never on the caller's buffers.
"""

from __future__ import annotations

import collections
from concurrent import futures
import dataclasses
import functools
import json
import logging
import statistics
import threading
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist import _progress
from jt_dist import _settings
from jt_dist._autotune import store as _store
from jt_dist._backend import cache as _cache
from jt_dist._backend import target as _target
from jt_dist._core import kernel as _kernel
from jt_dist._core import primitive as _primitive

logger = logging.getLogger("jt_dist")

_warned_jaxlib_mode = False
_OPTION_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# Round n holds process 0's n-th choice for a call: a new choice (after a
# pin or forget) never meets a stale one.
_kv_rounds: collections.Counter = collections.Counter()
_pins: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()  # For both.


def kernel_name(kernel: Any) -> str:
  """The name pins and choices are filed under: the Python function's."""
  return kernel if isinstance(kernel, str) else _kernel.kernel_info(kernel).name


def pin(kernel: Any, fields: dict[str, Any] | None) -> None:
  """Pins (or, with None, unpins) the config of ``kernel`` by its fields."""
  name = kernel_name(kernel)
  with _lock:
    if fields is None:
      _pins.pop(name, None)
    else:
      _pins[name] = dict(fields)


def config_fields(config) -> dict[str, Any]:
  """A launch config's constexprs and launch options, by name."""
  return dict(config.kwargs, **{o: getattr(config, o) for o in _OPTION_FIELDS})


def _kv_key(share_key: str) -> str:
  with _lock:
    _kv_rounds[share_key] += 1
    return f"jt_dist/autotune/{share_key}/{_kv_rounds[share_key]}"


def _local_device(ctx, platform: str):
  """One device of ``platform`` this process addresses, or None."""
  me = jax.process_index()
  if platform == "cpu":
    return next((d for d in _compat.lowering_axis_facts(ctx).devices
                 if d.platform == "cpu" and d.process_index == me),
                jax.local_devices(backend="cpu")[0])
  return next((d for d in _target.candidate_devices(ctx, platform)
               if d.process_index == me), None)


def _key_parts(spec, avals, platform: str) -> dict[str, Any]:
  """What a choice depends on, but the device kind."""
  scalars = {op.name: op.value for op in spec.operands if op.kind == "scalar"}
  common = dict(spec.launches[0].config.kwargs)
  # Triton's autotuner re-tunes when its `key` arguments' values change.
  keyed = {name: repr(scalars.get(name, common.get(name)))
           for layer in spec.info.layers
           if isinstance(layer, _compat.Autotuner) for name in layer.keys or ()}
  return {
      "kernel": _compat.jit_function_of(spec.info.fn).cache_key,
      "name": spec.info.name,
      "arrays": [[list(a.shape), str(a.dtype)] for a in avals],
      "outputs": [[list(s), str(d)] for s, d in spec.out_shapes],
      "aliases": [list(a) for a in spec.input_output_aliases],
      "keyed": sorted(keyed.items()),
      "candidates": [[l.config.label, list(l.grid), list(l.zeroed_outputs)]
                     for l in spec.launches],
      "platform": platform,
      "triton": _compat.triton.__version__,
      "jaxlib": _compat.jaxlib_version(),
      "format": _store.FORMAT_VERSION,
  }


def _labels(spec) -> tuple[str, ...]:
  return tuple(l.config.label for l in spec.launches)


def _made(spec, index, source, device_kind, key, timings=None):
  return _store.AutotuneChoice(
      kernel=spec.info.name, config=spec.launches[index].config.label,
      index=index, candidates=_labels(spec), source=source,
      device_kind=device_kind, key=key, timings_s=timings)


def single(spec, index: int):
  """``spec`` with only its launch ``index``: what every shard compiles,
  with the operands as that config's pre_hook left them."""
  launch = spec.launches[index]
  if launch.operands is None:
    return dataclasses.replace(spec, launches=(launch,))
  return dataclasses.replace(
      spec, operands=launch.operands,
      launches=(dataclasses.replace(launch, operands=None),))


def triton_config(launch):
  """The launch's config as Triton prints it (``str(triton.Config)``)."""
  config = launch.config
  if config.tuned is not None:
    return config.tuned
  return _compat.Config(dict(config.kwargs), num_warps=config.num_warps,
                        num_stages=config.num_stages,
                        num_ctas=config.num_ctas, maxnreg=config.maxnreg)


def _triton_key(spec, avals) -> tuple:
  """The key Triton's autotuner files a choice under: the ``key``
  arguments' values, then every array argument's dtype."""
  values = {op.name: op.value for op in spec.operands if op.kind == "scalar"}
  values.update(spec.launches[0].config.kwargs)
  key = [values[name] for layer in spec.info.layers
         if isinstance(layer, _compat.Autotuner)
         for name in layer.keys or () if name in values]
  for op in spec.operands:
    if op.kind == "array" and not op.path:
      key.append(str(avals[op.index].dtype))
    elif op.kind == "output" and not op.path:
      key.append(str(np.dtype(spec.out_shapes[op.index][1])))
  return tuple(key)


def _compile(spec, index: int, inputs) -> tuple[Any, Exception | None]:
  """The compiled launch ``index`` alone, warmed up; or None and the error."""
  verbose = _compat.print_autotuning()
  if verbose:  # As Triton's autotuner prints each config it benchmarks.
    print(f"Autotuning kernel {spec.info.name} with config"
          f" {triton_config(spec.launches[index])}", flush=True)
  fn = jax.jit(functools.partial(_primitive.triton_call_p.bind,
                                 spec=single(spec, index)))
  try:
    compiled = fn.lower(*inputs).compile()
    jax.block_until_ready(compiled(*inputs))  # Loads the kernel; warms up.
  except Exception as e:  # pylint: disable=broad-except
    # Skipped, as Triton's autotuner does (e.g. out of shared memory).
    logger.warning("jt_dist: autotuning drops config %s of kernel %r: %s",
                   spec.launches[index].config.label, spec.info.name, e)
    if verbose:
      print(f"Autotuning failed with {e}", flush=True)
    return None, e
  return compiled, None


def _measure(spec, avals, device) -> list[float | None]:
  rng = np.random.default_rng(0)
  inputs = [jax.device_put(
      rng.standard_normal(a.shape).astype(np.dtype(a.dtype))
      if jnp.issubdtype(a.dtype, jnp.floating)
      else np.zeros(a.shape, np.dtype(a.dtype)), device) for a in avals]
  # Fewer on the CPU, whose interpreter runs Python per program instance.
  rounds, launches = (3, 1) if device.platform == "cpu" else (7, 10)
  n = len(spec.launches)
  steps = [0]  # A config's compiling, and each of its rounds, is a step.

  with _progress.Progress(f"autotuning {spec.info.name}", n,
                          unit="configs") as progress:
    def step():
      steps[0] += 1
      progress.update(steps[0] // (rounds + 1))

    results = []
    for i in range(n):
      results.append(_compile(spec, i, inputs))
      step()
    samples = _rounds(spec, results, device, inputs, rounds, launches, step)
  return [statistics.median(s) if s else None for s in samples]


def _rounds(spec, results, device, inputs, rounds, launches, step):
  """Each config's seconds per launch in each round."""
  compiled = [c for c, _ in results]
  if not (ran := [i for i, c in enumerate(compiled) if c is not None]):
    first = results[0][1]
    raise _errors.AutotuneError(
        f"triton_call: no autotuning config of kernel {spec.info.name!r}"
        f" compiled and ran on {device}{_errors.process_note()}. The first"
        f" config ({spec.launches[0].config.label}) failed with"
        f" {type(first).__name__}: {first}") from first
  samples: list[list[float]] = [[] for _ in compiled]
  for r in range(rounds):
    # An order rotated each round: drifts in clocks or load favour none.
    for i in ran[r % len(ran):] + ran[:r % len(ran)]:
      start = time.perf_counter()
      for _ in range(launches):
        out = compiled[i](*inputs)
      jax.block_until_ready(out)
      samples[i].append((time.perf_counter() - start) / launches)
      step()
  return samples


def time_configs(spec, avals: Sequence[Any], device) -> list[float | None]:
  """Median seconds per launch of each config; None where one failed."""
  with futures.ThreadPoolExecutor(
      1, thread_name_prefix="jt_dist-autotune") as pool:
    return pool.submit(_measure, spec, avals, device).result()


def _decide(spec, avals, device, platform, key) -> _store.AutotuneChoice:
  """Times the configs (or applies the CPU rule) on ``device``."""
  kind = device.device_kind
  start = time.perf_counter()
  if platform == "cpu" and _settings.autotune_cpu_rule() == "first":
    choice = _made(spec, 0, "first config", kind, key)
  else:
    times = time_configs(spec, avals, device)
    ran = [(t, i) for i, t in enumerate(times) if t is not None]
    logger.info("jt_dist: timed %d configs of kernel %r on %s in %.2f s.",
                len(ran), spec.info.name, device, time.perf_counter() - start)
    timings = dict(zip(_labels(spec), times))
    choice = _made(spec, min(ran)[1], "timed", kind, key, timings)
  if _compat.print_autotuning():  # Triton's words, once per tuning.
    print(f"Triton autotuning for function {spec.info.name},\nwith key as"
          f" {_triton_key(spec, avals)},\nfinished after"
          f" {time.perf_counter() - start:.2f}s,\nbest config selected:"
          f" {triton_config(spec.launches[choice.index])};", flush=True)
  return choice


def _client(spec):
  if (client := _compat.distributed_client()) is None:
    raise _errors.AutotuneError(
        f"triton_call: kernel {spec.info.name!r}{_errors.process_note()} is"
        " autotuned in a multi-process run without jax.distributed's"
        " coordination service, through which process 0 sends its choice."
        " Start the processes with jax.distributed.initialize(...), or set"
        " JT_DIST_AUTOTUNE=jaxlib (each process then tunes on its own), or"
        " pin a config with JT_DIST_AUTOTUNE_PIN.")
  return client


def _receive(spec, share_key: str, kind: str, key: str):
  """Process 0's choice for this call, from jax.distributed's store."""
  client = _client(spec)
  timeout = _settings.autotune_timeout_s()
  try:
    text = client.blocking_key_value_get(_kv_key(share_key),
                                         int(timeout * 1000))
  except Exception as e:  # pylint: disable=broad-except
    raise _errors.AutotuneError(
        f"triton_call: kernel {spec.info.name!r}{_errors.process_note()}"
        f" waited {timeout:g} s for process 0's autotuning choice and"
        f" got none ({type(e).__name__}: {e}). Every process must lower the"
        " same autotuned call, with the same shapes, configs and"
        " JT_DIST_AUTOTUNE mode; raise JT_DIST_AUTOTUNE_TIMEOUT_S if"
        " process 0 needs longer to time the configs.") from None
  sent = json.loads(text)
  # The key covers the candidates, so process 0's config is one of ours.
  index = _labels(spec).index(sent["config"])
  return _made(spec, index, "process 0", kind, key, sent.get("timings_s"))


def _pinned(spec, kind, key):
  """The first candidate whose fields include the pinned ones, or None."""
  name = spec.info.name
  with _lock:
    fields = _pins.get(name)
  if fields is None:
    fields = _settings.autotune_pins().get(name)
  if fields is None:
    return None
  configs = [l.config for l in spec.launches]
  for i, config in enumerate(configs):
    have = config_fields(config)
    if all(k in have and have[k] == v for k, v in fields.items()):
      return _made(spec, i, "pinned", kind, key)
  labels = "; ".join(f"[{i}] {c.label}" for i, c in enumerate(configs))
  raise ValueError(
      f"jt_dist autotuning: the config pinned for kernel {name!r},"
      f" {dict(fields)!r}, matches none of its {len(configs)} candidates for"
      f" this call: {labels}. Pin fields that one candidate has (with"
      " jt_dist.pin_autotune_config or JT_DIST_AUTOTUNE_PIN), or unpin it.")


def _choose(spec, avals, device, platform) -> _store.AutotuneChoice:
  parts = _key_parts(spec, avals, platform)
  share_key = _cache.content_key(parts)
  kind = device.device_kind
  key = _cache.content_key({**parts, "device_kind": kind})
  multi = jax.process_count() > 1
  if multi and jax.process_index() != 0:
    if (choice := _store.recalled(key)) is None:
      choice = _receive(spec, share_key, kind, key)
      _store.save(choice)
    return choice
  choice = (_pinned(spec, kind, key) or _store.recalled(key)
            or _store.load(key, _labels(spec)))
  if choice is None:
    choice = _decide(spec, avals, device, platform, key)
    if choice.source == "timed":
      _store.save(choice)
  if multi and _store.recalled(key) != choice:
    _client(spec).key_value_set(_kv_key(share_key), json.dumps(
        {"config": choice.config, "timings_s": choice.timings_s}),
                                allow_overwrite=True)
  return choice


def _leave_to_jaxlib(spec, platform: str, asked: bool) -> None:
  global _warned_jaxlib_mode
  if any(l.operands is not None for l in spec.launches):
    raise NotImplementedError(
        f"triton_call: the autotuning configs of kernel {spec.info.name!r}"
        " have pre_hooks that give its TensorDescriptors a block_shape per"
        " config, and jaxlib's own tuning"
        + (" (JT_DIST_AUTOTUNE=jaxlib)" if asked else
           f" (no local {platform} device to time them on)")
        + " compiles every config with the call's one set of descriptors."
        " Pin a config (jt_dist.pin_autotune_config or JT_DIST_AUTOTUNE_PIN)"
        + (", or leave JT_DIST_AUTOTUNE unset." if asked else "."))
  if not asked:
    logger.info(
        "jt_dist: no local %s device to time kernel %r on (cross-lowering);"
        " jaxlib will time its %d configs on the first run.", platform,
        spec.info.name, len(spec.launches))
  elif jax.process_count() > 1 and not _warned_jaxlib_mode:
    _warned_jaxlib_mode = True
    logger.warning(
        "jt_dist: JT_DIST_AUTOTUNE=jaxlib in a run of %d processes: each"
        " process times autotuned kernels on its own and may choose a"
        " different config, so shards can run different code. Leave"
        " JT_DIST_AUTOTUNE unset for one choice shared by every shard.",
        jax.process_count())


def for_lowering(ctx, spec, platform: str):
  """The chosen launch alone, or ``spec`` where jaxlib times the configs."""
  if len(spec.launches) == 1:
    return single(spec, 0)
  jaxlib = _settings.autotune_mode() == "jaxlib" and platform != "cpu"
  device = None if jaxlib else _local_device(ctx, platform)
  if device is None:
    # A pin needs no device: jaxlib's mode and cross-lowering run it too.
    if (pinned := _pinned(spec, "unknown", "")) is not None:
      return single(spec, pinned.index)
    _leave_to_jaxlib(spec, platform, jaxlib)
    return spec
  choice = _choose(spec, list(ctx.avals_in), device, platform)
  if _store.recalled(choice.key) != choice:
    _store.remember(choice)
    timings = ""
    if choice.timings_s:
      timings = "; ms per launch: " + ", ".join(
          f"[{i}] {'failed' if t is None else f'{t * 1e3:.4g}'}"
          for i, t in enumerate(choice.timings_s.values()))
    logger.info(
        "jt_dist: autotuning choice for kernel %r on %s%s: [%d] %s (%s, of"
        " %d configs%s).", choice.kernel, device, _errors.process_note(),
        choice.index, choice.config, choice.source, len(choice.candidates),
        timings)
  return single(spec, choice.index)
