"""``kernel_call``: a kernel and its static configuration, as a function.

``jt_dist.kernel_call(kernel, out_shape=..., grid=..., **options)`` takes
everything static once and returns a function of the operands, in the
shape of ``pl.pallas_call`` and ``jax.ffi.ffi_call``. The function is a
``jax.jit`` of one kernel call (``jt_dist._sharding.local_call``): binding,
placement checks and the spec happen when jax traces it, and a repeated
call is jax's own C++ dispatch. The one Python frame around it is the
boundary where a failed call's error is given back in jt_dist's words.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from jt_dist import _errors
from jt_dist._core import kernel as _kernel
from jt_dist._cpu import host_faults as _host_faults
from jt_dist._gpu import faults as _gpu_faults
from jt_dist._sharding import local_call as _local_call
from jt_dist._sharding import placement as _placement

# Stands in a call's template for an operand passed at call time.
OPERAND = None


class KernelCall:
  """A Triton kernel with its outputs, grid, options and metaparams.

  Call it with the kernel's array operands, in order. Positional values
  fixed when it was made (``statics``: scalars passed by value, ``None``,
  ``shard_size`` placeholders) keep their places among them.
  """

  def __init__(self, kernel, out_shape, grid, options, metaparams,
               statics: Sequence[Any] = (), device: Any = None):
    """Makes the call; see ``kernel_call``.

    Args:
      kernel: the Triton kernel.
      out_shape: the outputs: a pytree of ``.shape``/``.dtype`` objects.
      grid: the launch grid, or a callable of the named parameters.
      options: the checked ``CallOptions``.
      metaparams: the kernel's constexprs by name.
      statics: one entry per positional argument: ``OPERAND`` for an
        operand given at call time, else the fixed value.
      device: ``device=`` as given, or None.
    """
    self.kernel = kernel
    self.out_shape = out_shape
    self.grid = grid
    self.options = options
    self.metaparams = metaparams
    self.statics = tuple(statics)
    self.device = device
    self._fixed = any(s is not OPERAND for s in self.statics)
    # Every operand is the primitive's, and a committed one places the call
    # even where nothing reads it (outputs that are all empty).
    self._jitted = jax.jit(self._traced, keep_unused=True)
    # A rule splits concrete sharded operands by their shardings, which a
    # trace does not see; device= moves uncommitted ones first.
    self._eager_first = (options.sharding_rule is not None
                         or device is not None)
    # JT_DIST_SYNC_LAUNCHES, read when the call is made: wait for each
    # launch, so that a device fault is reported by the call that caused it.
    self._sync = _gpu_faults.sync_launches()

  def _args(self, operands: Sequence[Any]) -> list[Any]:
    if not self._fixed:
      return list(operands)
    it = iter(operands)
    args = [next(it) if s is OPERAND else s for s in self.statics]
    args.extend(it)
    return args

  def _traced(self, *operands):
    return _local_call.call(self._args(operands), self.kernel,
                            self.out_shape, self.grid, self.options,
                            self.metaparams)

  def __call__(self, *operands: Any) -> Any:
    for x in operands:
      if isinstance(x, jax.core.Tracer):
        # Inside the caller's trace the primitive is bound where the caller
        # can see it (its jaxpr, its transformations), as jax's own are.
        return self._traced(*operands)
    if self._eager_first:
      return self._eager(operands)
    try:
      if self._sync:
        return jax.block_until_ready(self._jitted(*operands))
      return self._jitted(*operands)
    except Exception as e:  # pylint: disable=broad-except
      raise_failure(e, self._args(operands), self)

  def _eager(self, operands):
    """A call on concrete arrays that needs their placement first."""
    try:
      return _local_call.call(self._args(operands), self.kernel,
                              self.out_shape, self.grid, self.options,
                              self.metaparams, self.device)
    except Exception as e:  # pylint: disable=broad-except
      raise_failure(e, self._args(operands), self)

  def __repr__(self) -> str:
    name = getattr(getattr(self.kernel, "fn", None), "__name__", self.kernel)
    return f"jt_dist.kernel_call({name}, grid={self.grid!r})"


def raise_failure(error: Exception, args: Sequence[Any], call: KernelCall):
  """Raises a failed call's error in jt_dist's words where it has them.

  The kernel's own exception from a host callback (found by the token its
  launch filed), a placement error naming the argument, or a launch fault
  naming the kernel; else ``error`` itself. Must be called while handling
  ``error``.
  """
  raise_host_fault(error)
  # jax's own errors only: jt_dist's have said what they mean already.
  concrete = (type(error) in (TypeError, ValueError)
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


def raise_host_fault(error: Exception) -> None:
  """Raises the kernel's own exception behind ``error``, if a launch filed one.

  Returns otherwise.
  """
  original = _host_faults.take(error)
  if original is not None:
    raise original.with_traceback(None) from None


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


def make(kernel, out_shape, grid, kwargs: dict, statics) -> KernelCall:
  """A ``KernelCall`` of ``triton_call``'s keywords and fixed arguments."""
  kwargs = dict(kwargs)
  out_type = kwargs.pop("out_type", None)
  if out_type is not None:
    out_shape = resolve_out_shape(out_shape, out_type)
  device = kwargs.pop("device", None)
  options, metaparams = _local_call.options_from_keywords(kwargs)
  return KernelCall(kernel, out_shape, grid, options, metaparams, statics,
                    device)


def resolve_out_shape(out_shape: Any, out_type: Any) -> Any:
  """``out_shape`` or its other name ``out_type``, given once."""
  if out_shape is not None and out_type is not None:
    raise TypeError(
        "triton_call: got both out_shape= and out_type=, which are two names"
        " for the same argument. Pass only one."
    )
  return out_type if out_shape is None else out_shape
