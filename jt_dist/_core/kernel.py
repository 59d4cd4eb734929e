"""A user's kernel object, the configs it launches, and one call's spec.

The ``@triton.autotune``/``@triton.heuristics`` layers (in either order)
are unwrapped without being mutated and expanded into concrete configs.
A ``CallSpec`` is frozen and hashable: it is the primitive's static param.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist._core import exact as _exact
from jt_dist._core import types as _types


@dataclasses.dataclass(frozen=True)
class Param:
  """One parameter of the kernel's Python signature."""

  name: str
  is_constexpr: bool
  has_default: bool
  default: Any
  annotation: str = ""  # A declared scalar type such as "i32", else "".


@dataclasses.dataclass(frozen=True)
class Config:
  """One concrete launch configuration: constexpr values and launch options."""

  kwargs: tuple[tuple[str, Any], ...] = dataclasses.field(compare=False)
  num_warps: int
  num_stages: int
  num_ctas: int
  maxnreg: int | None
  label: str
  # The ``triton.Config`` an autotuner layer gave (its ``pre_hook``, and how
  # Triton prints it); None without one.
  tuned: Any = dataclasses.field(default=None, compare=False, repr=False)
  # ``kwargs`` as Triton tells values apart: (4,) == (4.0,) in Python only.
  kwargs_key: tuple = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "kwargs_key", _exact.items_key(self.kwargs))


@dataclasses.dataclass(frozen=True, eq=False)
class KernelInfo:
  """A kernel object unwrapped into its decorator layers and base function."""

  layers: tuple[Any, ...]  # Autotuner / Heuristics wrappers, outermost first.
  fn: Any  # JITFunction or InterpretedFunction.
  params: tuple[Param, ...]

  @property
  def name(self) -> str:
    return self.fn.fn.__name__

  @property
  def python_fn(self):
    return self.fn.fn

  @functools.cached_property
  def param_names(self) -> tuple[str, ...]:
    return tuple(p.name for p in self.params)

  @functools.cached_property
  def param_by_name(self) -> dict[str, Param]:
    return {p.name: p for p in self.params}


def _describe(obj: Any) -> str:
  return f"{obj!r} of type {type(obj).__module__}.{type(obj).__qualname__}"


def kernel_info(kernel: Any) -> KernelInfo:
  """Unwraps ``kernel``: TypeError if it is not a Triton kernel,
  NotImplementedError if a Gluon kernel uses what this Triton's Gluon lacks."""
  try:
    # Hashing a kernel parses its source, and CPython 3.11's ast counts
    # recursion depth per interpreter: two threads parsing at once can fail.
    with _compat.LANGUAGE_LOCK:
      return _kernel_info(kernel)
  except AttributeError as e:
    if (missing := _compat.missing_gluon_api(kernel, e)) is None:
      raise
    raise missing from e


@functools.lru_cache(maxsize=512)
def _kernel_info(kernel: Any) -> KernelInfo:
  layers = []
  obj = kernel
  while isinstance(obj, (_compat.Autotuner, _compat.Heuristics)):
    layers.append(obj)
    obj = obj.fn
  if not _compat.is_triton_function(obj):
    inner = "" if obj is kernel else f" (it wraps {_describe(obj)})"
    raise TypeError(
        f"triton_call: `kernel` must be a @triton.jit function, optionally"
        f" wrapped by @triton.autotune or @triton.heuristics; got"
        f" {_describe(kernel)}{inner}. Decorate the kernel's Python function"
        " with @triton.jit.")
  return KernelInfo(layers=tuple(layers), fn=obj, params=tuple(
      Param(name=p.name, is_constexpr=bool(p.is_constexpr),
            has_default=bool(p.has_default),
            default=p.default if p.has_default else None,
            annotation=str(getattr(p, "annotation_type", "") or ""))
      for p in _compat.jit_function_of(obj).params))


kernel_info.cache_clear = _kernel_info.cache_clear
kernel_info.cache_info = _kernel_info.cache_info


def _top_k(info: KernelInfo, tuner: Any, configs: list[Any],
           named_args: Mapping[str, Any]) -> list[Any]:
  """The ``top_k`` configs ``perf_model`` estimates fastest, as Triton's."""
  top_k = getattr(tuner, "configs_top_k", 1.0)
  if isinstance(top_k, float) and top_k <= 1.0:
    top_k = max(1, int(len(configs) * top_k))
  elif not isinstance(top_k, int):
    raise TypeError(
        f"triton_call: kernel {info.name!r} is autotuned with"
        f" prune_configs_by top_k={top_k!r}; it must be an int or a float"
        " <= 1.0, as for Triton.")
  if len(configs) <= top_k:
    return configs
  estimates = [
      _errors.call_user(tuner.perf_model,
                        f"the perf_model of kernel {info.name!r}",
                        **{**named_args, **config.all_kwargs()})
      for config in configs]
  order = sorted(range(len(configs)), key=lambda i: estimates[i])
  return [configs[i] for i in order[:top_k]]


