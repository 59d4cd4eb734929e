"""``triton.language`` as a vectorised launch needs it patched.

Conversions to Python values, reductions and scans act per program; a
``bool``/``int`` outside lockstep raises ``Divergent`` where programs
disagree. A float atomic max/min is two integer atomics (signed on
non-negative lanes, unsigned on the rest); where both have lanes the pair
runs program after program, as one program at a time would.
"""

from __future__ import annotations

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist import _errors
from jt_dist._cpu import reductions as _reductions
from jt_dist._cpu import vector_builder as _vb

TensorHandle = _interpreter.TensorHandle


class Divergent(Exception):
  """The programs of a vectorised launch would take different paths."""


# Set while a combine function runs on blocks where upstream hands scalars.
_COMBINING = []


def _bool(tensor):
  data = np.asarray(tensor.handle.data)
  if data.size != (data.shape[0] if data.ndim else 1):
    if _COMBINING:
      raise _vb.Unsupported("bool() inside a combine function")
    # As upstream (the semantic layer asks if an operand was given so).
    return True
  return bool(_one_value(tensor, "bool()"))


def require_integer(tensor, kernel: str) -> None:
  """Refuses a non-integer ``__index__`` (range bounds, tuple indices), as
  compiling does; upstream would loop over a pointer's address for hours."""
  dtype = tensor.dtype
  if dtype.is_int():
    return
  hint = (" A jax array reaches a kernel as a pointer to its first element,"
          " also when it is 0-d (a traced scalar under jax.jit): pass a"
          " Python int (static under jax.jit), or read the value with"
          " tl.load." if dtype.is_ptr() else
          " Convert it first, e.g. `n.to(tl.int32)`.")
  pid = _interpreter.program_id()
  where = "" if pid is None else f", program id {pid}"
  raise _errors.KernelTypeError(
      f"triton_call: kernel {kernel!r}{where}: a loop bound, step or index"
      f" must be an integer, got a value of type {dtype}; compiled Triton"
      f" refuses it too (\"For loop bounds and step must all be"
      f" ints\").{hint}")


def _one_value(tensor, what: str):
  """The one Python-convertible value all programs hold for ``tensor``."""
  data = np.asarray(tensor.handle.data)
  count = data.shape[0] if data.ndim else 1
  if data.size != count:
    raise _vb.Unsupported(f"{what} of a block")
  values = data.reshape(count)
  active = _interpreter.builder().masks.current
  if count > 1 and active is not None and active.any():
    values = values[active]
  if count > 1 and not (values == values[0]).all():
    raise Divergent(f"{what} of a value that differs between programs")
  return values[0]


def _transpose(self):
  data = self.handle.data
  perm = (0,) + tuple(range(data.ndim - 1, 0, -1))
  handle = TensorHandle(np.transpose(data, perm), self.handle.dtype)
  shape = list(self.type.shape)
  shape[-1], shape[-2] = shape[-2], shape[-1]
  return tl.core.tensor(handle, tl.core.block_type(self.dtype, shape))


def patch(scope, kernel: str) -> None:
  """Adds the vectorised forms to ``scope``, after upstream's."""
  tensor = tl.core.tensor

  def index(self):
    require_integer(self, kernel)
    return int(_one_value(self, "int()"))

  scope.set_attr(tensor, "__bool__", _bool)
  scope.set_attr(tensor, "__index__", index)
  scope.set_attr(tensor, "T", property(_transpose))

  replacements = _reductions.language_functions(kernel, VectorReduce,
                                                VectorScan)
  for module in (tl, tl.core):
    for name, value in replacements.items():
      scope.set_attr(module, name, value)
  semantic = _interpreter.TritonSemantic
  for which in _HALVES:
    name = f"atomic_{which}"
    scope.set_attr(semantic, name, _ordered(which, getattr(semantic, name)))


def _to_tensor(data, dtype):
  """A tensor of ``dtype`` from per-program ``data`` (program axis first)."""
  data = np.asarray(data).astype(_interpreter.np_dtype(dtype), copy=False)
  if data.ndim <= 1:
    return tl.core.tensor(TensorHandle(data.reshape(-1), dtype.scalar), dtype)
  return tl.core.tensor(TensorHandle(data, dtype.scalar),
                        tl.block_type(dtype, list(data.shape[1:])))


class VectorReduce(_reductions.ReduceOnValues):
  """The reductions over all programs, reduced axes one to the right."""

  LEAD = 1
  to_tensor = staticmethod(_to_tensor)

  def generic_reduce(self, input):
    datas = [self._flat(t.handle.data)[0] for t in input]
    axis = self._flat(input[0].handle.data)[1]
    dtypes = [t.dtype for t in input]
    combine_fn = _reductions.CheckedCombine(self.combine_fn, self.kernel,
                                            "tl.reduce")
    *_, acc = _running(combine_fn, datas, axis, dtypes)
    ndim = input[0].handle.data.ndim
    return [self.to_tensor(self._shaped(a, ndim), dt)
            for a, dt in zip(acc, dtypes)]


