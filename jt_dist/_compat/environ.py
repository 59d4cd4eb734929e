"""Reading environment variables on the eager fast path.

CPython's ``os.environ`` encodes the name and decodes the value on every
``get``; the eager fast path reads its settings on every call.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable


def environ_reader(names: tuple[str, ...]) -> Callable[[], Any]:
  """A function returning the raw values of environment variables ``names``.

  It reads what ``os.environ.get`` reads (so a value set through
  ``os.environ`` or ``mock.patch.dict`` is seen at once) without encoding
  the name and decoding the value on every call, which the eager fast path
  would pay twice per call. The values are comparable, not decoded: one
  value (or None) for one name, else a tuple of them. Falls back to
  ``os.environ.get`` where CPython's ``os.environ`` has another shape, or
  where ``os.environ`` was replaced.
  """
  parts = environ_parts(names)
  if parts is None:
    if len(names) == 1:
      return functools.partial(_environ_get, names[0])
    return lambda: tuple(os.environ.get(name) for name in names)
  env, data, keys = parts
  if len(names) == 1:
    (key,), (name,) = keys, names
    return lambda: (data.get(key) if os.environ is env
                    else os.environ.get(name))
  return lambda: (tuple(map(data.get, keys)) if os.environ is env
                  else tuple(os.environ.get(name) for name in names))


def environ_parts(names: tuple[str, ...]) -> tuple[Any, dict, tuple] | None:
  """What ``environ_reader`` reads: ``os.environ``, its data, the names' keys.

  The data maps each encoded name to its encoded value; the keys are
  ``names`` encoded. None where CPython's ``os.environ`` has another shape
  (the reader then calls ``os.environ.get``). The values hold while
  ``os.environ`` is still the object given here.
  """
  env = os.environ
  data = getattr(env, "_data", None)
  encode = getattr(env, "encodekey", None)
  if not isinstance(data, dict) or encode is None:
    return None
  return env, data, tuple(encode(name) for name in names)


def _environ_get(name: str) -> Any:
  return os.environ.get(name)
