"""An autotuning config's ``pre_hook``, run on stand-ins for the arguments.

Triton calls a config's ``pre_hook`` with every named argument before it
launches that config. jt_dist calls it once per config as the call is
bound, on stand-ins that record what it does, and honours what JAX can:

* setting a ``TensorDescriptor``'s ``block_shape`` retypes that descriptor
  for this config's launch (Triton's tutorials size descriptors so);
* zeroing an output (``zero_()``, ``fill_(0)``) makes it a zeroed output,
  as ``zeroed_outputs`` does; an input aliased to an output zeroes that
  output.

Reading shapes, dtypes, strides and the other arguments works. Anything
else raises ``NotImplementedError`` naming the hook and what it tried.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from jt_dist import _compat
from jt_dist import _errors


class _Record:
  """What one hook did, by parameter name."""

  def __init__(self, hook: Any, kernel: str):
    self.hook, self.kernel = hook, kernel
    self.zeroed: dict[str, int] = {}
    self.blocks: dict[str, tuple[int, ...]] = {}

  def refuse(self, tried: str, fix: str = ""):
    name = getattr(self.hook, "__qualname__", None) or repr(self.hook)
    if (code := getattr(self.hook, "__code__", None)) is not None:
      name += f" ({code.co_filename}:{code.co_firstlineno})"
    raise NotImplementedError(
        f"triton_call: the pre_hook {name} of an autotuning config of kernel"
        f" {self.kernel!r} {tried}, which jt_dist cannot do to a JAX array."
        " A pre_hook may set a TensorDescriptor's block_shape, zero an"
        " output (zero_(), as zeroed_outputs=[...] does) and read shapes,"
        f" dtypes and the other arguments.{fix}")


class ArrayStandIn:
  """An array argument as a pre_hook sees it: shape and dtype, and zero_()."""

  __slots__ = ("_name", "_shape", "_dtype", "_output", "_record")

  def __init__(self, name, shape, dtype, output, record):
    for slot, value in zip(self.__slots__,
                           (name, tuple(shape), dtype, output, record)):
      object.__setattr__(self, slot, value)

  shape = property(lambda self: self._shape)
  dtype = property(lambda self: self._dtype)
  ndim = property(lambda self: len(self._shape))

  def dim(self) -> int:
    return len(self._shape)

  def numel(self) -> int:
    return math.prod(self._shape)

  def size(self, dim: int | None = None):
    return self._shape if dim is None else self._shape[dim]

  def stride(self, dim: int | None = None):
    strides = tuple(math.prod(self._shape[k + 1:])
                    for k in range(len(self._shape)))
    return strides if dim is None else strides[dim]

  def element_size(self) -> int:
    return self._dtype.itemsize

  def zero_(self) -> "ArrayStandIn":
    if self._output is None:
      self._record.refuse(
          f"zeroed {self._name!r}, an input", " Alias the input to an output"
          " (input_output_aliases) so that the output is zeroed.")
    self._record.zeroed[self._name] = self._output
    return self

  def fill_(self, value: Any) -> "ArrayStandIn":
    if value != 0:
      self._record.refuse(f"filled {self._name!r} with {value!r}")
    return self.zero_()

  def __getattr__(self, attr: str):
    self._record.refuse(f"used {self._name}.{attr}")

  def __setattr__(self, attr: str, value: Any) -> None:
    self._record.refuse(f"set {self._name}.{attr} = {value!r}",
                        " (block_shape is set on a TensorDescriptor only:"
                        " pass the array as one, or declare the output in"
                        " out_shape as jt_dist.TensorDescriptor(...).)"
                        if attr == "block_shape" else "")

  def __setitem__(self, index: Any, value: Any) -> None:
    self._record.refuse(f"wrote {self._name}[{index!r}] = {value!r}")

  def __repr__(self) -> str:
    return f"<{self._name}: {self._dtype}{list(self._shape)}>"


def _descriptor_stand_in(name: str, info: Any, base: ArrayStandIn,
                         record: _Record):
  """A ``triton.tools`` ``TensorDescriptor`` (so ``isinstance`` holds) that
  records a new ``block_shape`` and refuses other changes."""
  triton_class = _compat.tensor_descriptor_class()

  class DescriptorStandIn(triton_class):  # pylint: disable=missing-class-docstring
    __hash__ = object.__hash__

    def __setattr__(self, attr, value):
      if attr != "block_shape":
        record.refuse(f"set {name}.{attr} = {value!r}")
      record.blocks[name] = _block_shape(value, info, name, record)
      object.__setattr__(self, attr, value)

  stand_in = object.__new__(DescriptorStandIn)
  fields = {"base": base, "shape": list(info.shape),
            "strides": list(info.strides),
            "block_shape": list(info.block_shape), "padding": info.padding,
            "round_f32_to_tf32": info.round_f32_to_tf32}
  for field in dataclasses.fields(triton_class):
    object.__setattr__(stand_in, field.name, fields.get(field.name))
  return stand_in


def _block_shape(value, info, name, record) -> tuple[int, ...]:
  try:
    block = tuple(int(v) for v in value)
  except (TypeError, ValueError):
    block = None
  if (block is None or len(block) != len(info.shape)
      or any(b <= 0 or b & (b - 1) for b in block)):
    record.refuse(
        f"set {name}.block_shape = {value!r}",
        f" A block_shape holds {len(info.shape)} powers of two, one per"
        " dimension of the descriptor.")
  return block


def _stand_ins(named, operands, aliases, record):
  """A stand-in for each array, output and descriptor operand, by name."""
  aliased = dict(aliases)
  found = {}
  for op in operands:
    if op.kind == "scalar" or op.path:
      continue
    output = op.index if op.kind == "output" else aliased.get(op.index)
    struct = named[op.name]  # A jax.ShapeDtypeStruct.
    stand_in = ArrayStandIn(op.name, struct.shape, struct.dtype, output,
                            record)
    if op.type.startswith("tensordesc"):
      stand_in = _descriptor_stand_in(op.name, op.value, stand_in, record)
    found[op.name] = stand_in
  return found


def run(info, config, named: Mapping[str, Any], operands, aliases):
  """``(operands as the hook retyped them or None, zeroed output indices)``
  for ``config``, a ``kernel.Config``; (None, ()) without a pre_hook."""
  hook = getattr(config.tuned, "pre_hook", None)
  if hook is None:
    return None, ()
  record = _Record(hook, info.name)
  options = {"num_warps": config.num_warps, "num_ctas": config.num_ctas,
             "num_stages": config.num_stages, "maxnreg": config.maxnreg}
  nargs = {**named, **_stand_ins(named, operands, aliases, record),
           **{k: v for k, v in options.items() if v is not None}}
  _errors.call_user(hook, f"the pre_hook of kernel {info.name!r}", nargs)
  retyped = None
  if record.blocks:
    retyped = tuple(
        dataclasses.replace(op, type=new.triton_type, value=new)
        if (new := _retyped(op, record.blocks)) is not None else op
        for op in operands)
  return retyped, tuple(sorted(set(record.zeroed.values())))


def _retyped(op, blocks):
  if op.name not in blocks or op.path or not op.type.startswith("tensordesc"):
    return None
  return dataclasses.replace(op.value, block_shape=blocks[op.name])
