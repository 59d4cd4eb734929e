"""Triton's interpreter builder, run over every program instance at once.

Each handle has a leading program axis of Q (the chunk's programs) or 1
(shared, broadcast): a scalar is ``(Q,)``, a block ``(Q, *S)``; upstream's
scalars are ``(1,)``, so a shared one looks the same. Methods that name an
axis or act once per program are redefined; unreviewed ones refuse.
Programs are numbered as upstream's grid loop visits them (z innermost), so
memory sees upstream's order.
"""

from __future__ import annotations

import types

import numpy as np
import triton.language as tl
from jt_dist._cpu import interpreter as _interpreter

from jt_dist._cpu import atomics as _atomics
from jt_dist._cpu import lockstep as _lockstep
from jt_dist._cpu import vector_reviewed as _reviewed

TensorHandle = _interpreter.TensorHandle
Unsupported = _reviewed.Unsupported


def program_ids(grid, flat):
  """The (x, y, z) program ids of flat program numbers (ints or arrays)."""
  _, gy, gz = grid
  return flat // (gy * gz), (flat // gz) % gy, flat % gz


def _lead(data) -> int:
  return np.shape(data)[0]


def _with_programs(arrays, count: int):
  """``arrays`` broadcast to one shape, program axis ``count``."""
  arrays = [np.asarray(a) for a in arrays]
  shape = (count,) + np.broadcast_shapes(*(a.shape for a in arrays))[1:]
  return [np.ascontiguousarray(np.broadcast_to(a, shape)) for a in arrays]


def same_programs(arrays):
  """``arrays`` broadcast to the longest program axis."""
  count = max(_lead(a) for a in arrays)
  return [np.broadcast_to(a, (count,) + a.shape[1:]) for a in arrays]


def _mask_data(mask):
  # Triton 3.6's block pointers hand a bare ndarray as the mask.
  return mask if isinstance(mask, np.ndarray) else mask.data


