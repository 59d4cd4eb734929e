"""Every ``JT_DIST_*`` environment variable, and the ``configure_*`` functions.

jt_dist reads its settings here and nowhere else, and this module imports
nothing from jt_dist, so every layer may import it. What a ``configure_*``
function set wins; otherwise each variable is read at each use, so a change
to ``os.environ`` counts from the next read on. docs/api/caches.md describes
``JT_DIST_CACHE_DIR``, ``JT_DIST_DISK_CACHE``, ``JT_DIST_DUMP_DIR``,
``JT_DIST_SYNC_LAUNCHES``, ``JT_DIST_BOUNDS_CHECK``, ``JT_DIST_VECTORIZE``,
``JT_DIST_AUTOTUNE``, ``JT_DIST_AUTOTUNE_CPU``, ``JT_DIST_AUTOTUNE_PIN``,
``JT_DIST_AUTOTUNE_TIMEOUT_S``, ``JT_DIST_CPU_DEVICES`` and
``JT_DIST_PROGRESS``.

Not here: ``JT_DIST_COORDINATOR``, ``JT_DIST_NUM_PROCESSES``,
``JT_DIST_PROCESS_ID`` and ``JT_DIST_FAILURE_FILE``, the protocol of
``run_processes`` with the processes it starts, which no user sets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
from typing import Any, Callable, Iterator

CACHE_DIR = "JT_DIST_CACHE_DIR"
DISK_CACHE = "JT_DIST_DISK_CACHE"
DUMP_DIR = "JT_DIST_DUMP_DIR"
SYNC_LAUNCHES = "JT_DIST_SYNC_LAUNCHES"
BOUNDS_CHECK = "JT_DIST_BOUNDS_CHECK"
VECTORIZE = "JT_DIST_VECTORIZE"
AUTOTUNE = "JT_DIST_AUTOTUNE"
AUTOTUNE_CPU = "JT_DIST_AUTOTUNE_CPU"
AUTOTUNE_PIN = "JT_DIST_AUTOTUNE_PIN"
AUTOTUNE_TIMEOUT_S = "JT_DIST_AUTOTUNE_TIMEOUT_S"
CPU_DEVICES = "JT_DIST_CPU_DEVICES"
PROGRESS = "JT_DIST_PROGRESS"

DEFAULT_ENTRIES = 256
DEFAULT_TIMEOUT_S = 600.0
AUTOTUNE_MODES = ("choose", "jaxlib")
AUTOTUNE_CPU_RULES = ("first", "time")
_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


@dataclasses.dataclass(frozen=True)
class Configured:
  """What the ``configure_*`` functions set; None defers to the environment."""

  disk_cache: bool | None = None
  cache_dir: str | None = None
  memory_entries: int = DEFAULT_ENTRIES
  dispatch_entries: int = DEFAULT_ENTRIES
  autotune_mode: str | None = None
  autotune_cpu_rule: str | None = None
  autotune_timeout_s: float | None = None


# Replaced whole, never changed in place: a reader sees one consistent value
# without a lock, and a test restores it with mock.patch.object.
_configured = Configured()
_lock = threading.Lock()
_trims: list[Callable[[], None]] = []  # See trim_on_configure.


def _flag(name: str, default: bool, *, strict: bool) -> bool:
  """An on/off variable; unset, empty or (unless ``strict``) other: default."""
  raw = os.environ.get(name, "")
  value = raw.strip().lower()
  if value in _ON:
    return True
  if value in _OFF:
    return False
  if not value or not strict:
    return default
  raise ValueError(
      f"{name}={raw!r} is neither on ({', '.join(_ON)}) nor off"
      f" ({', '.join(_OFF)}). Set it to 1 or 0, or unset it (it is"
      f" {'on' if default else 'off'} by default).")


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
  """A variable taking one of ``choices``; unset or empty is ``default``."""
  raw = os.environ.get(name, "")
  value = raw.strip().lower() or default
  if value not in choices:
    raise ValueError(
        f"{name}={raw!r} is not one of {list(choices)}. Set one of them, or"
        f" unset it (the default is {default!r}).")
  return value


def _number(name: str, default, convert: Callable[[str], Any]):
  """A positive number (``convert``: ``int`` or ``float``); unset is default."""
  raw = os.environ.get(name, "")
  if not raw.strip():
    return default
  with contextlib.suppress(ValueError):
    if (value := convert(raw)) > 0:
      return value
  kind = "whole number" if convert is int else "number"
  raise ValueError(
      f"{name}={raw!r} is not a positive {kind}. Set it to one, e.g."
      f" {default}, or unset it (the default is {default}).")


def disk_cache() -> bool:
  """Whether compiled kernels and choices are read from and written to disk."""
  if _configured.disk_cache is not None:
    return _configured.disk_cache
  return _flag(DISK_CACHE, True, strict=True)


def cache_dir() -> str:
  """The disk cache's directory."""
  return _configured.cache_dir or os.environ.get(CACHE_DIR) or os.path.join(
      os.path.expanduser("~"), ".cache", "jt_dist")