def _is_array(value: Any) -> bool:
  if isinstance(value, tuple):
    return any(_is_array(v) for v in value)
  return isinstance(value, jax.ShapeDtypeStruct)


def _keywords(named_args: Mapping[str, Any]) -> dict[str, Any]:
  """What Triton's autotuner gets as ``**kwargs``: the scalar and constexpr
  arguments (launches pass those by keyword, arrays by position)."""
  return {k: v for k, v in named_args.items() if not _is_array(v)}


def _pruned(info: KernelInfo, tuner: Any, configs: list[Any],
            named_args: Mapping[str, Any], agrees) -> list[Any]:
  """``configs`` after ``prune_configs_by``, called as Triton calls it."""
  kwargs = _keywords(named_args)
  if type(tuner).prune_configs is not _compat.Autotuner.prune_configs:
    # A subclass's own pruning reads self.nargs, as in Triton's run().
    tuner.nargs = dict(named_args)
    try:
      pruned = _errors.call_user(
          tuner.prune_configs, f"the prune_configs of kernel {info.name!r}",
          kwargs)
    finally:
      tuner.nargs = None
    return [config for config in pruned if agrees(config)]
  prune = getattr(tuner, "early_config_prune", None)
  if prune is not None and configs:
    configs = list(_errors.call_user(
        prune, f"the early_config_prune of kernel {info.name!r}", configs,
        dict(named_args), **kwargs))
  if getattr(tuner, "perf_model", None) is not None and configs:
    configs = _top_k(info, tuner, configs, named_args)
  return configs


def _autotune_configs(info: KernelInfo, tuner: Any, fixed: Mapping[str, Any],
                      named_args: Mapping[str, Any]) -> list[Any]:
  if (getattr(tuner, "user_defined_pre_hook", False)
      or getattr(tuner, "user_defined_post_hook", False)):
    raise NotImplementedError(
        f"triton_call: kernel {info.name!r} is autotuned with a pre_hook or"
        " post_hook of the autotuner's own. Triton runs those around its"
        " benchmark launches, to reset or restore torch tensors; jt_dist"
        " times configs on inputs of its own and never on the caller's"
        " buffers, so there is nothing for them to do. Remove the hook; to"
        " zero an output before each launch, use reset_to_zero=[...] or"
        " pass zeroed_outputs=[...] to triton_call.")
  # Configs disagreeing with an explicit metaparam are dropped, not
  # rejected, so that an autotuned kernel can have some knobs pinned.
  def agrees(config) -> bool:
    return all(config.kwargs.get(k, v) == v for k, v in fixed.items())

  configs = [config for config in tuner.configs if agrees(config)]
  if configs:
    configs = _pruned(info, tuner, configs, named_args, agrees)
  if not configs:
    raise ValueError(
        f"triton_call: no autotuning config of kernel {info.name!r} is left"
        f" after pruning with the explicit metaparams {dict(fixed)!r}. Drop"
        " the metaparams that conflict with every config, or add a config"
        " that agrees with them.")
  return configs


def expand_configs(info: KernelInfo, metaparams: Mapping[str, Any],
                   named_args: Mapping[str, Any], num_warps: int | None,
                   num_stages: int | None, num_ctas: int) -> tuple[Config, ...]:
  """One ``Config`` per launch candidate of the decorator layers, applied
  outermost first as in Triton's launcher."""
  metaparams = _plain(metaparams)
  base = _compat.Config({}, num_warps=4 if num_warps is None else num_warps,
                        num_stages=3 if num_stages is None else num_stages,
                        num_ctas=num_ctas)
  # Each candidate: (the constexprs its layers set, its Triton config).
  partial = [({}, base)]
  for layer in info.layers:
    if isinstance(layer, _compat.Autotuner):
      # Constexprs set by outer layers prune configs as metaparams do.
      partial = [({**extra, **_plain(config.kwargs)}, config)
                 for extra, _ in partial
                 for config in _autotune_configs(
                     info, layer, {**metaparams, **extra}, named_args)]
    else:
      partial = [(_heuristics(info, layer, extra, metaparams, named_args),
                  config) for extra, config in partial]
  return tuple(_concrete(metaparams, extra, config, config is not base)
               for extra, config in partial)