class VectorBuilder(_interpreter.InterpreterBuilder):
  """An ``InterpreterBuilder`` whose values span the programs of a chunk."""

  def __init__(self, grid: tuple[int, int, int],
               programs: range | None = None):
    super().__init__()
    self.set_grid_dim(*grid)
    self.grid_idx = None
    self.set_programs(range(int(np.prod(grid))) if programs is None
                      else programs)

  def set_programs(self, programs: range) -> None:
    """Makes values span ``programs`` (flat numbers), in order."""
    self.programs = len(programs)
    self.masks = _lockstep.Masks()
    self.atomic_order = _atomics.AtomicOrder()
    flat = np.arange(programs.start, programs.stop, dtype=np.int64)
    self._pids = tuple(p.astype(np.int32)
                       for p in program_ids(self.grid_dim, flat))

  def create_get_program_id(self, axis):
    if self.grid_dim[axis] == 1:
      return TensorHandle(np.zeros(1, np.int32), tl.int32)
    return TensorHandle(self._pids[axis], tl.int32)

  def create_make_range(self, ret_ty, start, stop):
    return TensorHandle(np.arange(start, stop, dtype=np.int32)[None], tl.int32)

  # Memory: loads may stay shared; writes honour the lockstep masks.

  def active(self, mask):
    """``mask`` (a per-lane bool array) and the active programs."""
    if (active := self.masks.current) is None:
      return mask
    mask = np.asarray(mask, dtype=bool)
    return mask & active.reshape((-1,) + (1,) * (mask.ndim - 1))

  def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
    datas = [ptrs.data, self.active(_mask_data(mask))]
    if other is not None:
      datas.append(other.data)
    datas = _with_programs(datas, max(map(_lead, datas)))
    other = None if other is None else TensorHandle(datas[2], other.dtype)
    return super().create_masked_load(
        TensorHandle(datas[0], ptrs.dtype), TensorHandle(datas[1], tl.int1),
        other, *args, **kwargs)

  def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
    p, v, m = _with_programs(
        [ptrs.data, value.data, self.active(_mask_data(mask))], self.programs)
    return super().create_masked_store(
        TensorHandle(p, ptrs.dtype), TensorHandle(v, value.dtype),
        TensorHandle(m, tl.int1), *args, **kwargs)

  def create_atomic_rmw(self, rmwOp, ptr, val, mask, *args, **kwargs):  # pylint: disable=invalid-name
    mask_data = self.active(np.ones(1, bool) if mask is None else mask.data)
    if rmwOp in _ADD_OPS and _lead(ptr.data) == 1 and _lead(mask_data) == 1:
      old = _shared_address_add(ptr.data[0], val.data, mask_data[0],
                                self.programs)
      if old is not None:
        # (A refusal after the writes: the launch's journal undoes them.)
        row_mask = np.broadcast_to(np.asarray(mask_data[0], bool),
                                   np.shape(ptr.data[0]))
        self.atomic_order.take_shared(ptr.data[0][row_mask], self.programs)
        return TensorHandle(old, val.dtype.scalar)
    p, v, m = _with_programs([ptr.data, val.data, mask_data], self.programs)
    self.atomic_order.take(p, m)
    return super().create_atomic_rmw(
        rmwOp, TensorHandle(p, ptr.dtype), TensorHandle(v, val.dtype),
        TensorHandle(m, tl.int1), *args, **kwargs)

  def create_atomic_cas(self, ptr, cmp, val, *args, **kwargs):
    p, c, v = _with_programs([ptr.data, cmp.data, val.data], self.programs)
    self.atomic_order.take(p, self.active(np.ones(p.shape, bool)))
    if (rows := self.masks.current) is None:
      return super().create_atomic_cas(
          TensorHandle(p, ptr.dtype), TensorHandle(c, cmp.dtype),
          TensorHandle(v, val.dtype), *args, **kwargs)
    old = np.zeros_like(v)
    if rows.any():
      old[rows] = super().create_atomic_cas(
          TensorHandle(p[rows], ptr.dtype), TensorHandle(c[rows], cmp.dtype),
          TensorHandle(v[rows], val.dtype), *args, **kwargs).data
    return TensorHandle(old, val.dtype)

  def _holds(self, condition):
    """``condition``, true for every program masked off."""
    return TensorHandle(~self.active(~np.asarray(condition.data, bool)),
                        tl.int1)

  def create_assert(self, condition, message):
    return super().create_assert(self._holds(condition), message)

  def create_assume(self, condition):
    return super().create_assume(self._holds(condition))

  def create_addptr(self, ptr, offset):
    # Upstream's ``ptr + width * offset`` makes three large arrays; one,
    # updated in place, holds the same wrapping uint64 addresses.
    width = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
    addresses = np.asarray(offset.data).astype(np.uint64)
    if width != 1:
      np.multiply(addresses, np.uint64(width), out=addresses)
    base = np.asarray(ptr.data)
    if np.broadcast_shapes(addresses.shape, base.shape) == addresses.shape:
      np.add(addresses, base, out=addresses)
    else:
      addresses = base + addresses
    return TensorHandle(addresses, ptr.dtype)

  # Shapes: every block axis is one further right.

  def create_splat(self, ret_ty, arg):
    shape = tuple(int(s) for s in ret_ty.shape)
    data = np.asarray(arg.data).astype(_interpreter.np_dtype(arg.dtype),
                                       copy=False)
    count = _lead(data)
    data = data.reshape((count,) + (1,) * len(shape))
    return TensorHandle(np.broadcast_to(data, (count,) + shape),
                        arg.dtype.scalar)

  def create_unsplat(self, arg):
    return TensorHandle(arg.data.reshape(_lead(arg.data)), arg.dtype.scalar)

  def create_broadcast(self, arg, shape):
    shape = (_lead(arg.data),) + tuple(int(s) for s in shape)
    return TensorHandle(np.broadcast_to(arg.data, shape), arg.dtype.scalar)

  def create_expand_dims(self, arg, axis):
    if axis < 0:
      axis += arg.data.ndim
    return TensorHandle(np.expand_dims(arg.data, axis + 1), arg.dtype.scalar)

  def create_reshape(self, arg, shape, *args, **kwargs):
    shape = (_lead(arg.data),) + tuple(int(s) for s in shape)
    return TensorHandle(arg.data.reshape(shape), arg.dtype.scalar)

  def create_trans(self, arg, perm):
    perm = (0,) + tuple(int(p) + 1 for p in perm)
    return TensorHandle(np.transpose(arg.data, perm), arg.dtype.scalar)

  def create_cat(self, lhs, rhs):
    return TensorHandle(
        np.concatenate(same_programs([lhs.data, rhs.data]), axis=1),
        lhs.dtype.scalar)

  def create_join(self, lhs, rhs):
    joined = np.stack(np.broadcast_arrays(lhs.data, rhs.data), axis=-1)
    return TensorHandle(joined, lhs.dtype.scalar)

  def create_gather(self, src, indices, axis):
    src_data, idx = same_programs([src.data, indices.data])
    return TensorHandle(np.take_along_axis(src_data, idx, axis=axis + 1),
                        src.dtype.scalar)

  def create_histogram(self, data, bins, mask):
    datas = same_programs([data.data] + ([] if mask is None else [mask.data]))
    rows = []
    for i, row in enumerate(datas[0]):
      row_mask = None if mask is None else TensorHandle(datas[1][i],
                                                        mask.dtype)
      rows.append(super().create_histogram(TensorHandle(row, data.dtype), bins,
                                           row_mask).data)
    return TensorHandle(np.stack(rows), tl.int32)

  def create_make_tensor_descriptor(self, *args, **kwargs):
    return _vectorised(super().create_make_tensor_descriptor(*args, **kwargs),
                       _descriptor_pointers)

  def create_make_block_ptr(self, *args, **kwargs):
    return _vectorised(super().create_make_block_ptr(*args, **kwargs),
                       _block_pointers)

  def create_advance(self, ptr, offsets):
    if len(ptr.offsets) != len(offsets):
      raise ValueError("len(ptr.offsets) != len(offsets)")
    moved = [TensorHandle(np.add(o.data, d.data).astype(o.data.dtype),
                          o.dtype) for o, d in zip(ptr.offsets, offsets)]
    ret = _interpreter.BlockPointerHandle(
        ptr.base, ptr.shape, ptr.strides, moved, ptr.block_shape, ptr.order)
    return _vectorised(ret, _block_pointers)


