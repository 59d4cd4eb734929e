"""Renders the committed results as the docs' tables and plots.

The benchmarks page types no figure. Each line
``<!-- results: h200x1/vmap_grid.json -->`` is followed, when MkDocs builds
the site, by what this module renders from that file under
benchmarks/results/ (mkdocs.yml lists it among its hooks): where the
result was measured (commit, versions, device), a table per case and a bar
chart (inline SVG) per plotted case. A result that names no commit is not
shown: the page says it is not yet measured on this tree, and which command
measures it. A quick run, or a chart that does not render, fails the build.

    python benchmarks/doc_tables.py benchmarks/results/h200x1/vmap_grid.json
    python benchmarks/doc_tables.py --readme README.md   # rewrites its table
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from typing import Any
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MARK = re.compile(r"^<!--\s*results:\s*(\S+)\s*-->\s*$", re.M)
# Keys that name a row rather than measure it.
_LABELS = ("impl", "devices", "where", "batch")
_UNSHOWN = ("case", "commit", "detail")  # detail: a whole error.


def _number(value: Any) -> str:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value).replace("|", "\\|")
  if isinstance(value, int):
    return f"{value:,}"
  magnitude = abs(value)
  digits = 0 if magnitude >= 100 else 1 if magnitude >= 10 else (
      2 if magnitude >= 1 else 3 if magnitude >= 0.01 else 5)
  return f"{value:,.{digits}f}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
  lines = ["| " + " | ".join(header) + " |",
           "| " + " | ".join("---" for _ in header) + " |"]
  lines += ["| " + " | ".join(_number(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def measured(data: dict[str, Any]) -> bool:
  """Whether a result names the commit it measured."""
  commit = data.get("provenance", {}).get("commit")
  return bool(commit) and commit != "unknown"


def _provenance(data: dict[str, Any]) -> str:
  p = data["provenance"]
  state = {True: ", with local changes", False: ""}.get(p.get("dirty"),
                                                        ", tree state unknown")
  versions = ", ".join(f"{k} {p[k]}" for k in (
      "python", "jax", "jaxlib", "triton", "numpy", "jax_triton") if p.get(k))
  device = f"{p.get('devices')} × {p.get('device_kind')}"
  load = (f", load average {p['load_average']}"
          if p.get("load_average") is not None else "")
  fresh = ""
  if p.get("code_sha256") and code_sha256() != p["code_sha256"]:
    fresh = (" **`jt_dist/` has changed since this run**: re-run it to"
             " measure this tree.")
  return (f"Measured {p.get('date', '')} at commit `{p['commit'][:12]}`"
          f"{state} on {device} ({p.get('cpus')} host cores{load});"
          f" {versions}.{fresh}")


def code_sha256(root: str = _ROOT) -> str:
  """A hash of jt_dist/'s Python sources: the code a result measured.

  Computed from the files, so that it is known where git is not (a copy of
  the tree on another machine); the docs compare it with their own tree's.
  """
  digest = hashlib.sha256()
  for folder, dirs, names in os.walk(os.path.join(root, "jt_dist")):
    dirs.sort()
    for name in sorted(n for n in names if n.endswith(".py")):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode())
      with open(path, "rb") as f:
        digest.update(f.read())
  return digest.hexdigest()


def _cases(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
  cases: dict[str, list[dict[str, Any]]] = {}
  for row in results:
    cases.setdefault(str(row.get("case", "")), []).append(row)
  return cases


def _by_case(results: list[dict[str, Any]]) -> str:
  """One table per case: a row per implementation, a column per figure."""
  out = []
  for case, rows in _cases(results).items():
    keys = [k for k in _LABELS if any(k in r for r in rows)]
    keys += [k for r in rows for k in r
             if k not in _LABELS and k not in _UNSHOWN]
    keys = list(dict.fromkeys(keys))
    body = [[r.get(k, "") for k in keys] for r in rows]
    out.append(f"**{case}**\n\n{_table(keys, body)}")
  return "\n\n".join(out)


def _plots(data: dict[str, Any]) -> str:
  """The charts the suite asked for, or one per case of its first figure."""
  cases = _cases([r for r in data["results"] if "error" not in r])
  specs = data.get("plots") or [
      {"case": case, "metrics": [k for k, v in rows[0].items()
                                 if k not in _LABELS and isinstance(v, float)
                                 ][:1]} for case, rows in cases.items()]
  charts = []
  for spec in specs:
    rows = cases.get(spec["case"], [])
    if len(rows) > 1 and spec["metrics"]:
      labels = [k for k in _LABELS[1:] if any(k in r for r in rows)]
      charts.append(bar_chart(spec["case"], rows, spec["metrics"],
                                    labels, spec.get("log", False)))
  return "\n\n".join(f'<div class="jt-plot">{c}</div>' for c in charts)


# Bar charts, inline SVG with no dependency, so that the page's palette
# reaches them: text and axes in ``currentColor`` (the page's text colour,
# light or dark), bars in mid-tone colours that read on either background
# (white, and Material's slate).
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1")
_ROW, _BAR_GAP, _LABEL_W, _PLOT_W, _PAD = 18, 4, 260, 360, 8


def _label(row, labels):
  parts = [str(row.get("impl", ""))]
  parts += [f"{k} {row[k]}" for k in labels if k in row]
  return ", ".join(p for p in parts if p)


def _scale(values, log):
  top = max(values) or 1.0
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
  rows = [r for r in rows if any(_plottable(r.get(m)) for m in metrics)]
  values = [r[m] for r in rows for m in metrics if _plottable(r.get(m))]
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
      if _plottable(value) and (value > 0 or not log):
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


def _plottable(value):
  return isinstance(value, (int, float)) and not isinstance(value, bool) and (
      math.isfinite(value))


def command(name: str) -> str:
  """The command that measures benchmarks/results/``name``."""
  device, suite = name[:-len(".json")].split("/")
  return (f"python benchmarks/run.py --suite {suite}"
          f" --out benchmarks/results/{device}")


def render(data: dict[str, Any], name: str = "DEVICE/SUITE.json") -> str:
  """A results file as Markdown: where it was measured, tables, plots.

  Args:
    data: a suite's JSON (benchmarks/run.py's schema).
    name: its path under benchmarks/results/.

  Returns:
    The Markdown; for a result that names no commit, a note saying so.

  Raises:
    ValueError: for a quick run, or a file without the runner's schema.
  """
  if not measured(data):
    return (f"!!! note \"Not yet measured on this tree\"\n    The committed"
            f" `benchmarks/results/{name}` names no commit, so its figures"
            f" are not shown. `{command(name)}` measures it.")
  if data.get("schema") != 1 or not isinstance(data.get("results"), list):
    raise ValueError(f"{name}: not a benchmarks/run.py result")
  if data.get("quick"):
    raise ValueError(f"{name} is a --quick run: a check, not a measurement")
  notes = "".join(f"\n\nRecorded with the results: {n}"
                  for n in data.get("notes", []))
  return "\n\n".join(p for p in (_provenance(data), _by_case(data["results"]),
                                  _plots(data)) if p) + notes


def render_file(name: str) -> str:
  """The rendering of benchmarks/results/`name`, naming the file."""
  with open(os.path.join(_RESULTS, name), encoding="utf-8") as f:
    data = json.load(f)
  return (f"{render(data, name)}\n\n*Rendered from"
          f" `benchmarks/results/{name}`.*\n")


def expand(markdown: str) -> str:
  """Adds, after each ``<!-- results: FILE -->`` line, FILE's rendering."""
  return _MARK.sub(lambda m: f"{m.group(0)}\n\n{render_file(m.group(1))}",
                   markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
  """MkDocs hook: every page's results marks become tables and plots."""
  return expand(markdown)


# The README's eager-dispatch table: (column, case) per column.
README_COLUMNS = (
    ("XLA `a + b`, eager", "xla_eager"),
    ("jax-triton, eager", "jax_triton_eager"),
    ("jt_dist `triton_call`, eager", "jt_dist_eager"),
    ("jt_dist `kernel_call`, eager", "jt_dist_kernel_call_eager"),
    ("XLA, jit", "xla_jit"), ("jax-triton, jit", "jax_triton_jit"),
    ("jt_dist, jit", "jt_dist_jit"))
README_START = "<!-- eager table: python benchmarks/doc_tables.py --readme README.md -->"
README_END = "<!-- end of eager table -->"


def readme_table() -> str:
  """The README's table: one row per GPU whose dispatch result names a commit."""
  rows = []
  for device in sorted(os.listdir(_RESULTS)):
    path = os.path.join(_RESULTS, device, "dispatch.json")
    if device == "cpu" or not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    if not measured(data):
      continue
    med = {r["impl"]: r["median_us"] for r in data["results"]
           if r["case"] == "one call and a sync"}
    p = data["provenance"]
    rows.append([f"{p['device_kind']} ({p.get('date', '')[:10] or 'undated'})"]
                + [f"{med[c]:.1f}" if c in med else "n/a"
                   for _, c in README_COLUMNS])
  if not rows:
    return ("No GPU has measured this tree's eager dispatch yet:"
            " `python benchmarks/run.py --suite dispatch --out"
            " benchmarks/results/DEVICE` on one GPU does.")
  return _table(["device"] + [t for t, _ in README_COLUMNS], rows)


def write_readme(path: str) -> None:
  """Rewrites the table between the README's eager-table marks."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  start = text.index(README_START) + len(README_START)
  end = text.index(README_END)
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{text[:start]}\n{readme_table()}\n{text[end:]}")


if __name__ == "__main__":
  if sys.argv[1] == "--readme":
    write_readme(sys.argv[2])
  else:
    with open(sys.argv[1], encoding="utf-8") as f:
      print(render(json.load(f), os.path.relpath(
          os.path.abspath(sys.argv[1]), _RESULTS)))
