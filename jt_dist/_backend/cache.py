"""Caches of compiled kernels: a bounded in-process LRU and an on-disk store.

Triton compiles during lowering, which JAX's persistent cache cannot spare.
Disk entries (JSON plus the binary, no pickle) are written atomically and
checked whole (sha256s) on load: a damaged one is recompiled, never used (a
forgery by whoever can write the directory is not caught).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from typing import Any, Callable, Mapping

from jt_dist import _settings

logger = logging.getLogger("jt_dist")

# Bumped when the entry layout or its metadata's meaning changes.
FORMAT_VERSION = 3
_KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def content_key(parts: Mapping[str, Any]) -> str:
  """The sha256 of ``parts`` serialised canonically (sorted JSON)."""
  text = json.dumps(parts, sort_keys=True, default=repr, separators=(",", ":"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_content_key(text: str) -> bool:
  """Whether ``text`` has the form of a ``content_key``."""
  return bool(_KEY_PATTERN.match(text))


class LRUCache:
  """A thread-safe, bounded map that evicts the least recently used entry."""

  def __init__(self, max_entries: Callable[[], int]):
    # Asked at each trim: the setting has one owner.
    self._entries: collections.OrderedDict[str, Any] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._max_entries = max_entries

  def get(self, key: str) -> Any | None:
    with self._lock:
      if key in self._entries:
        self._entries.move_to_end(key)
      return self._entries.get(key)

  def put(self, key: str, value: Any) -> None:
    with self._lock:
      self._entries[key] = value
      self._entries.move_to_end(key)
    self.trim()

  def trim(self) -> None:
    """Evicts the oldest entries over the limit."""
    with self._lock:
      while len(self._entries) > max(self._max_entries(), 0):
        self._entries.popitem(last=False)

  def clear(self) -> None:
    with self._lock:
      self._entries.clear()

  def __len__(self) -> int:
    with self._lock:
      return len(self._entries)

  def __contains__(self, key: str) -> bool:
    with self._lock:
      return key in self._entries


memory_cache = LRUCache(_settings.memory_entries)
_settings.trim_on_configure(memory_cache.trim)
# cache_info's events, counted per lowering or compile, never per eager call.
_events: collections.Counter[str] = collections.Counter()
_events_lock = threading.Lock()


def count(event: str) -> None:
  """Counts one ``event`` ("compiles", "disk_hits"...) for cache_info."""
  with _events_lock:
    _events[event] += 1


def counted(event: str) -> int:
  """How many times ``event`` was counted in this process."""
  with _events_lock:
    return _events[event]
_warned_unwritable: set[str] = set()
_warned_lock = threading.Lock()
# Striped, not per key: bounded, and two kernels rarely wait for each other.
_CREATE_LOCKS = tuple(threading.Lock() for _ in range(64))


def _entry_paths(key: str) -> tuple[str, str]:
  # Two-character fan-out keeps directories small on busy hosts.
  folder = os.path.join(_settings.cache_dir(), key[:2])
  return folder, os.path.join(folder, key + ".json")


def _entry_digest(document: Mapping[str, Any]) -> str:
  """The sha256 of every field of a document but the digest itself."""
  fields = {k: v for k, v in document.items() if k != "entry_sha256"}
  text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(b"jt_dist cache entry\n" + text.encode()).hexdigest()


def _binary_name(key: str, digest: str) -> str:
  # Named by its own hash too: a JSON document always names the binary it
  # was written with, even when two processes write one key.
  return f"{key}-{digest[:16]}.bin"


def _discard(key: str, paths: list[str], reason: str) -> None:
  logger.warning(
      "jt_dist: discarding the disk cache entry %s (%s); the kernel will be"
      " recompiled.", key[:16], reason)
  for path in paths:
    with contextlib.suppress(OSError):
      os.remove(path)


def load(key: str) -> tuple[dict[str, Any], bytes] | None:
  """``(metadata, binary)`` of ``key``'s entry, or None (a bad one deleted)."""
  if not _settings.disk_cache() or not _KEY_PATTERN.match(key):
    return None
  folder, json_path = _entry_paths(key)
  try:
    with open(json_path, "rb") as f:
      document = _parse_document(key, f.read())
  except (FileNotFoundError, NotADirectoryError):
    # NotADirectoryError: the directory is a file; store() says so, once.
    return None
  except OSError as e:
    logger.warning("jt_dist: cannot read disk cache entry %s: %s", json_path, e)
    return None
  if isinstance(document, str):
    _discard(key, [json_path], document)
    return None
  binary_path = os.path.join(folder, document["binary_file"])
  try:
    with open(binary_path, "rb") as f:
      binary = f.read()
  except OSError:
    _discard(key, [json_path], "its binary file is missing")
    return None
  if (len(binary) != document["binary_size"]
      or hashlib.sha256(binary).hexdigest() != document["binary_sha256"]):
    _discard(key, [json_path, binary_path],
             "its binary does not match the recorded size and sha256")
    return None
  return document["metadata"], binary


