"""Autotuning choices, in memory and in ``<cache dir>/autotune/``.

A choice is filed under a content key of all it depends on, so a new process
finds it on disk and skips the timing. Files are written atomically; one
that fails a check is deleted and ignored, never used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
from typing import Any

from jt_dist import _settings
from jt_dist._backend import cache as _cache

logger = logging.getLogger("jt_dist")

FORMAT_VERSION = 1
_STRING_FIELDS = ("kernel", "config", "source", "device_kind", "key")
_LISTED = 8  # How many left-alone files forget's warning names.


@dataclasses.dataclass(frozen=True)
class AutotuneChoice:
  """The config every shard of an autotuned kernel call runs.

  Attributes:
    kernel: the kernel's name.
    config: the chosen config's label, e.g. ``"BLOCK: 128, num_warps: 4,
      num_ctas: 1, num_stages: 3"``.
    index: its position among ``candidates``.
    candidates: every candidate config's label, in order.
    source: where the choice came from: ``"timed"`` (measured here),
      ``"disk"`` (an earlier process's), ``"pinned"``, ``"process 0"``
      (received in a multi-process run) or ``"first config"`` (the CPU rule).
    device_kind: the device it was made for, e.g. ``"NVIDIA H200"``.
    key: the content key it is filed under.
    timings_s: seconds per launch by candidate label, where timed.
  """

  kernel: str
  config: str
  index: int
  candidates: tuple[str, ...]
  source: str
  device_kind: str
  key: str
  timings_s: dict[str, float | None] | None = None

  def to_json(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "candidates": list(self.candidates)}


_memory: dict[str, AutotuneChoice] = {}
_lock = threading.Lock()


def remember(choice: AutotuneChoice) -> None:
  with _lock:
    _memory[choice.key] = choice


def recalled(key: str) -> AutotuneChoice | None:
  with _lock:
    return _memory.get(key)


def choices() -> list[AutotuneChoice]:
  """The choices this process made or loaded, oldest first."""
  with _lock:
    return list(_memory.values())


def _folder() -> str:
  return os.path.join(_settings.cache_dir(), "autotune")


def save(choice: AutotuneChoice) -> None:
  """Writes ``choice`` to disk; failures are logged, never raised."""
  if not _settings.disk_cache():
    return
  document = {"format": FORMAT_VERSION, **choice.to_json()}
  folder = _folder()
  try:
    os.makedirs(folder, exist_ok=True)
    _cache._atomic_write(  # pylint: disable=protected-access
        folder, os.path.join(folder, choice.key + ".json"),
        json.dumps(document).encode("utf-8"))
  except OSError as e:
    logger.warning("jt_dist: cannot save the autotuning choice in %s (%s);"
                   " a new process will time the configs again.", folder, e)


def load(key: str, candidates: tuple[str, ...]) -> AutotuneChoice | None:
  """The choice saved under ``key`` for these candidates, or None."""
  if not _settings.disk_cache():
    return None
  path = os.path.join(_folder(), key + ".json")
  try:
    with open(path, "rb") as f:
      document = json.loads(f.read().decode("utf-8"))
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError.
    _discard(path, f"unreadable: {e}")
    return None
  problem = _problem(document, key)
  if not problem and (
      tuple(document["candidates"]) != candidates
      or not 0 <= document["index"] < len(candidates)
      or candidates[document["index"]] != document["config"]):
    problem = "its config is not one of this call's candidates"
  if problem:
    _discard(path, problem)
    return None
  del document["format"]
  return AutotuneChoice(**{**document, "candidates": candidates,
                           "source": "disk"})


def _problem(document: Any, key: str) -> str:
  """Why ``document`` is not a choice jt_dist filed under ``key``, or ""."""
  if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
    return f"not a jt_dist autotuning choice of format {FORMAT_VERSION}"
  fields = {f.name for f in dataclasses.fields(AutotuneChoice)} | {"format"}
  if (set(document) != fields or document["key"] != key
      or not _cache.is_content_key(key)
      or not all(isinstance(document[f], str) for f in _STRING_FIELDS)
      or not isinstance(document["candidates"], list)
      or not isinstance(document["index"], int)
      or isinstance(document["index"], bool)):
    return "not the fields of a jt_dist autotuning choice, or misnamed"
  return ""


def _discard(path: str, reason: str) -> None:
  logger.warning("jt_dist: ignoring the autotuning choice %s (%s).", path,
                 reason)
  with contextlib.suppress(OSError):
    os.remove(path)


def forget_in_memory(name: str | None) -> int:
  """Forgets this process's choices of kernel ``name`` (all when None)."""
  with _lock:
    keys = [k for k, c in _memory.items() if name in (None, c.kernel)]
    for key in keys:
      del _memory[key]
  return len(keys)


def forget(name: str | None) -> int:
  """``forget_autotune_choices`` of kernel ``name`` (all when None)."""
  count = forget_in_memory(name)
  folder = _folder()
  try:
    files = sorted(f for f in os.listdir(folder) if f.endswith(".json"))
  except OSError:
    return count
  left_alone = []
  for file in files:
    path = os.path.join(folder, file)
    try:
      with open(path, "rb") as f:
        document = json.loads(f.read().decode("utf-8"))
      problem = _problem(document, file[:-len(".json")])
    except ValueError:  # UnicodeDecodeError is one too.
      problem = "not valid JSON"
    except OSError as e:
      problem = f"unreadable: {e.strerror}"
    if problem:
      left_alone.append(f"{file} ({problem})")
    elif name in (None, document["kernel"]):
      try:
        os.remove(path)
        count += 1
      except OSError as e:
        left_alone.append(f"{file} (cannot remove it: {e.strerror})")
  if left_alone:
    more = len(left_alone) - _LISTED
    logger.warning(
        "jt_dist: forget_autotune_choices left %d file%s in %s alone: %s%s."
        " It removes only the autotuning choices jt_dist wrote; delete the"
        " others by hand if they are not needed.", len(left_alone),
        "" if len(left_alone) == 1 else "s", folder,
        ", ".join(left_alone[:_LISTED]), f" and {more} more" * (more > 0))
  return count
