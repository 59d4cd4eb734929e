"""``triton_call``'s keyword options: one ``CallOptions``, checked once.

Checked here because a mistyped option would otherwise fail inside Triton's
compiler or jaxlib's protobuf writer, naming neither it nor the fix. As in
jax-triton 0.4, an option in ``NAMED`` may be an argument or in
``backend_options``, not both; the other backend options go to Triton's
``parse_options`` on GPUs, as sorted pairs so that specs can hold them.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import numbers
import re
from typing import Any, Callable, Mapping, Sequence

# A ROCm GPU arch as Triton's HIP backend takes it: no ":sramecc+" flags.
GFX_ARCH = re.compile(r"gfx[0-9a-f]{3,4}")
# The most CTAs a cluster may have without CUDA's non-portable opt-in.
MAX_CLUSTER = 8


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, fix: str,
               power_of_two: bool = False) -> None:
  if not _is_int(value):
    raise TypeError(
        f"triton_call: {name}={value!r} of type {type(value).__name__} must"
        f" be an int. {fix}")
  if value < low or (power_of_two and value & (value - 1)):
    shape = " and a power of two" if power_of_two else ""
    raise ValueError(
        f"triton_call: {name}={value!r} must be at least {low}{shape}. {fix}")


def _check_type(name: str, value: Any, types: tuple, expected: str) -> None:
  if not isinstance(value, types):
    raise TypeError(
        f"triton_call: {name}={value!r} of type {type(value).__name__} must"
        f" be {expected}.")


def check(options: Any) -> None:
  """Checks the fields of a ``CallOptions``: TypeError or ValueError."""
  if options.num_warps is not None:
    _check_int("num_warps", options.num_warps, 1,
               "Pass 1, 2, 4, 8, 16 or 32 warps per program (4 by default).",
               power_of_two=True)
  if options.num_stages is not None:
    _check_int("num_stages", options.num_stages, 0,
               "Pass the number of pipeline stages, e.g. 2 or 3 (the default).")
  _check_int("num_ctas", options.num_ctas, 1,
             "Pass 1 (the default), or a cluster size on Hopper or later.",
             power_of_two=True)
  if options.num_ctas > MAX_CLUSTER:
    # Larger clusters need an opt-in that jaxlib's launch does not set.
    raise ValueError(
        f"triton_call: num_ctas={options.num_ctas} must be at most"
        f" {MAX_CLUSTER}, the largest portable cluster on CUDA GPUs. Pass 1,"
        " 2, 4 or 8.")
  cc = options.compute_capability
  if cc is not None and not (isinstance(cc, str) and GFX_ARCH.fullmatch(cc)):
    _check_int("compute_capability", cc, 1,
               "Pass major * 10 + minor for CUDA, e.g. 90 for an H100, or a"
               " ROCm arch without feature flags, e.g. 'gfx942' for an MI300.")
  _check_type("name", options.name, (str,), "a str")
  _check_type("serialized_metadata", options.serialized_metadata,
              (bytes,), "bytes (e.g. b'...' or text.encode())")
  for flag in ("enable_fp_fusion", "debug", "has_side_effect"):
    _check_type(flag, getattr(options, flag), (bool,), "True or False")
  aliases = options.input_output_aliases
  if aliases is not None and not isinstance(aliases, collections.abc.Mapping):
    raise TypeError(
        f"triton_call: input_output_aliases={aliases!r} of type"
        f" {type(aliases).__name__} must be a dict from an input's index"
        " (among the array arguments) to an output's index, e.g. {0: 0}.")
  for key, value in (aliases or {}).items():
    if not _is_int(key) or not _is_int(value):
      raise TypeError(
          f"triton_call: input_output_aliases entry {key!r}: {value!r} must"
          " map an int input index to an int output index, e.g. {0: 0}.")


# jax-triton 0.4's CostEstimate keys; XLA reads them from the custom call.
COST_KEYS = ("bytes_accessed", "flops", "transcendentals")


def cost_items(cost: Any) -> tuple[tuple[str, int], ...]:
  """Checks ``cost_estimate`` and returns it as sorted (key, int) pairs."""
  if cost is None:
    return ()
  if not isinstance(cost, collections.abc.Mapping):
    raise TypeError(
        f"triton_call: cost_estimate={cost!r} of type {type(cost).__name__}"
        " must be a dict, e.g. {'flops': 2 * n, 'bytes_accessed': 12 * n}.")
  items = []
  for key, value in cost.items():
    if key not in COST_KEYS:
      raise ValueError(
          f"triton_call: cost_estimate has the key {key!r}; the known keys"
          f" are {', '.join(COST_KEYS)}.")
    _check_int(f"cost_estimate[{key!r}]", value, 0,
               "Pass an estimate of the whole call, as a non-negative int.")
    items.append((key, int(value)))
  return tuple(sorted(items))


# How jax.vmap may batch a call (``vmap_method=``).
VMAP_METHODS = (None, "grid", "sequential")


@dataclasses.dataclass(frozen=True)
class CallOptions:
  """``triton_call``'s keyword options besides kernel, outputs and grid."""

  name: str = ""
  custom_call_target_name: str | None = None
  num_warps: int | None = None
  num_stages: int | None = None
  num_ctas: int = 1
  compute_capability: int | str | None = None
  enable_fp_fusion: bool = True
  input_output_aliases: Mapping[int, int] | None = None
  zeroed_outputs: Sequence[int] | Callable[..., Sequence[int]] = ()
  debug: bool = False
  serialized_metadata: bytes = b""
  vmap_method: str | None = None
  sharding_rule: Any = None
  has_side_effect: bool = False
  cost_estimate: Any = None
  # Further Triton compiler options: sorted (name, value) pairs.
  backend_options: tuple[tuple[str, Any], ...] = ()
  # Array indices of ``jax.Ref`` arguments, each aliased to an extra output.
  ref_inputs: tuple[int, ...] = ()
  # (position in args, _tensordesc.Info) of each descriptor's array.
  tensor_descriptors: tuple = ()

  def with_descriptors(self, descriptors) -> "CallOptions":
    return (dataclasses.replace(self, tensor_descriptors=tuple(descriptors))
            if descriptors else self)

  def with_refs(self, ref_inputs) -> "CallOptions":
    return dataclasses.replace(self, ref_inputs=tuple(ref_inputs))

  def keywords(self) -> dict[str, Any]:
    """The options as ``triton_call`` keywords, for a per-shard call."""
    named = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name in OPTION_NAMES}
    named["backend_options"] = dict(self.backend_options) or None
    return named


