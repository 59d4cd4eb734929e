"""A small SVG canvas for the docs' pictures: boxes, labels and arrows.

Every picture shares one style: text takes the page's fonts and colour, and
each colour has a light and a dark shade, switched with Material's palette
(``data-md-color-scheme="slate"``). Outside the site (the SVG opened on its
own) the light shades and system fonts apply.
"""

from __future__ import annotations

import dataclasses
from xml.sax.saxutils import escape

# Each colour's shade on the light and on the dark palette.
COLOURS = {
    "blue": ("#2f6bb0", "#7fb2ec"),      # an array input; device 0
    "green": ("#23875a", "#67c995"),     # a scalar passed by value; device 2
    "orange": ("#c25e12", "#f3a35f"),    # an output; device 1
    "purple": ("#7a4fb0", "#bc9ef0"),    # bound by name; device 3
    "gold": ("#9a7400", "#e3c05a"),      # a cache
    "grey": ("#68707c", "#a2aab6"),      # anything else
}
# Shards of devices 0 to 3, in every mesh picture.
DEVICES = ("blue", "orange", "green", "purple")

MONO = 12  # The font size of code labels, in pixels of the viewBox.
PROSE = 12


def text_width(text: str, size: int = MONO, mono: bool = True) -> float:
  """About how wide ``text`` is drawn (monospace glyphs are 0.6 em)."""
  return len(text) * size * (0.6 if mono else 0.56)


def _style() -> str:
  light = ";".join(f"--jtd-{n}:{c[0]}" for n, c in COLOURS.items())
  dark = ";".join(f"--jtd-{n}:{c[1]}" for n, c in COLOURS.items())
  fg = "var(--md-default-fg-color,#1f2328)"
  muted = "var(--md-default-fg-color--light,#57606a)"
  rules = [
      f".jtd{{{light}}}",
      f"[data-md-color-scheme=slate] .jtd{{{dark}}}",
      f".jtd text{{font-family:var(--md-code-font-family,ui-monospace,"
      f"SFMono-Regular,Menlo,Consolas,monospace);font-size:{MONO}px;"
      f"fill:{fg};white-space:pre}}",
      f".jtd .prose{{font-family:var(--md-text-font-family,system-ui,"
      f"-apple-system,Segoe UI,Roboto,sans-serif);font-size:{PROSE}px}}",
      ".jtd .heading{font-weight:700;font-size:13px}",
      ".jtd .small{font-size:11px}",
      f".jtd .muted{{fill:{muted}}}",
      f".jtd .rule{{fill:none;stroke:{muted};stroke-width:1}}",
      ".jtd .frame{fill:none;stroke:var(--md-default-fg-color--lightest,"
      "#d0d7de);stroke-width:1}",
      ".jtd .outline{fill:none;stroke:var(--jtd-grey);stroke-width:1}",
      ".jtd .edge{fill:none;stroke-width:1.5}",
      ".jtd .dashed{stroke-dasharray:5 3}",
  ]
  for name in COLOURS:
    rules += [
        f".jtd .box-{name}{{fill:var(--jtd-{name});fill-opacity:.14;"
        f"stroke:var(--jtd-{name});stroke-width:1.5}}",
        f".jtd .solid-{name}{{fill:var(--jtd-{name});fill-opacity:.55;"
        f"stroke:var(--jtd-{name});stroke-width:1}}",
        f".jtd .edge-{name}{{stroke:var(--jtd-{name})}}",
        f".jtd .head-{name}{{fill:var(--jtd-{name})}}",
        f".jtd .ink-{name}{{fill:var(--jtd-{name})}}",
    ]
  return "".join(rules)


@dataclasses.dataclass
class Box:
  """Where a box was drawn: its left, top, width and height."""
  x: float
  y: float
  w: float
  h: float

  @property
  def cx(self) -> float:
    return self.x + self.w / 2

  @property
  def cy(self) -> float:
    return self.y + self.h / 2

  @property
  def bottom(self) -> float:
    return self.y + self.h

  @property
  def right(self) -> float:
    return self.x + self.w