def _parse_document(key: str, raw: bytes) -> dict[str, Any] | str:
  """The entry's JSON document, or a string saying why it is unusable."""
  try:
    document = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, ValueError):
    return "its JSON metadata is corrupt or truncated"
  if not isinstance(document, dict):
    return "its JSON metadata is not an object"
  if document.get("format") != FORMAT_VERSION or document.get("key") != key:
    return "it was written for another key or cache format"
  if document.get("entry_sha256") != _entry_digest(document):
    return "its JSON metadata does not match its recorded sha256"
  digest = document.get("binary_sha256")
  if (not isinstance(digest, str) or not _KEY_PATTERN.match(digest)
      or document.get("binary_file") != _binary_name(key, digest)
      or not isinstance(document.get("binary_size"), int)
      or not isinstance(document.get("metadata"), dict)):
    return "its JSON metadata lacks the binary's name, size or sha256"
  return document


def _atomic_write(folder: str, path: str, data: bytes) -> None:
  # Readers see the old file or the complete new one (an atomic rename).
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def store(key: str, metadata: Mapping[str, Any], binary: bytes) -> None:
  """Writes the entry for ``key``; failures are logged, never raised."""
  if not _settings.disk_cache() or not _KEY_PATTERN.match(key):
    return
  folder, json_path = _entry_paths(key)
  digest = hashlib.sha256(binary).hexdigest()
  document = {"format": FORMAT_VERSION, "key": key,
              "binary_file": _binary_name(key, digest),
              "binary_size": len(binary), "binary_sha256": digest,
              "metadata": dict(metadata)}
  # Digested as a reader will parse it (tuples read back as lists).
  document = json.loads(json.dumps(document))
  document["entry_sha256"] = _entry_digest(document)
  try:
    os.makedirs(folder, exist_ok=True)
    # The binary first: a JSON document never names an incomplete one.
    _atomic_write(folder, os.path.join(folder, document["binary_file"]), binary)
    _atomic_write(folder, json_path, json.dumps(document).encode("utf-8"))
    count("disk_writes")
  except OSError as e:
    # Once per directory: a full or read-only disk fails every write.
    root = _settings.cache_dir()
    with _warned_lock:
      if root in _warned_unwritable:
        return
      _warned_unwritable.add(root)
    logger.warning(
        "jt_dist: cannot write the disk cache in %s (%s); compiled kernels"
        " will not be kept across processes. Set %s to a writable"
        " directory, or %s=0.", folder, e, _settings.CACHE_DIR,
        _settings.DISK_CACHE)


def get_or_create(key: str, create: Callable[[], tuple[Any, dict, bytes]],
                  restore: Callable[[dict, bytes], Any], *,
                  use_cached: bool = True) -> Any:
  """The value for ``key``: from memory, else from disk, else created
  (once for concurrent callers). ``restore`` raises ValueError, KeyError or
  TypeError for a bad entry."""
  if not use_cached:
    return _create_and_store(key, create)
  if (value := memory_cache.get(key)) is not None:
    count("memory_hits")
    return value
  with _CREATE_LOCKS[hash(key) % len(_CREATE_LOCKS)]:
    # Created while this thread waited?
    if (value := memory_cache.get(key)) is not None:
      count("memory_hits")
      return value
    if (entry := load(key)) is not None:
      try:
        value = restore(*entry)
      except (ValueError, KeyError, TypeError) as e:
        _discard(key, [_entry_paths(key)[1]], f"its metadata is invalid: {e}")
      else:
        memory_cache.put(key, value)
        count("disk_hits")
        return value
    return _create_and_store(key, create)


def _create_and_store(key: str, create) -> Any:
  value, metadata, binary = create()
  count("compiles")
  memory_cache.put(key, value)
  store(key, metadata, binary)
  return value
