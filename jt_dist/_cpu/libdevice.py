"""CUDA's libdevice on the CPU: each ``__nv_*`` function in NumPy.

Triton's code generator maps ``triton.language.extra.libdevice`` (stubs that
return None) to the target's libdevice, whose functions call
``extern_elementwise`` with a ``__nv_*`` symbol; the interpreter's builder
refuses those calls. Here each symbol computes in NumPy: float functions
(``libdevice_floats``) rounded as the symbol's name says, integer
functions and conversions as CUDA defines them. The GPU's own functions
may differ from the correctly rounded result by their documented ulps. A
symbol not here raises an error naming its function.
"""

from __future__ import annotations

import functools

import numpy as np
from triton.language.extra.cuda import libdevice as _cuda

from jt_dist._cpu import interpreter as _interpreter
from jt_dist._cpu import libdevice_floats as _floats


_INTEGER_ROUNDING = {"rn": np.rint, "rz": np.trunc, "rd": np.floor,
                     "ru": np.ceil, "round": _floats.round_half_away}


def _to_integer(x, target, mode):
  """``cvt``'s float-to-integer conversion: rounded, saturated, NaN to 0."""
  info = np.iinfo(target)
  r = _INTEGER_ROUNDING[mode](np.asarray(x, np.float64))
  r = np.where(np.isnan(r), 0.0, r)
  # float64 cannot hold int64's top: the ends are set apart from the cast.
  low, high = r <= float(info.min), r >= float(info.max)
  inside = np.where(low | high, 0.0, r).astype(target)
  return np.where(high, info.max, np.where(low, info.min, inside)).astype(
      target)


def _bits(x, unsigned):
  return np.asarray(x).view(unsigned)


def _clz32(u):
  _, e = np.frexp(u.astype(np.float64))  # exact for 32-bit values
  return (32 - e).astype(np.int32)


def _clz(x):
  u = np.asarray(x)
  if u.dtype.itemsize == 4:
    return _clz32(_bits(u, np.uint32))
  u = _bits(u, np.uint64)
  hi, lo = (u >> np.uint64(32)).astype(np.uint32), u.astype(np.uint32)
  return np.where(hi != 0, _clz32(hi), 32 + _clz32(lo)).astype(np.int32)


def _popc(x):
  u = np.ascontiguousarray(x)
  count = np.unpackbits(u.view(np.uint8)).reshape(*u.shape, -1).sum(-1)
  return count.astype(np.int32)


def _brev(x):
  u = np.ascontiguousarray(x)
  bits = np.unpackbits(u.view(np.uint8), bitorder="little")
  return np.packbits(bits.reshape(*u.shape, -1)[..., ::-1], axis=-1,
                     bitorder="little").view(u.dtype).reshape(u.shape)


def _ffs(x):
  u = np.asarray(x)
  width = 8 * u.dtype.itemsize
  lowest = u & -u  # the least set bit (two's complement)
  return np.where(u == 0, 0, width - _clz(lowest)).astype(np.int32)


def _high_product(x, y):
  """The high half of the full product of two integers of one width."""
  width = 8 * np.asarray(x).dtype.itemsize
  high = np.frompyfunc(lambda a, b: (int(a) * int(b)) >> width, 2, 1)
  wide = high(x, y)
  if width == 64:  # as the type's bits: e.g. -1 for a negative high half
    return wide.astype(object).astype(
        np.int64 if np.asarray(x).dtype.kind == "i" else np.uint64)
  return wide.astype(np.asarray(x).dtype)


def _mul24(x, y):
  """The low 32 bits of the product of the operands' low 24 bits."""
  signed = np.asarray(x).dtype.kind == "i"

  def low(v):
    v = np.asarray(v).astype(np.int64) & 0xFFFFFF
    return v - ((v & 0x800000) << 1) if signed else v
  return (low(x) * low(y)).astype(np.asarray(x).dtype)


def _halving(rounded):
  def add(x, y):
    kind = np.int64 if np.asarray(x).dtype.kind == "i" else np.uint64
    total = np.asarray(x).astype(kind) + np.asarray(y).astype(kind)
    return ((total + kind(rounded)) >> kind(1)).astype(np.asarray(x).dtype)
  return add


def _sad(x, y, z):
  wide = np.abs(np.asarray(x).astype(np.int64) - np.asarray(y).astype(np.int64))
  return (wide + np.asarray(z).astype(np.int64)).astype(np.asarray(z).dtype)


def _byte_perm(x, y, s):
  pool = np.stack([_bits(x, np.uint32), _bits(y, np.uint32)], -1)
  pool = np.ascontiguousarray(pool).view(np.uint8).reshape(*pool.shape[:-1], 8)
  out = np.zeros(np.shape(x), np.uint32)
  for i in range(4):
    pick = (_bits(s, np.uint32) >> np.uint32(4 * i)) & np.uint32(7)
    byte = np.take_along_axis(pool, pick[..., None].astype(np.intp), -1)[..., 0]
    out |= byte.astype(np.uint32) << np.uint32(8 * i)
  return out.view(np.asarray(x).dtype)


def _hi_lo(x, half):
  pair = np.ascontiguousarray(np.asarray(x, np.float64)).view(np.int32)
  return pair.reshape(*np.shape(x), 2)[..., half]


