"""Reading an HSACO: the ELF header, the symbols and the kernel metadata.

Enough of the ELF format (and of the AMDGPU note's MessagePack) to check
that a code object is what an AMD GPU of a given arch loads, without LLVM.
Field offsets are those of the ELF-64 specification; the constants are
LLVM's (llvm/BinaryFormat/ELF.h).
"""

from __future__ import annotations

import dataclasses
import struct

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
ET_DYN = 3
EF_AMDGPU_MACH = 0x0FF
# EF_AMDGPU_MACH_AMDGCN_GFX*: the arch an object was built for.
MACH = {"gfx90a": 0x03F, "gfx942": 0x04C, "gfx950": 0x04F}
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11


@dataclasses.dataclass(frozen=True)
class Hsaco:
  """What a code object's header and symbol tables say."""

  elf_class: int
  little_endian: bool
  os_abi: int
  e_type: int
  machine: int
  flags: int
  symbols: frozenset[str]

  @property
  def mach(self) -> int:
    return self.flags & EF_AMDGPU_MACH


def _sections(data: bytes):
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
  for i in range(shnum):
    base = shoff + i * shentsize
    _, sh_type, _, _, offset, size, link = struct.unpack_from(
        "<IIQQQQI", data, base)
    yield sh_type, offset, size, link


def _symbol_names(data: bytes) -> frozenset[str]:
  sections = list(_sections(data))
  names = set()
  for sh_type, offset, size, link in sections:
    if sh_type not in (_SHT_SYMTAB, _SHT_DYNSYM):
      continue
    _, str_offset, _, _ = sections[link]
    for entry in range(offset, offset + size, 24):
      name_offset, = struct.unpack_from("<I", data, entry)
      end = data.index(b"\0", str_offset + name_offset)
      names.add(data[str_offset + name_offset:end].decode())
  names.discard("")
  return frozenset(names)


def parse(data: bytes) -> Hsaco:
  """The header fields and symbol names of an ELF-64 code object.

  Raises:
    ValueError: ``data`` is not a little-endian ELF-64 object.
  """
  if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    raise ValueError(f"not a little-endian ELF-64 object: {data[:8]!r}")
  e_type, machine = struct.unpack_from("<HH", data, 0x10)
  flags, = struct.unpack_from("<I", data, 0x30)
  return Hsaco(elf_class=data[4], little_endian=data[5] == 1,
               os_abi=data[7], e_type=e_type, machine=machine, flags=flags,
               symbols=_symbol_names(data))


def _msgpack_key(key: str) -> bytes:
  return bytes([0xA0 | len(key)]) + key.encode() if len(key) < 32 else (
      b"\xd9" + bytes([len(key)]) + key.encode())


def metadata_int(data: bytes, key: str) -> int:
  """An integer of the AMDGPU metadata note (first kernel), e.g. LDS size.

  Raises:
    ValueError: the key is absent or its value is not an unsigned int.
  """
  start = data.find(_msgpack_key(key))
  if start < 0:
    raise ValueError(f"no {key!r} in the code object's metadata note")
  pos = start + len(_msgpack_key(key))
  tag = data[pos]
  if tag <= 0x7F:
    return tag
  sizes = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}
  if tag not in sizes:
    raise ValueError(f"{key!r} holds MessagePack type 0x{tag:02x}, not a uint")
  return struct.unpack_from(sizes[tag], data, pos + 1)[0]