def memory_entries() -> int:
  """How many compiled kernels the in-process cache keeps."""
  return _configured.memory_entries


def dispatch_entries() -> int:
  """How many call signatures each front door's memo keeps."""
  return _configured.dispatch_entries


def dump_dir() -> str | None:
  """Where compiled kernels' IRs are written, or None."""
  return os.environ.get(DUMP_DIR) or None  # Empty is unset.


def sync_launches() -> bool:
  """Whether eager GPU calls wait for their kernel."""
  return _flag(SYNC_LAUNCHES, False, strict=False)


def bounds_check() -> bool:
  """Whether CPU launches check their memory accesses."""
  return _flag(BOUNDS_CHECK, True, strict=False)


def vectorize() -> str:
  """How CPU launches run: ``"on"``, ``"off"`` or ``"check"``."""
  if os.environ.get(VECTORIZE, "").strip().lower() == "check":
    return "check"
  return "on" if _flag(VECTORIZE, True, strict=False) else "off"


def autotune_mode() -> str:
  """Who picks an autotuned kernel's config: ``"choose"`` or ``"jaxlib"``."""
  return _configured.autotune_mode or _choice(AUTOTUNE, "choose",
                                              AUTOTUNE_MODES)


def autotune_cpu_rule() -> str:
  """How a config is picked on the CPU: ``"first"`` or ``"time"``."""
  return _configured.autotune_cpu_rule or _choice(AUTOTUNE_CPU, "first",
                                                  AUTOTUNE_CPU_RULES)


def autotune_timeout_s() -> float:
  """How long a process waits for process 0's autotuning choice."""
  return _configured.autotune_timeout_s or _number(
      AUTOTUNE_TIMEOUT_S, DEFAULT_TIMEOUT_S, float)


def autotune_pins() -> dict[str, dict[str, Any]]:
  """The configs pinned from the environment: kernel name -> fields."""
  if not (text := os.environ.get(AUTOTUNE_PIN, "").strip()):
    return {}
  try:
    pins = json.loads(text)
  except ValueError as e:
    raise ValueError(
        f"{AUTOTUNE_PIN}={text!r} is not JSON ({e}). Write an object"
        ' mapping kernel names to config fields, e.g. {"matmul_kernel":'
        ' {"BLOCK_M": 128, "num_warps": 8}}.') from None
  if not isinstance(pins, dict) or not all(
      isinstance(v, dict) for v in pins.values()):
    raise ValueError(
        f"{AUTOTUNE_PIN}={text!r} must map kernel names to objects of config"
        ' fields, e.g. {"matmul_kernel": {"BLOCK_M": 128}}.')
  return pins


def cpu_devices(default: int) -> int:
  """How many virtual CPU devices to ask for, ``default`` unless set."""
  return _number(CPU_DEVICES, default, int)


def progress() -> bool:
  """Whether long autotuning and CPU launches report their progress."""
  return _flag(PROGRESS, True, strict=False)


def _checked_dir(value: Any, where: str) -> str:
  if not isinstance(value, (str, os.PathLike)):
    raise TypeError(
        f"{where}={value!r} of type {type(value).__name__} must be a str or"
        " os.PathLike naming a directory.")
  path = os.fspath(value)
  if not isinstance(path, str) or not path or "\0" in path:
    raise ValueError(
        f"{where}={value!r} is not a usable directory name (empty, bytes, or"
        " holding a NUL character). Pass a path such as"
        " '~/.cache/jt_dist'.")
  return path


