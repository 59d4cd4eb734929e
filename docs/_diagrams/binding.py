"""How a call's arguments bind its kernel's parameters, under each convention.

Each panel is a call from the docs (the README's Quickstart, the operands
page, the porting page's layer norm) and the parameters it binds, as
``jt_dist._core`` binds them (arguments.py, binding.py, outputs.py and
wrapper.py). The colours say what binds a parameter.
"""

from __future__ import annotations

from typing import Sequence

from . import svg

# The kernels drawn, with their parameters as the docs declare them (the
# last is a tl.constexpr); tests/diagrams_test.py compares them.
KERNELS = {
    "add_kernel": ("x_ptr", "y_ptr", "n", "out_ptr", "BLOCK"),  # README
    "mul_add": ("xy", "z_ptr", "out_ptr", "n", "BLOCK"),  # operands page
    "_layer_norm_fwd_fused": ("X", "Y", "W", "B", "Mean", "Rstd", "stride",
                              "N", "eps", "BLOCK_SIZE"),  # porting page
}

# What binds a parameter, by colour, as the legend says.
LEGEND = (("blue", "an array"), ("green", "a scalar, by value"),
          ("orange", "an output"), ("purple", "by name, compiled in"))

_WIDTH = 700
_LEFT = 70  # Row labels end left of this.
_GAP = 8


def _row(canvas: svg.Canvas, y: float, label: str,
         items: Sequence[tuple[str, str]], widths: Sequence[float],
         span: float) -> list[svg.Box]:
  """Boxes for ``(text, colour)`` items of ``widths``, centred in ``span``."""
  gap = min(24, max(_GAP, (span - sum(widths)) / max(1, len(items) - 1)))
  x = _LEFT + (span - sum(widths) - gap * (len(items) - 1)) / 2
  canvas.text(_LEFT - 10, y + 16, label, "prose muted", "end")
  boxes = []
  for (text, colour), w in zip(items, widths):
    boxes.append(canvas.box(x, y, text, colour, w=w))
    x += w + gap
  return boxes


def _widths(rows) -> list[list[float]]:
  """Each row's box widths: rows joined straight down share their columns'."""
  own = [[svg.text_width(t) + 14 for t, _ in items] for _, items, _ in rows]
  shared = [max(w) for w in zip(*[own[k] for k, row in enumerate(rows)
                                  if row[2]])]
  return [shared if row[2] else own[k] for k, row in enumerate(rows)]


def _link(canvas, upper, lower, pairs, colours):
  for (i, j), colour in zip(pairs, colours):
    canvas.edge(upper[i].cx, upper[i].bottom + 1, lower[j].cx, lower[j].y - 2,
                colour)


def _legend(canvas: svg.Canvas, y: float) -> None:
  x = _LEFT
  canvas.text(_LEFT - 12, y + 10, "bound by", "prose muted", "end")
  for colour, what in LEGEND:
    canvas.rect(x, y, 14, 14, f"box-{colour}", radius=3)
    canvas.text(x + 20, y + 11, what, "prose")
    x += 34 + svg.text_width(what, svg.PROSE, mono=False)


def _panel(canvas, y, heading, code, rows, links, brackets):
  """A heading, code lines, rows ``(label, items, aligned)`` of boxes
  joined by ``links`` (one list of ``(upper index, lower index, colour)``
  per pair of rows; aligned rows share their columns), and
  ``brackets`` ``(first, last, label)`` under the last row."""
  canvas.text(14, y + 14, heading, "prose heading")
  y += 24
  for line in code:
    canvas.text(_LEFT, y + 12, line)
    y += 17
  y += 14
  span = _WIDTH - _LEFT - 14
  placed = []
  for (label, items, _), widths in zip(rows, _widths(rows)):
    placed.append(_row(canvas, y, label, items, widths, span))
    y += 24 + 46
  y -= 46
  for upper, lower, pairs in zip(placed, placed[1:], links):
    _link(canvas, upper, lower, [(i, j) for i, j, _ in pairs],
          [c for _, _, c in pairs])
  last = placed[-1]
  for first, end, label in brackets:
    canvas.bracket(last[first].x, last[end].right, y + 8, label)
  return y + 30