class Canvas:
  """One picture: ``name`` keys its ids; ``title`` is its accessible name."""

  def __init__(self, name: str, width: float, height: float, title: str):
    self.name, self.width, self.height, self.title = name, width, height, title
    self._parts: list[str] = []
    self._heads: set[str] = set()

  def text(self, x: float, y: float, text: str, cls: str = "",
           anchor: str = "start") -> None:
    """``text`` with its baseline at ``y``; ``anchor``: start, middle, end."""
    self._parts.append(
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"'
        f'{_cls(cls)}>{escape(text)}</text>')

  def rect(self, x: float, y: float, w: float, h: float, cls: str,
           radius: float = 5) -> Box:
    self._parts.append(
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}"'
        f' rx="{radius}"{_cls(cls)}/>')
    return Box(x, y, w, h)

  def box(self, x: float, y: float, label: str, colour: str,
          sub: str | None = None, w: float | None = None, h: float = 24,
          mono: bool = True, dashed: bool = False,
          sub_mono: bool | None = None) -> Box:
    """A tinted box around ``label`` (and a smaller second line ``sub``, in
    code type like ``label`` unless ``sub_mono`` says otherwise).

    Raises:
      ValueError: a line does not fit in width ``w``.
    """
    sub_mono = mono if sub_mono is None else sub_mono
    lines = [(label, MONO, mono)] + ([(sub, 11, sub_mono)] if sub else [])
    needed = max(text_width(t, size, m) for t, size, m in lines) + 12
    if w is None:
      w = needed + 4
    elif needed > w:
      raise ValueError(f"{label!r} / {sub!r} needs {needed:.0f} px; its box"
                       f" in picture {self.name!r} is {w:.0f} wide")
    if sub and h == 24:
      h = 38
    box = self.rect(x, y, w, h, f"box-{colour}" + (" dashed" if dashed else ""))
    if sub:
      self.text(box.cx, y + 16, label, "" if mono else "prose", "middle")
      self.text(box.cx, y + 31, sub,
                "small muted" if sub_mono else "prose small muted", "middle")
    else:
      self.text(box.cx, y + h / 2 + 4, label, "" if mono else "prose",
                "middle")
    return box

  def edge(self, x1: float, y1: float, x2: float, y2: float, colour: str,
           bend: str = "v", arrow: bool = True, dashed: bool = False) -> None:
    """A curve from (x1, y1) to (x2, y2), leaving and arriving vertically
    (``bend="v"``), horizontally (``"h"``), leaving horizontally and
    arriving vertically (``"hv"``), or straight (``""``)."""
    if bend == "v":
      m = (y1 + y2) / 2
      d = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{m:.1f} {x2:.1f},{m:.1f} {x2:.1f},{y2:.1f}"
    elif bend == "h":
      m = (x1 + x2) / 2
      d = f"M{x1:.1f},{y1:.1f} C{m:.1f},{y1:.1f} {m:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
    elif bend == "hv":
      d = f"M{x1:.1f},{y1:.1f} Q{x2:.1f},{y1:.1f} {x2:.1f},{y2:.1f}"
    else:
      d = f"M{x1:.1f},{y1:.1f} L{x2:.1f},{y2:.1f}"
    self.path(d, colour, arrow, dashed)

  def path(self, d: str, colour: str, arrow: bool = True,
           dashed: bool = False) -> None:
    """A line along SVG path data ``d``, with an arrowhead at its end."""
    cls = f"edge edge-{colour}" + (" dashed" if dashed else "")
    head = ""
    if arrow:
      self._heads.add(colour)
      head = f' marker-end="url(#{self._head_id(colour)})"'
    self._parts.append(f'<path d="{d}"{_cls(cls)}{head}/>')

  def bracket(self, x1: float, x2: float, y: float, label: str) -> None:
    """A bracket under ``x1``..``x2`` at ``y``, ``label`` below it."""
    self._parts.append(
        f'<path d="M{x1:.1f},{y - 4:.1f} L{x1:.1f},{y:.1f} L{x2:.1f},{y:.1f}'
        f' L{x2:.1f},{y - 4:.1f}" class="rule"/>')
    self.text((x1 + x2) / 2, y + 14, label, "prose small muted", "middle")

  def _head_id(self, colour: str) -> str:
    return f"jtd-{self.name}-head-{colour}"

  def svg(self) -> str:
    """The picture as one ``<svg>`` element, with no blank line (Markdown
    keeps a raw HTML block whole only up to a blank line)."""
    heads = "".join(
        f'<marker id="{self._head_id(c)}" viewBox="0 0 10 10" refX="9"'
        ' refY="5" markerWidth="7" markerHeight="7" markerUnits="userSpaceOnUse"'
        ' orient="auto-start-reverse"><path d="M0,1 L10,5 L0,9 z"'
        f' class="head-{c}"/></marker>' for c in sorted(self._heads))
    title_id = f"jtd-{self.name}-title"
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" class="jtd"'
        f' id="jtd-{self.name}" viewBox="0 0 {self.width:.0f} {self.height:.0f}"'
        f' width="{self.width:.0f}" height="{self.height:.0f}" role="img"'
        f' aria-labelledby="{title_id}"'
        ' style="max-width:100%;height:auto">',
        f'<title id="{title_id}">{escape(self.title)}</title>',
        f"<style>{_style()}</style>",
        f"<defs>{heads}</defs>",
        *self._parts,
        "</svg>"])


def _cls(cls: str) -> str:
  return f' class="{cls}"' if cls else ""