def _check_count(name: str, value: Any, fix: str) -> None:
  if not isinstance(value, int) or isinstance(value, bool):
    raise TypeError(
        f"configure_cache: {name}={value!r} of type {type(value).__name__}"
        f" must be an int, e.g. {DEFAULT_ENTRIES}.")
  if value < 1:
    raise ValueError(
        f"configure_cache: {name}={value!r} must be at least 1{fix}")


def _update(trim: bool, /, **changes: Any) -> Configured:
  """Applies ``changes`` (then the ``_trims``, if ``trim``); returns the old."""
  global _configured
  with _lock:
    before = _configured
    _configured = dataclasses.replace(before, **changes)
  if trim:
    for trim_cache in _trims:
      trim_cache()
  return before


@contextlib.contextmanager
def restored(*, from_environment: bool = False) -> Iterator[None]:
  """Undoes ``configure_*`` on exit (and, ``from_environment``, on entry)."""
  saved = _update(True, **(dataclasses.asdict(Configured())
                           if from_environment else {}))
  try:
    yield
  finally:
    _update(True, **dataclasses.asdict(saved))


def trim_on_configure(trim: Callable[[], None]) -> None:
  """Calls ``trim`` on a limit's change: caches only check it as they grow."""
  _trims.append(trim)


# Each parameter shares its name with the reader of what it sets.
def configure_cache(*, disk_cache: bool | None = None,
                    cache_dir: str | None = None,
                    memory_entries: int | None = None,
                    dispatch_entries: int | None = None) -> None:
  """Sets how kernels and calls are cached; arguments left None are unchanged.

  Args:
    disk_cache: whether to use the on-disk cache of compiled kernels
      (overrides ``JT_DIST_DISK_CACHE``).
    cache_dir: the on-disk cache's directory (overrides
      ``JT_DIST_CACHE_DIR``).
    memory_entries: how many compiled kernels the in-process cache keeps.
    dispatch_entries: how many eager call signatures ``triton_call`` and
      ``sharded_triton_call`` each keep (256 by default). Each holds a
      jitted function and its compiled executables until it is evicted.

  Raises:
    TypeError: an argument has the wrong type.
    ValueError: ``memory_entries`` or ``dispatch_entries`` is below 1, or
      ``cache_dir`` is empty or holds a NUL character.
  """
  if dispatch_entries is not None:
    _check_count("dispatch_entries", dispatch_entries,
                 " (the number of eager call signatures kept in memory).")
  if memory_entries is not None:
    _check_count("memory_entries", memory_entries, "; to stop reusing kernels"
                 " across processes, pass disk_cache=False.")
  if disk_cache is not None and not isinstance(disk_cache, bool):
    raise TypeError(
        f"configure_cache: disk_cache={disk_cache!r} of type"
        f" {type(disk_cache).__name__} must be True or False (a string"
        " such as 'no' would count as True).")
  if cache_dir is not None:
    cache_dir = _checked_dir(cache_dir, "configure_cache: cache_dir")
  changes = {"disk_cache": disk_cache, "cache_dir": cache_dir,
             "memory_entries": memory_entries,
             "dispatch_entries": dispatch_entries}
  _update(memory_entries is not None or dispatch_entries is not None,
          **{k: v for k, v in changes.items() if v is not None})


def configure_autotune(*, mode: str | None = None,
                       cpu_rule: str | None = None,
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
  for name, value, choices in (("mode", mode, AUTOTUNE_MODES),
                               ("cpu_rule", cpu_rule, AUTOTUNE_CPU_RULES)):
    if value is not None and value not in choices:
      raise ValueError(f"jt_dist autotuning: {name}={value!r} is not one of"
                       f" {list(choices)}.")
  if timeout_s is not None:
    if not float(timeout_s) > 0:
      raise ValueError(
          f"jt_dist autotuning: timeout_s={timeout_s!r} must be positive.")
    timeout_s = float(timeout_s)
  changes = {"autotune_mode": mode, "autotune_cpu_rule": cpu_rule,
             "autotune_timeout_s": timeout_s}
  _update(False, **{k: v for k, v in changes.items() if v is not None})
