"""Adding machine code to jaxlib's serialised Triton kernel calls.

jaxlib 0.11.1+ loads a ``TritonKernel``'s ``module_image`` (a CUBIN) instead
of assembling the PTX (~0.16 s per kernel on an H200), but its bindings
cannot set it: a fragment is appended on the wire (protobuf merges singular
message fields). Field numbers: ``jaxlib/gpu/triton.proto``.
"""

from __future__ import annotations

from typing import NamedTuple

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_FIXED_SIZES = {_I64: 8, _I32: 4}

# TritonAnyKernelCall
_ANY_KERNEL_CALL = 1
_ANY_AUTOTUNED_CALL = 2
# TritonAutotunedKernelCall, and its Config
_AUTOTUNED_CONFIGS = 2
_CONFIG_KERNEL_CALL = 1
# TritonKernelCall, TritonKernel, ModuleImageProto
_CALL_KERNEL = 1
_KERNEL_MODULE_IMAGE = 11
_IMAGE_OBJECT_FILE = 1
_IMAGE_KERNEL_NAME = 2
_IMAGE_SHARED_MEM = 3


class ModuleImage(NamedTuple):
  """One kernel's machine code, as jaxlib's ``ModuleImageProto`` holds it."""

  kernel_name: str
  shared_mem_bytes: int
  object_file: bytes


class Field(NamedTuple):
  """One field of a serialised message; ``raw`` includes the tag."""

  number: int
  wire_type: int
  payload: bytes
  raw: bytes

  def value(self) -> int | bytes:
    """The field's integer for a varint, its payload bytes otherwise."""
    if self.wire_type == _VARINT:
      return _decode_varint(self.payload, 0)[0]
    return self.payload


def encode_varint(value: int) -> bytes:
  if value < 0:
    raise ValueError(f"varint {value} is negative")
  out = bytearray()
  while value > 0x7F:
    out.append(value & 0x7F | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
  value, shift = 0, 0
  while True:
    if pos >= len(buf) or shift > 63:
      raise ValueError("truncated or overlong varint in serialised proto")
    byte = buf[pos]
    pos += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, pos


def parse_fields(buf: bytes) -> list[Field]:
  """Splits a serialised message into its fields; ValueError if malformed."""
  fields, pos = [], 0
  while pos < len(buf):
    start = pos
    tag, pos = _decode_varint(buf, pos)
    number, wire_type = tag >> 3, tag & 7
    if wire_type == _VARINT:
      _, end = _decode_varint(buf, pos)
      payload_start = pos
    elif wire_type == _LEN:
      size, payload_start = _decode_varint(buf, pos)
      end = payload_start + size
    elif wire_type in _FIXED_SIZES:
      payload_start, end = pos, pos + _FIXED_SIZES[wire_type]
    else:
      raise ValueError(f"unsupported wire type {wire_type} (field {number})")
    if number == 0 or end > len(buf):
      raise ValueError(f"malformed field {number} at byte {start}")
    fields.append(Field(number, wire_type, buf[payload_start:end],
                        buf[start:end]))
    pos = end
  return fields


def length_delimited(number: int, payload: bytes) -> bytes:
  """A length-delimited field: a message, bytes or a string."""
  return (encode_varint(number << 3 | _LEN) + encode_varint(len(payload))
          + payload)


def _image_fragment(image: ModuleImage) -> bytes:
  """A ``TritonKernelCall`` fragment that sets ``kernel.module_image``."""
  message = (
      length_delimited(_IMAGE_OBJECT_FILE, image.object_file)
      + length_delimited(_IMAGE_KERNEL_NAME, image.kernel_name.encode())
      + encode_varint(_IMAGE_SHARED_MEM << 3 | _VARINT)
      + encode_varint(image.shared_mem_bytes))
  return length_delimited(
      _CALL_KERNEL, length_delimited(_KERNEL_MODULE_IMAGE, message))


def _with_config_images(autotuned: bytes, images: list[ModuleImage]) -> bytes:
  fields = parse_fields(autotuned)
  configs = [f.number == _AUTOTUNED_CONFIGS and f.wire_type == _LEN
             for f in fields]
  if sum(configs) != len(images):
    raise ValueError(
        f"the autotuned call has {sum(configs)} configs, but"
        f" {len(images)} module images were given")
  remaining = iter(images)
  return b"".join(
      length_delimited(_AUTOTUNED_CONFIGS, field.payload + length_delimited(
          _CONFIG_KERNEL_CALL, _image_fragment(next(remaining))))
      if config else field.raw
      for field, config in zip(fields, configs))


def with_module_images(serialized: bytes, images: list[ModuleImage]) -> bytes:
  """``serialized`` with each kernel's image (in config order)."""
  out, patched = [], False
  for field in parse_fields(serialized):
    if field.number == _ANY_KERNEL_CALL and field.wire_type == _LEN:
      if len(images) != 1:
        raise ValueError(f"a single kernel call takes 1 image, not {len(images)}")
      out.append(length_delimited(
          _ANY_KERNEL_CALL, field.payload + _image_fragment(images[0])))
      patched = True
    elif field.number == _ANY_AUTOTUNED_CALL and field.wire_type == _LEN:
      out.append(length_delimited(
          _ANY_AUTOTUNED_CALL, _with_config_images(field.payload, images)))
      patched = True
    else:
      out.append(field.raw)
  if not patched:
    raise ValueError("the bytes hold no Triton kernel call")
  return b"".join(out)
