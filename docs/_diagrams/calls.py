"""The path of an eager call and of a call inside ``jax.jit``, and where
each cache sits on it (jt_dist/_call/api.py, kernel_call.py, memo.py and
jt_dist/_backend/cache.py). The caches sit in the middle column."""

from __future__ import annotations

from . import svg

_WIDTH = 700
_W = 200
_EAGER, _CACHES, _JITTED = 14, 250, 486  # The columns' left edges.
_ROWS = (44, 108, 172, 244, 326, 398)


def _step(canvas, x, row, label, sub, colour="blue", mono=False):
  return canvas.box(x, _ROWS[row], label, colour, sub=sub, w=_W, mono=mono,
                    sub_mono=False)


def _cache(canvas, row, label, sub):
  return canvas.box(_CACHES, _ROWS[row], label, "gold", sub=sub, w=_W,
                    mono=False, dashed=True)


def _both_ways(canvas, left: svg.Box, right: svg.Box) -> None:
  """A lookup: an arrow there and one back."""
  canvas.edge(left.right + 2, left.cy - 5, right.x - 2, right.cy - 5, "gold",
              bend="")
  canvas.edge(right.x - 2, right.cy + 5, left.right + 2, left.cy + 5, "gold",
              bend="")


def _down(canvas, upper: svg.Box, lower: svg.Box, note: str = "") -> None:
  canvas.edge(upper.cx, upper.bottom + 1, lower.cx, lower.y - 2, "grey")
  if note:
    canvas.text(upper.cx + 8, (upper.bottom + lower.y) / 2 + 4, note,
                "prose small muted")


def eager_and_jitted() -> str:
  canvas = svg.Canvas(
      "calls", _WIDTH, 456,
      "The path of an eager triton_call and of one inside jax.jit, with the"
      " caches each passes: the eager memo of KernelCalls, jax.jit's"
      " compiled executables, and the compiled kernels in memory and on disk")
  canvas.text(_EAGER, 20, "An eager call", "prose heading")
  canvas.text(_CACHES, 20, "Caches", "prose heading")
  canvas.text(_JITTED, 20, "A call inside jax.jit", "prose heading")

  call = _step(canvas, _EAGER, 0, "triton_call(x, …)", "each call", mono=True)
  find = _step(canvas, _EAGER, 1, "find its KernelCall",
               "by the call's static parts")
  jitted = _step(canvas, _EAGER, 2, "its jax.jit function",
                 "jax's C++ dispatch")
  trace = _step(canvas, _EAGER, 3, "trace the call",
                "bind, check placement")
  _down(canvas, call, find)
  _down(canvas, find, jitted)
  _down(canvas, jitted, trace, "a new signature")

  held = _step(canvas, _CACHES, 0, "kernel_call(…)(x)",
               "a KernelCall you hold", colour="purple", mono=True)
  # It skips the memo: straight to its jax.jit function.
  x = (jitted.right + _CACHES) / 2
  end = jitted.right - 40
  canvas.path(
      f"M{held.x - 1},{held.cy} L{x + 6},{held.cy} Q{x},{held.cy}"
      f" {x},{held.cy + 6} L{x},{jitted.y - 18} Q{x},{jitted.y - 12}"
      f" {x - 6},{jitted.y - 12} L{end + 6},{jitted.y - 12}"
      f" Q{end},{jitted.y - 12} {end},{jitted.y - 6} L{end},{jitted.y - 2}",
      "purple")
  memo = _cache(canvas, 1, "triton_call's memo",
                "KernelCalls; dispatch_entries")
  executables = _cache(canvas, 2, "jax.jit's executables",
                       "by shapes, dtypes, shardings")
  _both_ways(canvas, find, memo)
  _both_ways(canvas, jitted, executables)

  outer = _step(canvas, _JITTED, 2, "jax.jit(f)(x)", "each call", mono=True)
  canvas.edge(outer.x - 2, outer.cy - 5, executables.right + 2,
              executables.cy - 5, "gold", bend="")
  canvas.edge(executables.right + 2, executables.cy + 5, outer.x - 2,
              outer.cy + 5, "gold", bend="")
  for k, line in enumerate(("Later calls of f are jax.jit's own",
                            "dispatch: no jt_dist code runs.")):
    canvas.text(_JITTED, _ROWS[1] + 12 + 15 * k, line, "prose small muted")
  inner = _step(canvas, _JITTED, 3, "trace f", "triton_call binds in f's trace")
  _down(canvas, outer, inner, "a new signature")

  lower = _step(canvas, _CACHES, 4, "lower the kernel",
                "on a GPU, Triton compiles it")
  kernels = canvas.box(_JITTED, _ROWS[4], "compiled kernels", "gold",
                       sub="in memory, then on disk", w=_W, mono=False,
                       dashed=True)
  _both_ways(canvas, lower, kernels)
  run = _step(canvas, _CACHES, 5, "XLA compiles, and it runs",
              "kept in jax.jit's executables")
  canvas.edge(trace.cx, trace.bottom + 1, lower.x + 40, lower.y - 2, "grey")
  canvas.edge(inner.cx, inner.bottom + 1, lower.right - 40, lower.y - 2,
              "grey")
  _down(canvas, lower, run)
  return canvas.svg()