def _running(combine_fn, datas, axis, dtypes):
  """What ``combine_fn`` accumulates along ``axis``, after each step."""
  datas = _vb.same_programs(datas)
  acc = [np.take(d, 0, axis=axis) for d in datas]
  yield acc
  for i in range(1, datas[0].shape[axis]):
    step = [np.take(d, i, axis=axis) for d in datas]
    acc = _combine(combine_fn, acc, step, dtypes)
    yield acc


def _combine(combine_fn, acc, step, dtypes):
  """One combine step over all programs, cast back as upstream stores it."""
  args = [_to_tensor(v, dt) for v, dt in zip(acc + step, dtypes * 2)]
  _COMBINING.append(True)
  try:
    ret = combine_fn.fn(*args)
  finally:
    _COMBINING.pop()
  ret = ret if isinstance(ret, tuple) else (ret,)
  values = [r.handle.data if isinstance(r, tl.core.tensor) else r for r in ret]
  return [np.broadcast_arrays(v, a)[0].astype(_interpreter.np_dtype(dt))
          for v, a, dt in zip(values, acc, dtypes)]


class VectorScan(_reductions.ScanOnValues):
  """The scans over all programs (upstream's dispatch, bf16 on values)."""

  to_tensor = staticmethod(_to_tensor)

  def apply_impl(self, input):
    # ``apply`` has checked the axis against the blocks; the data's is next.
    self.axis = int(self.axis) + 1
    return super().apply_impl(input)

  def generic_scan(self, input):
    combine_fn = _reductions.CheckedCombine(self.combine_fn, self.kernel,
                                            "tl.associative_scan")
    steps = _running(combine_fn, [t.handle.data for t in input], self.axis,
                     [t.dtype for t in input])
    return [self.to_tensor(np.stack(s, axis=self.axis), t.dtype)
            for s, t in zip(zip(*steps), input)]


_OP = _interpreter.ATOMIC_OP
# (op on the lanes with the sign bit clear, op on the others).
_HALVES = {"max": (_OP.MAX, _OP.UMIN), "min": (_OP.MIN, _OP.UMAX)}
# Float type -> its bits as (NumPy, Triton) types, signed then unsigned.
_FLOATS = {"fp32": ((np.int32, tl.int32), (np.uint32, tl.uint32)),
           "fp64": ((np.int64, tl.int64), (np.uint64, tl.uint64))}


def _programs_in_order(builder, which, ptr, val, mask, sem, scope):
  """Old values of a float atomic ``which`` over all programs, in order."""
  (signed, signed_ty), (unsigned, unsigned_ty) = _FLOATS[val.dtype.scalar.name]
  ptrs, vals, on = _vb._with_programs(  # pylint: disable=protected-access
      [ptr.data, val.data, builder.active(mask.data)], builder.programs)
  on = on.astype(bool)
  builder.atomic_order.take(ptrs, on)
  negative = (vals.view(unsigned) >> (8 * vals.itemsize - 1)).astype(bool)
  halves = ((_HALVES[which][0], signed, signed_ty, on & ~negative),
            (_HALVES[which][1], unsigned, unsigned_ty, on & negative))
  run = _interpreter.InterpreterBuilder.create_atomic_rmw
  olds = [np.zeros(vals.shape, signed), np.zeros(vals.shape, unsigned)]
  both = all(half[-1].any() for half in halves)
  rows = ([slice(p, p + 1) for p in range(builder.programs)] if both
          else [slice(None)])
  for row in rows:
    for old, (op, bits, bits_ty, lanes) in zip(olds, halves):
      if lanes[row].any():
        old[row] = run(
            builder, op, TensorHandle(ptrs[row], ptr.dtype),
            TensorHandle(vals[row].view(bits), bits_ty),
            TensorHandle(lanes[row], tl.int1), sem, scope).data
  old = np.where(negative, olds[1].view(signed), olds[0])
  return TensorHandle(old.view(vals.dtype), val.dtype.scalar)


def _ordered(which: str, original):
  def atomic(self, ptr, val, mask, sem, scope):
    builder = self.builder
    element = getattr(getattr(ptr, "type", None), "scalar", None)
    element = getattr(element, "element_ty", None)
    if (not isinstance(builder, _vb.VectorBuilder)
        or getattr(element, "name", None) not in _FLOATS):
      return original(self, ptr, val, mask, sem, scope)
    ptr, val, mask = self.atom_red_typechecking_impl(ptr, val, mask, which)
    handle = _programs_in_order(builder, which, ptr.handle, val.handle,
                                mask.handle, self._str_to_sem(sem),  # pylint: disable=protected-access
                                self._str_to_scope(scope))  # pylint: disable=protected-access
    return tl.tensor(handle, val.type)
  return atomic
