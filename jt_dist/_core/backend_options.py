"""``backend_options``: Triton compiler options beyond the named ones.

As in jax-triton 0.4, ``num_warps``, ``num_stages``, ``num_ctas`` and
``debug`` (and jt_dist's ``enable_fp_fusion``) may be given either as
``triton_call`` arguments or inside ``backend_options``, never both. The
rest (``maxnreg``, ``extern_libs``, ...) go to the Triton backend's ``parse_options`` on
GPUs; the CPU interpreter compiles nothing and ignores them. The merged
options are kept as a sorted tuple of pairs, so that they can be part of
the front door's memo key and of the static ``CallSpec``.
"""

from __future__ import annotations

import collections.abc
from typing import Any

# The options triton_call also takes as arguments, with their values when
# not given: an argument equal to its default is not "given".
NAMED = {"num_warps": None, "num_stages": None, "num_ctas": None,
         "debug": False, "enable_fp_fusion": True}


def merge(backend_options: Any, **given: Any):
  """Merges ``backend_options`` into the named options (``NAMED``).

  A named option equal to its default is not given; anything else (even a
  wrong type, which ``_options.check`` reports) is. Returns ``(named,
  extra)``: every named option, from either source (its default where
  neither gave one), and the other options as sorted ``(name, value)``.
  """
  if backend_options is None:  # The usual case.
    return given, ()
  if not isinstance(backend_options, collections.abc.Mapping):
    raise TypeError(
        f"triton_call: backend_options={backend_options!r} of type"
        f" {type(backend_options).__name__} must be a dict of Triton compiler"
        " options, e.g. {'maxnreg': 128}.")
  for key, value in backend_options.items():
    if not isinstance(key, str):
      raise TypeError(
          f"triton_call: backend_options key {key!r} of type"
          f" {type(key).__name__} must be a str naming a Triton compiler"
          " option, e.g. 'maxnreg'.")
    try:
      hash(value)
    except TypeError:
      raise TypeError(
          f"triton_call: backend_options[{key!r}] must be hashable, got"
          f" {value!r} of type {type(value).__name__}. Pass a tuple instead"
          " of a list, or a tuple of (key, value) pairs instead of a dict."
      ) from None
  both = sorted(k for k in NAMED if k in backend_options
                and given[k] is not NAMED[k])
  if both:
    raise ValueError(
        f"triton_call: {', '.join(both)} given both as an argument and in"
        f" backend_options ({', '.join(f'{k}={given[k]!r}' for k in both)}"
        f" vs backend_options"
        f"{{{', '.join(f'{k!r}: {backend_options[k]!r}' for k in both)}}})."
        " Give each option once.")
  named = {k: backend_options.get(k, given[k]) for k in NAMED}
  extra = tuple(sorted((k, v) for k, v in backend_options.items()
                       if k not in NAMED))
  return named, extra
