"""How a mesh's shards map to launches: one row per device.

Four devices are drawn (the docs' examples run on eight alike). Each row
shows the part of every operand that device holds, its launch, and what it
writes; the last column is the result the caller gets.
"""

from __future__ import annotations

from . import svg

_WIDTH = 700
_DEVICES = 4
_ROW = 58
_INPUTS = 92     # The operands' column.
_LAUNCH = 214    # The launches' column, this wide:
_LAUNCH_W = 204
_OUTPUT = 440    # What each launch writes.
_RESULT = 560    # The result.


def _vector(canvas, x, y, part, colour, w=64, h=10):
  """A 1-D array: its outline, and shard ``part`` of four filled."""
  canvas.rect(x, y, w, h, "outline", radius=2)
  canvas.rect(x + part * w / _DEVICES, y, w / _DEVICES, h, f"solid-{colour}",
              radius=1)


def _matrix(canvas, x, y, w, h, split, part, colour):
  """A 2-D array: ``split`` "rows" or "cols" fills shard ``part``; None
  fills it whole (the device holds all of it)."""
  canvas.rect(x, y, w, h, "outline", radius=2)
  if split == "rows":
    canvas.rect(x, y + part * h / _DEVICES, w, h / _DEVICES,
                f"solid-{colour}", radius=1)
  elif split == "cols":
    canvas.rect(x + part * w / _DEVICES, y, w / _DEVICES, h,
                f"solid-{colour}", radius=1)
  else:
    canvas.rect(x, y, w, h, "solid-grey", radius=1)


def _frame(name, title, code, headers):
  height = 72 + 17 * len(code) + _ROW * _DEVICES + 36
  canvas = svg.Canvas(name, _WIDTH, height, title)
  y = 16.0
  for line in code:
    canvas.text(14, y, line)
    y += 17
  y += 14
  for x, text in zip((_INPUTS, _LAUNCH, _OUTPUT, _RESULT), headers):
    canvas.text(x, y, text, "prose small muted")
  return canvas, y + 14


def _rows(canvas, top, draw_inputs, launch, draw_output):
  """Each device's row: its operands, its launch, what it writes; returns
  the right edge and middle of each row's output."""
  ends = []
  for d, colour in enumerate(svg.DEVICES):
    y = top + d * _ROW
    canvas.text(_INPUTS - 14, y + 25, f"device {d}", "prose muted", "end")
    draw_inputs(canvas, y, d, colour)
    label, sub = launch(d)
    box = canvas.box(_LAUNCH, y + 2, label, colour, sub=sub, w=_LAUNCH_W)
    canvas.edge(_LAUNCH - 16, box.cy, _LAUNCH - 2, box.cy, colour, bend="")
    canvas.edge(box.right + 2, box.cy, _OUTPUT - 4, box.cy, colour, bend="")
    ends.append(draw_output(canvas, y, d, colour))
  return ends


def sharded_call() -> str:
  canvas, top = _frame(
      "mesh-sharded-call",
      "sharded_triton_call over four devices: each device's launch reads its"
      " shards of x and y and writes its shard of the global output",
      ['sharded_triton_call(x, y, shard_size(0), kernel=add_kernel, mesh=mesh,',
       '    in_specs=(P("x"), P("x")), out_specs=P("x"),',
       '    out_shape=ShapeDtypeStruct((8192,), float32))   # global'],
      ["its shards of x, y", "one launch per device", "writes", "the result"])

  def inputs(canvas, y, d, colour):
    _vector(canvas, _INPUTS, y + 9, d, colour)
    _vector(canvas, _INPUTS, y + 25, d, colour)
    canvas.text(_INPUTS + 70, y + 18, "x", "small muted")
    canvas.text(_INPUTS + 70, y + 34, "y", "small muted")

  def output(canvas, y, d, colour):
    _vector(canvas, _OUTPUT, y + 16, d, colour, w=72)
    return _OUTPUT + 72, y + 21

  ends = _rows(canvas, top, inputs,
               lambda d: ("add_kernel(x, y, n, out)",
                          "n = shard_size(0) = 2048"), output)
  # The result: out, split over "x" as out_specs says, a row per shard.
  _split_result(canvas, top, ends, 16)
  _result_labels(canvas, top, "out: float32[8192]", 'split over "x"')
  return canvas.svg()


