"""``kernel_call``: a kernel and its static configuration, as a function.

In the shape of ``pl.pallas_call`` and ``jax.ffi.ffi_call``: a ``jax.jit``
of one kernel call (binding, placement checks and the spec happen when jax
traces it), so a repeated call is jax's own C++ dispatch. The one Python
frame around it is where a failed call's error is given in jt_dist's words.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from jt_dist import _compat
from jt_dist import _errors
from jt_dist import _settings
from jt_dist._core import kernel as _kernel
from jt_dist._core import outputs as _outputs
from jt_dist._core import placeholders as _placeholders
from jt_dist._core import types as _types
from jt_dist._core import host_faults as _host_faults
from jt_dist._gpu import faults as _gpu_faults
from jt_dist._sharding import local_call as _local_call
from jt_dist._sharding import placement as _placement


class _Operand:
  """An operand passed at call time (not ``None``, which a call may fix)."""

  def __repr__(self) -> str:
    return "OPERAND"


OPERAND = _Operand()


class KernelCall:
  """A Triton kernel with its outputs, grid, options and metaparams.

  Call it with the kernel's array operands, in order. Positional values
  fixed when it was made (``statics``: scalars passed by value, ``None``,
  ``shard_size`` placeholders) keep their places among them; scalars that
  nothing static reads and whose type comes at run time (``runtime_dtype``)
  are passed at call time instead (``passed``), as ``runtime_scalar``s, and
  a new value compiles nothing.
  """

  def __init__(self, kernel, out_shape, grid, options, metaparams,
               statics: Sequence[Any] = (), device: Any = None,
               runtime_scalars: bool = False):
    """Makes the call; see ``kernel_call``.

    ``statics`` has one entry per positional argument: ``OPERAND``, or the
    value fixed in the call; ``runtime_scalars``: whether the scalars among
    them may come at call time, where nothing static reads their values.
    """
    self.kernel = kernel
    self.out_shape = out_shape
    self.grid = grid
    self.options = options
    self.metaparams = metaparams
    self.statics = tuple(statics)
    self.device = device
    # The source the call was made for: Triton lets it be replaced. The
    # front door compares them itself, a frame less on its hot path.
    self.triton_fn = _kernel.kernel_info(kernel).fn
    self.triton_src = getattr(self.triton_fn, "src", None)
    # device= moves uncommitted operands before the call.
    self._eager_first = device is not None
    # Position -> dtype of each scalar passed at call time.
    self.slots = self._runtime_slots() if runtime_scalars else {}
    # Per positional argument: whether the caller passes it at call time.
    self.passed = tuple(s is OPERAND or i in self.slots
                        for i, s in enumerate(self.statics))
    self.passed_all = all(self.passed)
    # The slice of the arguments passed, where they lead (x, y, n); else None.
    passed = sum(self.passed)
    self.leading = slice(passed) if all(self.passed[:passed]) else None
    # Every operand is the primitive's, and a committed one places the call
    # even where nothing reads it (outputs that are all empty).
    self._jitted = jax.jit(
        self._traced_runtime if self.slots else self._traced,
        keep_unused=True)
    # A rule splits concrete operands by their shardings, which a trace
    # sees only on explicit mesh axes: the layout found on them is static.
    self._split = (None if options.sharding_rule is None else jax.jit(
        self._traced_split, static_argnums=0, keep_unused=True))
    # JT_DIST_SYNC_LAUNCHES, read when the call is made: wait for each
    # launch, so that a device fault is reported by the call that caused it.
    self._sync = _settings.sync_launches()
    # Whether a call on concrete operands is jax's dispatch alone (the front
    # door then calls it so); with runtime scalars, at top level only.
    self.direct = not (self.slots or self._split or self._eager_first
                       or self._sync)
    self._plain_at_top = bool(self.slots) and not self._sync

  def made_for(self, kernel: Any) -> bool:
    """Whether this call is ``kernel``'s, made for its current source."""
    return kernel is self.kernel and self.fresh()

  def fresh(self) -> bool:
    """Whether the kernel's source is still the one the call was made for."""
    return getattr(self.triton_fn, "src", None) is self.triton_src

  def takes_at_run_time(self, args: Sequence[Any]) -> bool:
    """Whether ``args``' scalars all come at run time, of this call's types."""
    return all(runtime_dtype(args[i]) == dtype
               for i, dtype in self.slots.items())

  def _runtime_slots(self) -> dict[int, np.dtype]:
    """Position -> dtype of the scalars that can come at call time, or {}.

    None can where anything static reads a scalar's value or place (a
    callable grid, autotuning, a constexpr, aliases, a sharding rule...).
    """
    if (callable(self.grid) or callable(self.options.zeroed_outputs)
        or self._eager_first or self.options.sharding_rule is not None
        or self.options.input_output_aliases
        or any(isinstance(v, _placeholders.ShardSize)
               for v in self.metaparams.values())):
      return {}
    info = _kernel.kernel_info(self.kernel)
    if info.layers:
      return {}
    slots = {}
    for i, value in enumerate(self.statics):
      dtype = None if value is OPERAND else runtime_dtype(value)
      if dtype is None:
        continue
      if i >= len(info.params):
        return {}
      param = info.params[i]
      if param.is_constexpr or param.annotation:
        return {}
      slots[i] = dtype
    return slots

  def _args(self, operands: Sequence[Any]) -> list[Any]:
    """The positional arguments: ``operands`` with the statics in place."""
    if self.passed_all:
      return list(operands)
    it = iter(operands)
    args = [next(it) if passed else s
            for s, passed in zip(self.statics, self.passed)]
    args.extend(it)
    return args

  def _traced(self, *operands):
    return self._local(operands)

  def _traced_split(self, layout, *operands):
    return self._local(operands, layout=layout)

  def _traced_runtime(self, *operands):
    """The call with its scalars as ``runtime_scalar``s, of Triton's types."""
    return self._local(operands, self.slots)

  def _local(self, operands, slots=None, **where):
    """``local_call.call`` of this call on ``operands``."""
    args = self._args(operands)
    if slots:
      args = [_placeholders.RuntimeScalar(x, slots[i]) if i in slots else x
              for i, x in enumerate(args)]
    return _local_call.call(args, self.kernel, self.out_shape, self.grid,
                            self.options, self.metaparams, **where)

  def __call__(self, *operands: Any) -> Any:
    if ((self.direct or self._plain_at_top and _compat.at_top_level())
        and CONCRETE.issuperset(map(type, operands))):
      # Concrete arrays and nothing to add: jax's dispatch alone.
      try:
        return self._jitted(*operands)
      except KeyboardInterrupt:
        _host_faults.abandon_launches()  # Its launches stop where they are.
        raise
      except Exception as e:  # pylint: disable=broad-except
        raise_failure(e, self._args(operands), self)
    if _traced_within(operands) or (self.slots
                                    and not _compat.at_top_level()):
      # Inside the caller's trace the primitive is bound where the caller
      # can see it (its jaxpr, its transformations), as jax's own are; its
      # scalars are then the caller's to lower for any platform.
      return self._traced(*operands)
    if self._eager_first:
      return self._eager(operands)
    try:
      if self._split is not None:
        layout = _local_call.find_layout(self._args(operands), self.options)
        if layout is not None:
          return self._split(layout, *operands)
      if self._sync:
        return jax.block_until_ready(self._jitted(*operands))
      return self._jitted(*operands)
    except KeyboardInterrupt:
      _host_faults.abandon_launches()  # Its launches stop where they are.
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise_failure(e, self._args(operands), self)

  def _eager(self, operands):
    """A call on concrete arrays that needs their placement first."""
    try:
      return self._local(operands, device=self.device)
    except KeyboardInterrupt:
      _host_faults.abandon_launches()  # Its launches stop where they are.
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise_failure(e, self._args(operands), self)

  def __repr__(self) -> str:
    name = getattr(getattr(self.kernel, "fn", None), "__name__", self.kernel)
    return f"jt_dist.kernel_call({name}, grid={self.grid!r})"