# triton_call's option keywords (the front door resolves device, out_type).
OPTION_NAMES = frozenset(
    f.name for f in dataclasses.fields(CallOptions)
    if f.name not in ("ref_inputs", "tensor_descriptors"))


# Options also taken as arguments, by default value: a default is not given.
NAMED = {"num_warps": None, "num_stages": None, "num_ctas": None,
         "debug": False, "enable_fp_fusion": True}


def _merge_backend_options(backend_options: Any, given: dict[str, Any]):
  """``(every named option, the other options as sorted pairs)``."""
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


def make_options(*, backend_options=None, **rest) -> CallOptions:
  """The checked ``CallOptions`` of ``triton_call``'s option keywords."""
  given = {k: rest.pop(k, default) for k, default in NAMED.items()}
  named, extra = _merge_backend_options(backend_options, given)
  if named["num_ctas"] is None:
    named["num_ctas"] = 1
  vmap_method = rest.get("vmap_method")
  if vmap_method not in VMAP_METHODS:
    raise ValueError(
        f"triton_call: vmap_method={vmap_method!r} is not"
        " supported; pass None (the default: one launch over a batched grid"
        " where the grid has room, else one launch per element), 'grid' (one"
        " launch, or an error) or 'sequential' (one launch per element).")
  options = CallOptions(backend_options=extra, **named, **rest)
  check(options)
  cost_items(options.cost_estimate)
  return options