# Upstream's methods neither redefined above nor reviewed, which refuse.
UNREVIEWED = tuple(_reviewed.refuse_unreviewed(
    VectorBuilder, _interpreter.InterpreterBuilder))

_ADD_OPS = (_interpreter.ATOMIC_OP.ADD, _interpreter.ATOMIC_OP.FADD)  # pylint: disable=protected-access
# Types whose NumPy addition rounds (or wraps) as the native atomic's does.
_ADDABLE = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32,
                                       np.int64, np.uint32, np.uint64))


def _shared_address_add(row_ptrs, values, row_mask, programs: int):
  """Every program's atomic add into the same distinct addresses, as a
  sequential cumsum down the program axis (as native atomics add): the old
  values (0 where masked), or None where this cannot apply."""
  values = np.asarray(values)
  row_mask = np.broadcast_to(np.asarray(row_mask, dtype=bool), row_ptrs.shape)
  ptrs = row_ptrs[row_mask]
  # Compared, not differenced: a uint64 difference wraps a decrease.
  if (values.dtype not in _ADDABLE or ptrs.size == 0
      or (ptrs.size > 1 and not (ptrs[1:] > ptrs[:-1]).all())):
    return None
  shape = (programs,) + row_ptrs.shape
  every_lane = bool(row_mask.all())
  added = np.broadcast_to(values, shape)
  added = added.reshape(programs, -1) if every_lane else added[:, row_mask]
  memory = _interpreter.native_memory()
  on = np.ones(ptrs.shape, dtype=bool)
  sums = np.empty((programs + 1,) + ptrs.shape, dtype=values.dtype)
  sums[0] = memory.load(ptrs, on, np.zeros(ptrs.shape, values.dtype),
                        values.dtype)
  sums[1:] = added
  np.cumsum(sums, axis=0, dtype=values.dtype, out=sums)
  memory.store(ptrs, np.ascontiguousarray(sums[-1]), on)
  if every_lane:
    return sums[:-1].reshape(shape)
  old = np.zeros(shape, dtype=values.dtype)
  old[:, row_mask] = sums[:-1]
  return old


def _column(data, ndim: int):
  data = np.asarray(data)
  return data.reshape((_lead(data),) + (1,) * ndim)


def _tile_pointers(handle, offsets, checked_dims):
  """Pointers and mask of a tile per program; ``offsets`` per program."""
  base, ndim = handle.base, len(handle.block_shape)
  itemsize = max(1, base.get_element_ty().primitive_bitwidth // 8)
  ptrs = _column(base.data, ndim)
  mask = np.ones((1,) + tuple(handle.block_shape), dtype=bool)
  for dim, size in enumerate(handle.block_shape):
    # Lanes along block axis ``dim`` (axis ``dim + 1`` of the result).
    lanes = np.arange(size).reshape((size,) + (1,) * (ndim - dim - 1))
    off = _column(offsets[dim].data, ndim) + lanes
    stride = _column(handle.strides[dim].data, ndim)
    ptrs = ptrs + (itemsize * off * stride).astype(np.uint64)
    if dim in checked_dims:
      mask = mask & (0 <= off) & (off < _column(handle.shape[dim].data, ndim))
  ptrs, mask = np.broadcast_arrays(ptrs, mask)
  return (TensorHandle(np.ascontiguousarray(ptrs), base.dtype.scalar),
          TensorHandle(np.ascontiguousarray(mask), tl.int1))


def _descriptor_pointers(self, offsets):
  itemsize = max(1, self.base.dtype.element_ty.primitive_bitwidth // 8)
  if np.any((np.asarray(offsets[-1].data) * itemsize) % 16 != 0):
    # Upstream asserts; one program at a time raises its message.
    raise Unsupported("misaligned tensor descriptor offset")
  return _tile_pointers(self, offsets, range(len(self.block_shape)))


def _block_pointers(self, boundary_check):
  return _tile_pointers(self, self.offsets, tuple(boundary_check))


def _vectorised(handle, materialize):
  """``handle``, its ``materialize_pointers`` working per program."""
  handle.materialize_pointers = types.MethodType(materialize, handle)
  return handle
