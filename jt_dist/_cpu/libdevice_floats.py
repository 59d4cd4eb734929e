"""libdevice's float functions on the CPU, and its directed roundings.

Each function computes on float64 values (float32 operands widened
exactly) and is rounded to the return type once. The ``_rd``, ``_ru`` and
``_rz`` forms of the basic operations step that nearest result down, up or
toward zero where the exact result lies beyond it; error-free
transformations (Knuth's two-sum, Dekker's product) give the sign of the
exact result's excess over it.
"""

from __future__ import annotations

import math

import numpy as np


def _each(fn, refused=math.nan):
  """A Python ``math`` function over arrays (NumPy has no erf, gamma);
  ``refused(v)`` where ``math`` raises for C's inf or NaN cases."""
  def guarded(*values):
    try:
      return fn(*values)
    except (OverflowError, ValueError):
      return refused(*values) if callable(refused) else refused
  return np.vectorize(guarded, otypes=[np.float64])


_erf, _erfc = _each(math.erf), _each(math.erfc)
# math raises at lgamma's poles (+inf in C) and remainder's NaN cases.
_lgamma = _each(math.lgamma, math.inf)
_remainder = _each(math.remainder)


def _sinpi(x):
  """sin(pi x), exact at the multiples of 1/2, as CUDA's sinpi."""
  r = np.remainder(x, 2.0)
  out = np.sin(np.pi * r)
  out = np.where(r == 0.5, 1.0, np.where(r == 1.5, -1.0, out))
  return np.where(r % 1.0 == 0, np.copysign(0.0, x), out)


def _cospi(x):
  r = np.remainder(np.abs(x), 2.0)
  out = np.cos(np.pi * r)
  out = np.where(r == 0.0, 1.0, np.where(r == 1.0, -1.0, out))
  return np.where((r == 0.5) | (r == 1.5), 0.0, out)


def _tgamma(x):
  out = _each(math.gamma, lambda v: math.inf if v > 0 else math.nan)(x)
  # math.gamma raises at poles; C's tgamma is ±inf at ±0 and NaN below.
  return np.where(x == 0, np.copysign(np.inf, x),
                  np.where(np.isinf(x) & (x < 0), np.nan, out))


def _erfinv(y):
  """Inverse erf: Giles' single-precision start, then Newton in float64."""
  y = np.asarray(y, np.float64)
  w = -np.log(np.maximum((1.0 - y) * (1.0 + y), 1e-300))
  small = w - 2.5
  big = np.sqrt(np.maximum(w, 0)) - 3.0
  p = np.where(w < 5.0, 2.81022636e-08, -0.000200214257)
  for a, b in ((3.43273939e-07, 0.000100950558), (-3.5233877e-06, 0.00134934322),
               (-4.39150654e-06, -0.00367342844), (0.00021858087, 0.00573950773),
               (-0.00125372503, -0.0076224613), (-0.00417768164, 0.00943887047),
               (0.246640727, 1.00167406), (1.50140941, 2.83297682)):
    p = np.where(w < 5.0, a + p * small, b + p * big)
  x = p * y
  for _ in range(3):  # Newton on erf(x) - y; erf' = 2/sqrt(pi) exp(-x^2).
    step = (_erf(x) - y) / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
    x = np.where(np.isfinite(step), x - step, x)
  return np.where(np.abs(y) == 1, np.copysign(np.inf, y),
                  np.where(np.abs(y) > 1, np.nan, x))


def round_half_away(x):
  t = np.trunc(x)
  return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _logb(x):
  _, e = np.frexp(x)
  return np.where(x == 0, -np.inf, np.where(np.isfinite(x), e - 1.0,
                                            np.abs(x)))


def ilogb(x):
  _, e = np.frexp(x)
  return np.where(x == 0, -2**31, np.where(np.isnan(x), -2**31, np.where(
      np.isinf(x), 2**31 - 1, e - 1)))


def _saturate(x):
  # + 0.0 turns -0.0 into +0.0, as the GPU's saturatef gives it.
  return np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0) + 0.0)


def flush(x):
  """float32 subnormals as sign-preserving zeros: Triton links libdevice
  in its flush-to-zero mode (``enable_reflect_ftz``, on by default), whose
  float32 functions take and give no subnormals. Other dtypes as they are."""
  x = np.asarray(x)
  if x.dtype != np.float32:
    return x
  return np.where(np.abs(x) < np.finfo(np.float32).tiny, x * 0, x)


def nextafter_flushed(x, y):
  """``__nv_nextafterf`` in that mode, as an H200 computes it: a zero or
  subnormal ``x`` is 0, which steps to the smallest normal float toward a
  nonzero ``y``; a normal ``x`` steps as ``np.nextafter`` (into the
  subnormals too)."""
  x = flush(np.asarray(x, np.float32))
  y = np.asarray(y, np.float32)
  smallest = np.finfo(np.float32).tiny
  from_zero = (x == 0) & (y != 0) & ~np.isnan(y)
  return np.where(from_zero, np.copysign(smallest, y), np.nextafter(x, y))


def _fdim(x, y):
  return np.where(np.isnan(x) | np.isnan(y), np.nan, np.maximum(x - y, 0.0))


