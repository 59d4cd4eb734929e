"""Subnormal floats inside a CPU launch, kept as GPUs keep them.

XLA's CPU runtime runs a computation with the thread set to flush
subnormal values to zero (FTZ and DAZ on x86, FZ on Arm), and a launch runs
inside that computation. Compiled Triton keeps subnormals in its float32
and float64 arithmetic (PTX's ``mul.f32`` has no ``.ftz``): ``x * y`` of a
subnormal ``x`` is subnormal on an H200, and would be 0 here. So a launch
sets the thread's floating-point environment to C's default (IEEE
subnormals, round to nearest, exceptions masked) and restores the one it
found. On a C library without ``fesetenv`` (Windows), nothing is changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys

_ENV_BYTES = 64  # At least sizeof(fenv_t) on every C library above.


@functools.lru_cache(maxsize=None)
def _functions():
  """``(fegetenv, fesetenv, FE_DFL_ENV)``, or None where there are none."""
  try:
    if sys.platform.startswith("linux"):
      lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
      default = ctypes.c_void_p(-1)  # glibc's and musl's FE_DFL_ENV.
    elif sys.platform == "darwin":
      lib = ctypes.CDLL(ctypes.util.find_library("System"))
      default = ctypes.c_void_p(ctypes.addressof(
          ctypes.c_char.in_dll(lib, "_FE_DFL_ENV")))
    else:
      return None
    get, put = lib.fegetenv, lib.fesetenv
  except (OSError, AttributeError, ValueError):
    return None
  get.argtypes = put.argtypes = [ctypes.c_void_p]
  get.restype = put.restype = ctypes.c_int
  return get, put, default


@contextlib.contextmanager
def ieee_subnormals():
  """The calling thread computes with subnormals while the block runs."""
  functions = _functions()
  saved = ctypes.create_string_buffer(_ENV_BYTES)
  if functions is None or functions[0](saved) != 0:
    yield
    return
  functions[1](functions[2])
  try:
    yield
  finally:
    functions[1](saved)
