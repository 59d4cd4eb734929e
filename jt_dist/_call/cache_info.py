"""``jt_dist.cache_info``: what this process compiled, reused and keeps.

Counted where the work happens, never per eager dispatch.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

from jt_dist._autotune import store as _autotune_store
from jt_dist._backend import cache as _cache
from jt_dist._call import memo as _memo


class CacheInfo(NamedTuple):
  """What jt_dist compiled, reused and keeps in this process.

  Counts since the process started (they only grow), and the sizes of the
  caches now. Compare two snapshots to see what a call did: a call that
  compiles nothing leaves ``lowerings`` and ``compiles`` as they were, and
  an eager call served by its memo leaves ``triton_call_entries`` too.

  Attributes:
    triton_call_entries: call signatures ``triton_call`` keeps now
      (its memo, bounded by ``configure_cache(dispatch_entries=...)``).
    sharded_call_entries: the same for ``sharded_triton_call``.
    lowerings: kernel calls lowered into a JAX computation: once per call
      in each new computation JAX compiles (a new function, new shapes, a
      new value compiled in), on every platform; never per run.
    compiles: kernels compiled by Triton (for a GPU; the CPU interprets).
    memory_hits: compiled kernels found in the in-memory cache.
    disk_hits: compiled kernels read back from the disk cache.
    disk_writes: compiled kernels written to the disk cache.
    memory_cache_entries: compiled kernels the in-memory cache keeps now
      (bounded by ``configure_cache(memory_entries=...)``).
  """

  triton_call_entries: int
  sharded_call_entries: int
  lowerings: int
  compiles: int
  memory_hits: int
  disk_hits: int
  disk_writes: int
  memory_cache_entries: int


def cache_info() -> CacheInfo:
  """What jt_dist compiled, reused and keeps in this process.

  Like ``functools.lru_cache``'s ``cache_info()``: cheap to ask, and meant
  to be compared before and after the calls in question.

  Returns:
    A ``CacheInfo``.
  """
  return CacheInfo(
      triton_call_entries=len(_memo.triton_calls),
      sharded_call_entries=len(_memo.sharded_calls),
      memory_cache_entries=len(_cache.memory_cache),
      **{name: _cache.counted(name) for name in (
          "lowerings", "compiles", "memory_hits", "disk_hits", "disk_writes")})


def clear_memory_caches() -> None:
  """Forgets what this process keeps in memory; the disk cache stays.

  The compiled kernels, the autotuning choices, the front doors' memos and
  JAX's compiled functions: what a new process would find.
  """
  jax.clear_caches()
  _cache.memory_cache.clear()
  _autotune_store.forget_in_memory(None)
  _memo.triton_calls.clear()
  _memo.sharded_calls.clear()