# The dtype a scalar of each Triton type travels as when it comes at run
# time: 64-bit types stay compiled in (JAX holds them only with x64 on).
_RUNTIME_DTYPES = {t: d for t, d in _placeholders.SCALAR_DTYPES.items()
                   if d.itemsize < 8}


def runtime_dtype(value: Any) -> np.dtype | None:
  """The dtype a positional scalar travels as where its value may come at
  run time, by its type; else None.

  On the CPU every bool, int and float of a 32-bit Triton type (the
  interpreter specialises on no value; ``np.float32`` is deprecated). On
  GPUs a float32 Python float: Triton never specialises on a float's value,
  but it does ints (equal to 1, divisible by 16) and bools.
  """
  if type(value) is not float and (  # pylint: disable=unidiomatic-typecheck
      jax.default_backend() != "cpu" or not _types.is_scalar(value)
      or isinstance(value, np.float32)):
    return None
  return _RUNTIME_DTYPES.get(_types.scalar_type(value))


# Types of operands known not to be tracers; grows by the classes of
# concrete jax.Arrays (jaxlib's ArrayImpl) as they are met.
CONCRETE = {np.ndarray, bool, int, float}


def _traced_within(operands: Sequence[Any]) -> bool:
  """Whether an operand, or an array in a tuple operand, is a tracer."""
  if CONCRETE.issuperset(map(type, operands)):
    return False
  for x in operands:
    if _placeholders.is_runtime_scalar(x):
      x = x.value
    if isinstance(x, jax.core.Tracer):
      return True
    if type(x) is tuple and _traced_within(x):  # pylint: disable=unidiomatic-typecheck
      return True
    if isinstance(x, jax.Array):
      CONCRETE.add(type(x))
  return False


