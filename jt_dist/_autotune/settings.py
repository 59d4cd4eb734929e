"""How autotuned kernels are tuned: the mode, the CPU rule and pinned configs.

Environment:
  ``JT_DIST_AUTOTUNE``: ``choose`` (the default: jt_dist times the configs
  once, outside any trace, and lowers every shard with the winner) or
  ``jaxlib`` (jaxlib's Triton call times them on its first run, in each
  process separately).
  ``JT_DIST_AUTOTUNE_CPU``: ``first`` (the default: on the CPU, where the
  interpreter's timings say nothing about a GPU, the first config left after
  pruning is chosen) or ``time`` (time the interpreter anyway).
  ``JT_DIST_AUTOTUNE_PIN``: a JSON object mapping kernel names to the config
  fields to pin, e.g. ``{"matmul_kernel": {"BLOCK_M": 128, "num_warps": 8}}``.
  ``JT_DIST_AUTOTUNE_TIMEOUT_S``: how long a process waits for process 0's
  choice in a multi-process run (default 600).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any, Mapping

MODES = ("choose", "jaxlib")
CPU_RULES = ("first", "time")
_OPTION_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclasses.dataclass
class _Settings:
  """Overrides set by ``configure``; None defers to the environment."""

  mode: str | None = None
  cpu_rule: str | None = None
  timeout_s: float | None = None


_settings = _Settings()
_pins: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


def _checked(name: str, value: str, allowed) -> str:
  if value not in allowed:
    raise ValueError(
        f"jt_dist autotuning: {name}={value!r} is not one of {list(allowed)}.")
  return value


def configure(*, mode: str | None = None, cpu_rule: str | None = None,
              timeout_s: float | None = None) -> None:
  """Sets how autotuned kernels are tuned; arguments left None are unchanged.

  Args:
    mode: ``"choose"`` (jt_dist times the configs once and every shard runs
      the winner) or ``"jaxlib"`` (jaxlib times them on the first run, per
      process); overrides ``JT_DIST_AUTOTUNE``.
    cpu_rule: on the CPU, ``"first"`` (the first config left after pruning)
      or ``"time"`` (time Triton's interpreter); overrides
      ``JT_DIST_AUTOTUNE_CPU``.
    timeout_s: how long a process waits for process 0's choice; overrides
      ``JT_DIST_AUTOTUNE_TIMEOUT_S``.

  Raises:
    ValueError: an unknown mode or rule, or a timeout that is not positive.
  """
  if mode is not None:
    _settings.mode = _checked("mode", mode, MODES)
  if cpu_rule is not None:
    _settings.cpu_rule = _checked("cpu_rule", cpu_rule, CPU_RULES)
  if timeout_s is not None:
    if not float(timeout_s) > 0:
      raise ValueError(
          f"jt_dist autotuning: timeout_s={timeout_s!r} must be positive.")
    _settings.timeout_s = float(timeout_s)


def _choice(name: str, env_var: str, default: str, choices) -> str:
  # What ``configure`` set wins over the environment, read at every call.
  configured = getattr(_settings, name)
  if configured is not None:
    return configured
  value = os.environ.get(env_var, default).strip().lower()
  return _checked(env_var, value, choices)


def mode() -> str:
  return _choice("mode", "JT_DIST_AUTOTUNE", "choose", MODES)


def cpu_rule() -> str:
  return _choice("cpu_rule", "JT_DIST_AUTOTUNE_CPU", "first", CPU_RULES)


def timeout_s() -> float:
  if _settings.timeout_s is not None:
    return _settings.timeout_s
  return float(os.environ.get("JT_DIST_AUTOTUNE_TIMEOUT_S", 600))


def kernel_name(kernel: Any) -> str:
  """The name pins and choices are filed under: the Python function's."""
  if isinstance(kernel, str):
    return kernel
  from jt_dist._core import kernel as _kernel  # pylint: disable=g-import-not-at-top
  return _kernel.kernel_info(kernel).name


def pin(kernel: Any, fields: Mapping[str, Any] | None) -> None:
  """Pins (or, with None, unpins) the config of ``kernel`` by its fields."""
  name = kernel_name(kernel)
  with _lock:
    if fields is None:
      _pins.pop(name, None)
    else:
      _pins[name] = dict(fields)


def pinned_fields(name: str) -> dict[str, Any] | None:
  """The pinned fields of kernel ``name``: by ``pin``, else the environment."""
  with _lock:
    if name in _pins:
      return dict(_pins[name])
  text = os.environ.get("JT_DIST_AUTOTUNE_PIN", "").strip()
  if not text:
    return None
  try:
    pins = json.loads(text)
  except ValueError as e:
    raise ValueError(
        f"JT_DIST_AUTOTUNE_PIN={text!r} is not JSON ({e}). Write an object"
        ' mapping kernel names to config fields, e.g. {"matmul_kernel":'
        ' {"BLOCK_M": 128, "num_warps": 8}}.') from None
  if not isinstance(pins, dict) or not all(
      isinstance(v, dict) for v in pins.values()):
    raise ValueError(
        f"JT_DIST_AUTOTUNE_PIN={text!r} must map kernel names to objects of"
        ' config fields, e.g. {"matmul_kernel": {"BLOCK_M": 128}}.')
  return pins.get(name)


def config_fields(config) -> dict[str, Any]:
  """A launch config's constexprs and launch options, by name."""
  fields = dict(config.kwargs)
  for option in _OPTION_FIELDS:
    fields[option] = getattr(config, option)
  return fields


def matching_index(name: str, fields: Mapping[str, Any], configs) -> int:
  """The first config whose fields include ``fields``.

  Raises:
    ValueError: no config matches; the message lists every candidate.
  """
  for i, config in enumerate(configs):
    have = config_fields(config)
    if all(k in have and have[k] == v for k, v in fields.items()):
      return i
  labels = "; ".join(f"[{i}] {c.label}" for i, c in enumerate(configs))
  raise ValueError(
      f"jt_dist autotuning: the config pinned for kernel {name!r},"
      f" {dict(fields)!r}, matches none of its {len(configs)} candidates for"
      f" this call: {labels}. Pin fields that one candidate has (with"
      " jt_dist.pin_autotune_config or JT_DIST_AUTOTUNE_PIN), or unpin it.")