def _signature(kernel: str, annotate: bool = True) -> str:
  *params, last = KERNELS[kernel]
  last += ": tl.constexpr" if annotate else ""
  return f"def {kernel}({', '.join([*params, last])}): …"


def _params(kernel: str, colours: Sequence[str]):
  return list(zip(KERNELS[kernel], colours))


def _straight(colours):
  return [(i, i, c) for i, c in enumerate(colours)]


def positional(canvas: svg.Canvas, y: float) -> float:
  colours = ["blue", "blue", "green", "orange", "purple"]
  return _panel(
      canvas, y, "jax-triton 0.3.1's form: inputs, then outputs, then names",
      [_signature("add_kernel"),
       "triton_call(x, y, x.size, kernel=add_kernel,",
       "            out_shape=…, grid=…, BLOCK=1024)"],
      [("call", list(zip(["x", "y", "x.size", "out[0]", "BLOCK=1024"],
                         colours)), True),
       ("kernel", _params("add_kernel", colours), True)],
      [_straight(colours)],
      [(0, 2, "positional arguments, in order"),
       (3, 3, "one per output"), (4, 4, "metaparams")])


def keywords(canvas: svg.Canvas, y: float) -> float:
  colours = ["blue", "blue", "orange", "purple", "purple"]
  return _panel(
      canvas, y, "jax-triton 0.4's keywords: operands by name, outputs left over",
      [_signature("mul_add"),
       "triton_call((x, x), z_ptr=x, kernel=mul_add,",
       "            out_shape=…, grid=…, n=x.size, BLOCK=256)"],
      [("call", list(zip(["(x, x)", "z_ptr=x", "out[0]", "n=x.size",
                          "BLOCK=256"], colours)), True),
       ("kernel", _params("mul_add", colours), True)],
      [_straight(colours)],
      [(0, 1, "by position or keyword"),
       (2, 2, "left over"), (3, 4, "after an output: by name")])


def outputs_anywhere(canvas: svg.Canvas, y: float) -> float:
  call = [("x", "blue"), ("W=w", "blue"), ("B=b", "blue"),
          ("stride=N", "green"), ("N=N", "green"), ("eps=eps", "green"),
          ("out[0]", "orange"), ("out[1]", "orange"), ("out[2]", "orange"),
          ("BLOCK_SIZE=…", "purple")]
  wrapper = [("X", "blue"), ("W", "blue"), ("B", "blue"), ("stride", "green"),
             ("N", "green"), ("eps", "green"), ("Y", "orange"),
             ("Mean", "orange"), ("Rstd", "orange"), ("BLOCK_SIZE", "purple")]
  order = KERNELS["_layer_norm_fwd_fused"]
  colour = dict(wrapper)
  kernel = [(name, colour[name]) for name in order]
  into_kernel = [(i, order.index(name), c)
                 for i, (name, c) in enumerate(wrapper)]
  return _panel(
      canvas, y, "Outputs anywhere: a generated wrapper takes the inputs first",
      [_signature("_layer_norm_fwd_fused", annotate=False),
       "triton_call(x, W=w, B=b, stride=N, N=N, eps=eps,",
       "            kernel=_layer_norm_fwd_fused, out_shape=(y, mean, rstd), …)"],
      [("call", call, True), ("wrapper", wrapper, True),
       ("kernel", kernel, False)],
      [_straight([c for _, c in call]), into_kernel],
      [(0, 9, "the wrapper calls the kernel inline, every parameter by name:"
        " the compiled code is the kernel's own")])


def _draw(name: str, title: str, panels) -> str:
  canvas = svg.Canvas(name, _WIDTH, 2000, title)
  y = 8.0
  _legend(canvas, y)
  y += 30
  for panel in panels:
    y = panel(canvas, y) + 8
  canvas.height = y
  return canvas.svg()


def binding() -> str:
  """The three conventions, one panel each."""
  return _draw(
      "binding",
      "How a call's arguments bind a kernel's parameters: jax-triton 0.3.1's"
      " positional form, 0.4's keywords, and outputs anywhere through a"
      " generated wrapper",
      [positional, keywords, outputs_anywhere])


def binding_positional() -> str:
  """The Quickstart's call alone."""
  return _draw(
      "binding-positional",
      "How the Quickstart's call binds add_kernel's parameters: the"
      " positional arguments in order, then one pointer per output, then"
      " metaparams by name", [positional])