def _split_result(canvas, top, ends, w):
  """The result as one array whose shards are the rows' outputs."""
  h = _ROW * _DEVICES - 14
  canvas.rect(_RESULT + 24, top + 4, w, h, "outline", radius=2)
  for d, colour in enumerate(svg.DEVICES):
    canvas.rect(_RESULT + 24, top + 4 + d * h / 4, w, h / 4,
                f"solid-{colour}", radius=1)
    x, y = ends[d]
    canvas.edge(x + 3, y, _RESULT + 21, top + 4 + (d + .5) * h / 4, colour,
                bend="h")


def _result_labels(canvas, top, first, second):
  y = top + _ROW * _DEVICES + 8
  canvas.text(_WIDTH - 12, y, first, "small", "end")
  canvas.text(_WIDTH - 12, y + 15, second, "prose small muted", "end")


def out_reduce() -> str:
  canvas, top = _frame(
      "mesh-out-reduce",
      "out_reduce: each device multiplies its slice of A's columns by its"
      " slice of B's rows; the partial products are summed over mesh axis k"
      " inside the call, and every device gets the whole C",
      ['sharded_triton_call(a, b, M, N, K, kernel=matmul_kernel, mesh=mesh,',
       '    in_specs=(P(None, "k"), P("k", None)), out_specs=P(),',
       '    out_reduce=("sum", "k"))        # one psum, inside the call'],
      ["its shards of A, B", "one launch per device", "a partial C",
       "the result"])

  def inputs(canvas, y, d, colour):
    _matrix(canvas, _INPUTS, y + 8, 44, 30, "cols", d, colour)
    _matrix(canvas, _INPUTS + 56, y + 4, 30, 38, "rows", d, colour)

  def output(canvas, y, d, colour):
    canvas.rect(_OUTPUT, y + 8, 32, 30, f"box-{colour}", radius=2)
    canvas.text(_OUTPUT + 16, y + 27, "+", "muted", "middle")
    return _OUTPUT + 32, y + 23

  ends = _rows(canvas, top, inputs,
               lambda d: (f"A[:, k{d}] @ B[k{d}, :]",
                          "K = shard_size(0, axis=1)"), output)
  psum = canvas.box(_OUTPUT + 52, top + 4, "psum", "grey", sub='over "k"',
                    w=66, h=_ROW * _DEVICES - 14)
  for d, colour in enumerate(svg.DEVICES):
    x, y = ends[d]
    canvas.edge(x + 2, y, psum.x - 2, y, colour, bend="")
    _matrix(canvas, _RESULT + 24, y - 15, 36, 30, None, d, colour)
    canvas.edge(psum.right + 2, y, _RESULT + 21, y, "grey", bend="")
  _result_labels(canvas, top, "C: float32[M, N]", "whole, on every device")
  return canvas.svg()


def sharding_rule() -> str:
  canvas, top = _frame(
      "mesh-sharding-rule",
      "A sharding rule under plain jax.jit: A's rows are split over mesh"
      " axis x, so factor i is split; each device multiplies its rows of A"
      " by the whole B, and C comes back split by rows with no collective",
      ['rule = ShardingRule("i k, k j -> i j", reductions={"k": "sum"})',
       'jax.jit(matmul)(a, b)   # a: P("x", None), b: P(); no shard_map',
       '# factor i <- mesh axis "x", from the first operand that splits it'],
      ["its shards of A, B", "one launch per device", "its rows of C",
       "the result"])

  def inputs(canvas, y, d, colour):
    _matrix(canvas, _INPUTS, y + 6, 44, 34, "rows", d, colour)
    _matrix(canvas, _INPUTS + 56, y + 6, 34, 34, None, d, colour)

  def output(canvas, y, d, colour):
    _matrix(canvas, _OUTPUT, y + 6, 40, 34, "rows", d, colour)
    return _OUTPUT + 40, y + 6 + (d + .5) * 34 / 4

  ends = _rows(canvas, top, inputs,
               lambda d: (f"A[i{d}, :] @ B", "M = shard_size(0, axis=0)"),
               output)
  _split_result(canvas, top, ends, 44)
  _result_labels(canvas, top, "C: float32[M@x, N]", "split by rows; no collective")
  return canvas.svg()
