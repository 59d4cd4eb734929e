"""Bar charts of a results file's rows, as inline SVG with no dependency.

Inline, so that the page's palette reaches it: text and axes are drawn in
``currentColor`` (the page's text colour, light or dark), and the bars in
mid-tone colours that read on either background.
"""

import math
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

# Mid-tone colours legible on white and on Material's slate.
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1")
_ROW, _BAR_GAP, _LABEL_W, _PLOT_W, _PAD = 18, 4, 260, 360, 8


def _label(row, labels):
  parts = [str(row.get("impl", ""))]
  parts += [f"{k} {row[k]}" for k in labels if k in row]
  return ", ".join(p for p in parts if p)


def _scale(values, log):
  top = max(values)
  if log:
    bottom = 10 ** math.floor(math.log10(min(values)))
    span = math.log10(top) - math.log10(bottom) or 1
    return lambda v: _PLOT_W * (math.log10(v) - math.log10(bottom)) / span
  return lambda v: _PLOT_W * v / top


def bar_chart(title, rows, metrics, labels=(), log=False):
  """One horizontal bar per row and metric; returns SVG text.

  Args:
    title: the chart's title.
    rows: result rows (dicts); each gets a group of bars.
    metrics: the numeric keys to draw, one bar (and colour) each.
    labels: keys that, beside ``impl``, name a row (devices, batch).
    log: a logarithmic axis (for values orders of magnitude apart).
  """
  rows = [r for r in rows if any(_number(r.get(m)) for m in metrics)]
  values = [r[m] for r in rows for m in metrics if _number(r.get(m))]
  if not values or (log and min(values) <= 0):
    raise ValueError(f"{title}: nothing to plot in {metrics}")
  x = _scale(values, log)
  group = _ROW * len(metrics) + _BAR_GAP * 2
  height = 40 + group * len(rows) + _ROW * len(metrics)
  width = _LABEL_W + _PLOT_W + 90
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}"'
         f' height="{height}" viewBox="0 0 {width} {height}"'
         f' style="max-width:100%;height:auto;font:12px sans-serif"'
         f' fill="currentColor"><title>{escape(title)}</title>',
         f'<text x="{_PAD}" y="16" font-weight="bold">{escape(title)}'
         f'{" (log scale)" if log else ""}</text>']
  y = 28
  for row in rows:
    out.append(f'<text x="{_LABEL_W - _PAD}" y="{y + group / 2}"'
               f' text-anchor="end" dominant-baseline="middle">'
               f'{escape(_label(row, labels)[:42])}</text>')
    for k, metric in enumerate(metrics):
      value = row.get(metric)
      if _number(value) and (value > 0 or not log):
        w = max(1.0, x(value))
        out.append(f'<rect x="{_LABEL_W}" y="{y + _BAR_GAP + k * _ROW}"'
                   f' width="{w:.1f}" height="{_ROW - 4}"'
                   f' fill="{COLOURS[k % len(COLOURS)]}"/>'
                   f'<text x="{_LABEL_W + w + 4:.1f}"'
                   f' y="{y + _BAR_GAP + k * _ROW + _ROW / 2 - 2}"'
                   f' dominant-baseline="middle">{value:.4g}</text>')
    y += group
  out.append(f'<line x1="{_LABEL_W}" y1="26" x2="{_LABEL_W}" y2="{y}"'
             ' stroke="currentColor"/>')
  for k, metric in enumerate(metrics):  # The legend.
    out.append(f'<rect x="{_LABEL_W}" y="{y + 6 + k * _ROW}" width="12"'
               f' height="12" fill="{COLOURS[k % len(COLOURS)]}"/>'
               f'<text x="{_LABEL_W + 18}" y="{y + 12 + k * _ROW}"'
               f' dominant-baseline="middle">{escape(metric)}</text>')
  out.append("</svg>")
  svg = "".join(out)
  ET.fromstring(svg)  # A chart that does not parse fails the build.
  return svg


def _number(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and (
      math.isfinite(value))