def raise_failure(error: Exception, args: Sequence[Any], call: KernelCall):
  """Raises a failed call's error in jt_dist's words where it has them.

  The kernel's own exception from a host callback (by its launch's token),
  a placement error, a launch fault; else ``error``, being handled.
  """
  _host_faults.raise_original(error)
  # jax's own errors, and placement found in the trace: said again on the
  # concrete arrays, naming their devices.
  concrete = ((type(error) in (TypeError, ValueError)
               or isinstance(error, _errors.DevicePlacementError))
              and not any(isinstance(a, jax.core.Tracer) for a in _flat(args)))
  if concrete and type(error) is TypeError:
    # jit refuses an operand it cannot read as an array (a string or object
    # array) before jt_dist sees it: binding says which and why.
    _local_call.check_binding(args, call.kernel, call.out_shape, call.grid,
                              call.options, call.metaparams)
  if concrete and call.options.sharding_rule is None:
    # jit refuses operands on different devices, and the lowering a call
    # sharded over several: say which argument, where it is, and the fix.
    name = _kernel_name(call.kernel)
    _placement.check_concrete(_flat(args), name, call.device)
  if _gpu_faults.is_device_fault(error):
    raise _gpu_faults.launch_fault(error, _describe(call)) from error
  raise error


def explain_binding(error: _errors.KernelBindingError, args: Sequence[Any],
                    kernel: Any, out_shape: Any, grid: Any,
                    kwargs: dict) -> _errors.KernelBindingError:
  """``error`` with its fix where one array argument is one too many: the
  call binds without it (the arguments after it by keyword), an output
  then binding that argument's parameter. Else ``error`` itself.

  A call with keyword operands is explained again with the caller's own
  arguments, after its positional form was (``unexplained``)."""
  base = getattr(error, "unexplained", error)
  try:
    info = _kernel.kernel_info(kernel)
    kwargs = dict(kwargs)
    out_shape = resolve_out_shape(out_shape, kwargs.pop("out_type", None))
    kwargs.pop("device", None)
    options, metaparams = _local_call.options_from_keywords(kernel, kwargs)
  except Exception:  # pylint: disable=broad-except
    return error
  for i in reversed(range(min(len(args), len(info.params)))):
    if _types.is_scalar(args[i]) or not _types.is_shape_dtype(args[i]):
      continue
    name = info.params[i].name
    later = {p.name: a for p, a in zip(info.params[i + 1:], args[i + 1:])}
    try:
      _, spec, _ = _local_call.check_binding(
          args[:i], kernel, out_shape, grid, options,
          {**metaparams, **later})
    except Exception:  # pylint: disable=broad-except
      continue
    outputs = [op.index for op in spec.operands
               if op.kind == "output" and op.name == name]
    if outputs:
      also = (f", and pass {', '.join(f'{k}=' for k in later)} by keyword"
              if later else "")
      explained = _errors.KernelBindingError(
          f"{base} args[{i}] is an array binding {name!r}, which output"
          f" {outputs[0]} binds once args[{i}] is dropped: one array argument"
          f" too many? If args[{i}] stands for the output, drop it{also};"
          f" out_shape gives {name!r} its buffer.")
      explained.unexplained = base
      return explained
  return error