def _heuristics(info, layer, extra, metaparams, named_args):
  """``extra`` with ``layer``'s heuristics' values, in Triton's order."""
  extra = dict(extra)
  for name, heuristic in layer.values.items():
    extra[name] = _types.plain_constexpr(_errors.call_user(
        heuristic, f"the heuristic for {name!r} of kernel {info.name!r}",
        {**named_args, **metaparams, **extra}))
  return extra


def _concrete(metaparams, extra, config, tuned: bool) -> Config:
  """A candidate as a ``Config``; its label names only what the layers
  chose (the metaparams are the same in every candidate)."""
  warps, stages, ctas = (_types.plain_constexpr(n) for n in (
      config.num_warps, config.num_stages, config.num_ctas))
  label = "".join(f"{k}: {v}, " for k, v in extra.items()) + (
      f"num_warps: {warps}, num_ctas: {ctas}, num_stages: {stages}")
  return Config(kwargs=tuple({**metaparams, **extra}.items()),
                num_warps=warps, num_stages=stages, num_ctas=ctas,
                maxnreg=getattr(config, "maxnreg", None), label=label,
                tuned=config if tuned else None)


def _plain(kwargs: Mapping[str, Any]) -> dict[str, Any]:
  return {k: _types.plain_constexpr(v) for k, v in kwargs.items()}


def label(name: str, path: tuple[int, ...]) -> str:
  """``yz[1]`` for the leaf of tuple parameter ``yz`` at path (1,)."""
  return name + "".join(f"[{k}]" for k in path)


@dataclasses.dataclass(frozen=True)
class Operand:
  """What binds one runtime (non-constexpr) kernel parameter."""

  name: str
  kind: str  # "array", "scalar" or "output".
  index: int  # Array index among array arguments, or output index.
  value: Any = dataclasses.field(compare=False)  # A scalar's; None else.
  type: str  # Triton's type name, e.g. "*fp32" or "i32".
  path: tuple[int, ...] = ()  # Where in a tuple parameter, e.g. (1, 0).
  # ``value`` as Triton tells values apart: 0.0 and -0.0 are two scalars.
  value_key: Any = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "value_key", _exact.key(self.value))

  @property
  def label(self) -> str:  # ``yz[1]`` for a leaf of tuple parameter yz.
    return label(self.name, self.path)


@dataclasses.dataclass(frozen=True)
class Launch:
  """One config's launch: its constexprs, options, grid and zeroed outputs."""

  config: Config
  grid: tuple[int, int, int]
  zeroed_outputs: tuple[int, ...]
  # The call's operands as this config's pre_hook retyped them (a
  # descriptor's block_shape); None where they are the call's own.
  operands: tuple[Operand, ...] | None = None


@dataclasses.dataclass(frozen=True)
class CallSpec:
  """Everything a lowering needs to launch the kernel; hashable and static."""

  kernel: Any
  name: str
  operands: tuple[Operand, ...]
  out_shapes: tuple[tuple[tuple[int, ...], np.dtype], ...]
  launches: tuple[Launch, ...]
  input_output_aliases: tuple[tuple[int, int], ...]
  compute_capability: int | None
  enable_fp_fusion: bool
  debug: bool
  serialized_metadata: bytes
  custom_call_target_name: str | None
  vmap_method: str | None
  # A _batching.Batched when this is the batched form of a user's call.
  batch: Any = None
  # So that a ShardingRule's call over several devices is refused with a
  # message about partitioning, not misplacement.
  sharding_rule: Any = None
  # The call must run even when its outputs are unused (has_side_effect=).
  has_side_effect: bool = False
  # ``cost_estimate=`` as sorted (key, int) pairs; () when not given.
  cost_estimate: tuple[tuple[str, int], ...] = ()
  # Trailing outputs that are ``jax.Ref`` arguments' new values (aliased,
  # binding no parameter).
  ref_outputs: int = 0
  # Triton compiler options besides the named ones: sorted (name, value).
  backend_options: tuple[tuple[str, Any], ...] = ()

  @property
  def info(self) -> KernelInfo:
    return kernel_info(self.kernel)

  def __repr__(self) -> str:
    grids = sorted({launch.grid for launch in self.launches})
    batch = f", batch={self.batch.layout.sizes}" if self.batch else ""
    return (f"CallSpec(kernel={self.info.name}, name={self.name!r},"
            f" configs={len(self.launches)}, grids={grids}{batch})")
