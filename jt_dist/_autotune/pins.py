"""Pinned autotuning configs: by ``pin_autotune_config``, or the environment.

A pin set from Python wins over ``JT_DIST_AUTOTUNE_PIN``
(``jt_dist._settings``), which is read at each lookup.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from jt_dist import _settings

_OPTION_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
_pins: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()


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
  return _settings.autotune_pins().get(name)


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