def _flat(args):
  return [leaf for a in args for leaf in jax.tree_util.tree_leaves(a)]


def _kernel_name(kernel) -> str:
  try:
    return _kernel.kernel_info(kernel).name
  except Exception:  # pylint: disable=broad-except
    return repr(kernel)


def _describe(call: KernelCall) -> str:
  label = f" (name={call.options.name!r})" if call.options.name else ""
  return (f"kernel {_kernel_name(call.kernel)!r}{label}: grid {call.grid!r}"
          f" with {call.metaparams}, num_warps={call.options.num_warps},"
          f" num_stages={call.options.num_stages}")


def kernel_call(kernel: Any, *, out_shape: Any = None, grid: Any,
                **options_and_metaparams: Any) -> KernelCall:
  """Makes a function that calls ``kernel`` on its operands.

  The curried form of ``triton_call``: everything but the operands is
  given once, and the returned function's repeated calls go through
  ``jax.jit``'s own dispatch, with nothing of jt_dist's in between. Use it
  for a kernel called in a hot loop::

      add = jt_dist.kernel_call(add_kernel, out_shape=x, grid=(8,),
                                n=x.size, BLOCK=128)
      for _ in range(steps):
        z = add(x, y)

  Args:
    kernel: a ``@triton.jit`` function, optionally wrapped by
      ``@triton.autotune`` and/or ``@triton.heuristics``.
    out_shape: as for ``triton_call``: a pytree of objects with ``.shape``
      and ``.dtype``.
    grid: as for ``triton_call``.
    **options_and_metaparams: ``triton_call``'s options (``num_warps``,
      ``input_output_aliases``, ``sharding_rule``, ``device``, ...) and the
      kernel's metaparams by name. A non-constexpr parameter given here
      binds a fixed scalar, passed by value, as in ``triton_call``.

  Returns:
    A ``KernelCall``: call it with the kernel's array operands (arrays,
    ``jax.Ref``s, ``TensorDescriptor``s, tuples of them), positionally in
    parameter order. Each is passed as a pointer; under ``jax.jit`` a
    0-d array is too.

  Raises:
    TypeError, ValueError: an option has the wrong type or value (see
      ``triton_call``). Binding errors are raised at the first call, when
      the operands' shapes are known.
  """
  return make(kernel, out_shape, grid, options_and_metaparams, ())


def make(kernel, out_shape, grid, kwargs: dict, statics,
         runtime_scalars: bool = False) -> KernelCall:
  """A ``KernelCall`` of ``triton_call``'s keywords and fixed arguments."""
  kwargs = dict(kwargs)
  out_type = kwargs.pop("out_type", None)
  if out_type is not None:
    out_shape = resolve_out_shape(out_shape, out_type)
  device = kwargs.pop("device", None)
  out_shape = _outputs.without_arrays(out_shape)
  options, metaparams = _local_call.options_from_keywords(kernel, kwargs)
  return KernelCall(kernel, out_shape, grid, options, metaparams, statics,
                    device, runtime_scalars)


def resolve_out_shape(out_shape: Any, out_type: Any) -> Any:
  """``out_shape`` or its other name ``out_type``, given once."""
  if out_shape is not None and out_type is not None:
    raise TypeError(
        "triton_call: got both out_shape= and out_type=, which are two names"
        " for the same argument. Pass only one.")
  return out_type if out_shape is None else out_shape