# Functions taking and giving values of the symbol's own types.
_OWN_TYPES = {
    "abs": np.abs, "llabs": np.abs, "clz": _clz, "clzll": _clz,
    "popc": _popc, "popcll": _popc, "brev": _brev, "brevll": _brev,
    "ffs": _ffs, "ffsll": _ffs, "mulhi": _high_product,
    "umulhi": _high_product, "mul64hi": _high_product,
    "umul64hi": _high_product, "mul24": _mul24, "umul24": _mul24,
    "hadd": _halving(0), "rhadd": _halving(1), "uhadd": _halving(0),
    "urhadd": _halving(1), "sad": _sad, "usad": _sad,
    "byte_perm": _byte_perm, "nextafter": np.nextafter,
    "nextafterf": _floats.nextafter_flushed,
    "isnand": np.isnan, "isnanf": np.isnan, "isinfd": np.isinf,
    "isinff": np.isinf, "isfinited": np.isfinite, "finitef": np.isfinite,
    "signbitd": np.signbit, "signbitf": np.signbit,
    "ilogb": _floats.ilogb, "ilogbf": _floats.ilogb,
    "powi": lambda x, n: np.power(np.asarray(x, np.float64), n),
    "powif": lambda x, n: np.power(np.asarray(x, np.float64), n),
    "ldexp": lambda x, n: np.ldexp(x, n), "ldexpf": lambda x, n: np.ldexp(x, n),
    "scalbn": lambda x, n: np.ldexp(x, n),
    "scalbnf": lambda x, n: np.ldexp(x, n),
    "double2hiint": lambda x: _hi_lo(x, 1),
    "double2loint": lambda x: _hi_lo(x, 0),
    "hiloint2double": lambda hi, lo: np.stack(
        [_bits(lo, np.int32), _bits(hi, np.int32)], -1).view(
            np.float64)[..., 0],
    "llrint": lambda x: _to_integer(x, np.int64, "rn"),
    "llrintf": lambda x: _to_integer(x, np.int64, "rn"),
    "llround": lambda x: _to_integer(x, np.int64, "round"),
    "llroundf": lambda x: _to_integer(x, np.int64, "round"),
}
# Conversions: "<from>2<to>_<mode>" and bit casts "<from>_as_<to>".
_KINDS = {"float": np.float32, "double": np.float64, "int": np.int32,
          "uint": np.uint32, "ll": np.int64, "ull": np.uint64,
          "longlong": np.int64}


def _conversion(name: str):
  """The function of a conversion's name (``float2int_rz``), or None."""
  if "_as_" in name:
    source, target = name.split("_as_")
    if source in _KINDS and target in _KINDS:
      return lambda x: np.ascontiguousarray(x).view(_KINDS[target])
    return None
  stem, _, mode = name.partition("_")
  source, _, target = stem.partition("2")
  if source not in _KINDS or target not in _KINDS or mode not in (
      "rn", "rz", "rd", "ru"):
    return None
  if np.issubdtype(_KINDS[target], np.integer):
    return lambda x: _to_integer(x, _KINDS[target], mode)
  return lambda x: _floats.to_float(x, _KINDS[target], mode)


def _float_function(name: str):
  """The computation of a float function's name (``fadd_rz``), or None."""
  base, mode = name, "rn"
  if name[-3:] in ("_rn", "_rz", "_rd", "_ru"):
    base, mode = name[:-3], name[-2:]
  base = base.removeprefix("fast_")
  base = _floats.ALIASES.get(base, base)
  if base not in _floats.FLOAT and base.endswith("f"):
    base = _floats.ALIASES.get(base[:-1], base[:-1])
  if base not in _floats.FLOAT or (mode != "rn"
                                   and base not in _floats.DIRECTED):
    return None
  fn = _floats.FLOAT[base]

  def compute(*args):
    target = np.result_type(*args)
    wide = [np.asarray(_floats.flush(a), np.float64) for a in args]
    with np.errstate(all="ignore"):
      r = np.asarray(fn(*wide)).astype(target)
      if mode != "rn":
        excess = _floats.excess(base, wide, r.astype(np.float64))
        r = _floats.directed(r, excess, mode)
      return _floats.flush(r)
  return compute


@functools.lru_cache(maxsize=None)  # Per symbol, not per call.
def _function(symbol: str):
  name = symbol.removeprefix("__nv_")
  if name in _OWN_TYPES:
    return _OWN_TYPES[name]
  return _conversion(name) or _float_function(name)


def _python_name(symbol: str) -> str:
  """The ``libdevice`` function that calls ``symbol`` (read on an error,
  from the module's text: within a launch its functions are wrappers)."""
  import inspect  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  text = inspect.getsource(_cuda)
  at = text.find(f'"{symbol}"')
  names = re.findall(r"^def (\w+)\(", text[:max(at, 0)], re.MULTILINE)
  return f"libdevice.{names[-1]}" if at >= 0 and names else "libdevice"


class LibdeviceUnsupported(NotImplementedError):
  """A libdevice function the CPU does not compute."""


def create_extern_elementwise(self, lib_name, lib_path, symbol, arg_list,
                              ret_type, is_pure):
  """The interpreter builder's ``create_extern_elementwise``, in NumPy."""
  del self, lib_name, lib_path, is_pure
  fn = _function(symbol)
  if fn is None:
    raise LibdeviceUnsupported(
        f"triton_call: {_python_name(symbol)} (CUDA's {symbol}) is not"
        " computed on the CPU. Write it with triton.language's functions"
        " (tl.math, tl.where, bit operations), or run the kernel on a GPU.")
  scalar = getattr(ret_type, "element_ty", ret_type)
  with np.errstate(all="ignore"):
    out = fn(*(np.asarray(a.data) for a in arg_list))
  data = np.asarray(out).astype(_interpreter.np_dtype(scalar))
  return _interpreter.TensorHandle(data, scalar)