# Float functions on float64 values (float32 operands are widened first,
# and the result rounded to the return type once).
FLOAT = {
    "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin,
    "asinh": np.arcsinh, "atan": np.arctan, "atanh": np.arctanh,
    "cbrt": np.cbrt, "ceil": np.ceil, "cos": np.cos, "cosh": np.cosh,
    "cospi": _cospi, "sinpi": _sinpi,
    "cyl_bessel_i0": np.i0, "erf": _erf, "erfc": _erfc, "erfinv": _erfinv,
    "erfcinv": lambda y: _erfinv(1.0 - y),
    "erfcx": lambda x: np.exp(x * x) * _erfc(x), "exp": np.exp,
    "exp10": lambda x: np.power(10.0, x), "exp2": np.exp2, "expm1": np.expm1,
    "fabs": np.abs, "floor": np.floor, "lgamma": _lgamma, "tgamma": _tgamma,
    "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2,
    "logb": _logb, "nearbyint": np.rint, "rint": np.rint,
    "round": round_half_away, "trunc": np.trunc,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "rcbrt": lambda x: 1.0 / np.cbrt(x),
    "sqrt": np.sqrt, "sin": np.sin, "sinh": np.sinh, "tan": np.tan,
    "tanh": np.tanh, "normcdf": lambda x: 0.5 * _erfc(-x / math.sqrt(2.0)),
    "normcdfinv": lambda p: -math.sqrt(2.0) * _erfinv(1.0 - 2.0 * p),
    "saturate": _saturate, "rcp": lambda x: 1.0 / x,
    "atan2": np.arctan2, "copysign": np.copysign, "fdim": _fdim,
    "fmod": np.fmod, "hypot": np.hypot, "pow": np.power,
    "remainder": _remainder,
    "rhypot": lambda x, y: 1.0 / np.hypot(x, y),
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": np.divide, "fdivide": np.divide,
    "fma": lambda a, b, c: _fma(a, b, c),
    "norm3d": lambda a, b, c: np.sqrt(a * a + b * b + c * c),
    "rnorm3d": lambda a, b, c: 1.0 / np.sqrt(a * a + b * b + c * c),
    "norm4d": lambda a, b, c, d: np.sqrt(a * a + b * b + c * c + d * d),
    "rnorm4d": lambda a, b, c, d: 1.0 / np.sqrt(a * a + b * b + c * c + d * d),
}
# Names whose libdevice spelling differs from the table's.
ALIASES = {"fadd": "add", "dadd": "add", "fsub": "sub", "dsub": "sub",
            "fmul": "mul", "dmul": "mul", "fdiv": "div", "ddiv": "div",
            "fsqrt": "sqrt", "dsqrt": "sqrt", "frcp": "rcp", "drcp": "rcp",
            "frsqrt": "rsqrt", "saturatef": "saturate", "fdividef": "fdivide",
            "fmaf": "fma", "powf": "pow"}


def _two_sum(a, b):
  s = a + b
  v = s - a
  return s, (a - (s - v)) + (b - v)


def _two_product(a, b):
  """``a * b`` and its rounding error (Dekker's split, float64)."""
  p = a * b
  split = 134217729.0  # 2**27 + 1
  def halves(x):
    c = split * x
    hi = c - (c - x)
    return hi, x - hi
  ah, al = halves(a)
  bh, bl = halves(b)
  return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _fma(a, b, c):
  p, e = _two_product(a, b)
  s, t = _two_sum(p, c)
  return s + (t + e)


# The operations with directed-rounding forms (``fadd_rz``): ``excess``
# knows each one's exact error.
DIRECTED = frozenset(("add", "sub", "mul", "div", "rcp", "sqrt", "fma"))


def excess(name, args, r):
  """The sign of (exact result - r) for the operations in ``DIRECTED``."""
  a = args[0]
  if name == "add" or name == "sub":
    b = args[1] if name == "add" else -args[1]
    s, err = _two_sum(a, b)
    return np.sign((s - r) + err)
  if name == "mul":
    p, e = _two_product(a, args[1])
    return np.sign((p - r) + e)
  if name == "div":  # a - r * b, as an exact product's parts.
    p, e = _two_product(r, args[1])
    return np.sign(((a - p) - e) * np.sign(args[1]))
  if name == "rcp":
    p, e = _two_product(r, a)
    return np.sign(((1.0 - p) - e) * np.sign(a))
  if name == "sqrt":
    p, e = _two_product(r, r)
    return np.sign((a - p) - e)
  if name == "fma":
    p, e = _two_product(a, args[1])
    s, t = _two_sum(p, args[2])
    return np.sign((s - r) + (t + e))
  raise AssertionError(f"{name} has no directed-rounding form")



def directed(r, excess, mode: str):
  """``r``, rounded to the nearest, stepped as rounding ``mode`` wants it:
  down (``rd``), up (``ru``) or toward zero (``rz``) of the exact value."""
  if mode == "rd":
    step, toward = excess < 0, -np.inf
  elif mode == "ru":
    step, toward = excess > 0, np.inf
  else:
    step, toward = (excess != 0) & (np.sign(excess) != np.sign(r)), 0.0
  return np.where(step, np.nextafter(r, np.asarray(toward, r.dtype)), r)


def _exact_sign(x, r):
  """sign(x - r) of an integer ``x`` and its float rounding ``r``, exactly."""
  compare = np.frompyfunc(lambda a, b: (int(a) > int(b)) - (int(a) < int(b)),
                          2, 1)
  return compare(x, r).astype(np.float64)


def to_float(x, target, mode):
  """An integer or float64 ``x`` converted to ``target`` in rounding ``mode``."""
  r = np.asarray(x).astype(target)
  if mode in ("rn", ""):
    return r
  if np.issubdtype(np.asarray(x).dtype, np.floating):
    excess = np.sign(np.asarray(x, np.float64) - r.astype(np.float64))
  elif r.dtype == np.float64 or np.asarray(x).dtype.itemsize == 8:
    excess = _exact_sign(x, r)
  else:  # 32-bit integers are exact in float64.
    excess = np.sign(np.asarray(x, np.float64) - r.astype(np.float64))
  return directed(r, excess, mode)
