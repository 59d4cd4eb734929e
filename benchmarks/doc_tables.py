"""Renders the committed benchmark results as the docs' Markdown tables.

The benchmarks page (docs/benchmarks.md) types no figure. Each line
``<!-- results: h200x1/vmap_grid.json -->`` is followed, when MkDocs builds
the site, by the tables this module renders from that file under
benchmarks/results/ (mkdocs.yml lists this file among its hooks). From the
command line it prints one file's tables:

    python benchmarks/doc_tables.py benchmarks/results/h200x1/vmap_grid.json
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
_MARK = re.compile(r"^<!--\s*results:\s*(\S+)\s*-->\s*$", re.M)

# How a metric's column is titled; metrics not named here keep their key.
_TITLES = {
    "TFLOPs": "TFLOP/s", "GBps": "GB/s", "us": "µs", "ms": "ms",
    "us_per_call": "µs per call", "cold_s": "cold process, s",
    "second_s": "second process, s", "second_process_s": "second process, s",
}
# Keys that describe a row rather than measure it.
_LABELS = ("case", "impl", "devices", "where", "batch")
# Keys kept in the JSON but not shown: the docs speak of the product, not
# of the commit a run was made on.
_UNSHOWN = ("commit",)


def _number(value: Any) -> str:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return str(value)
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


def _environment(data: dict[str, Any]) -> str:
  env = data.get("environment", data.get("host"))
  if not isinstance(env, dict):
    return ""
  parts = [f"{key} {value}" for key, value in env.items()
           if key not in ("devices",) and isinstance(value, (str, int))
           and not isinstance(value, bool) and len(str(value)) < 40]
  if isinstance(env.get("devices"), list):
    parts.append(f"{len(env['devices'])} device(s)")
  return "Environment: " + ", ".join(parts) + ".\n\n"


def _metrics(rows: list[dict[str, Any]]) -> list[str]:
  keys: list[str] = []
  for row in rows:
    for key, value in row.items():
      if (key not in _LABELS and key not in _UNSHOWN and key not in keys
          and isinstance(value, (int, float, str))
          and not (isinstance(value, str) and len(value) > 60)):
        keys.append(key)
  return keys


def _by_case(results: list[dict[str, Any]]) -> str:
  """One table per case: a row per implementation, a column per metric."""
  cases: dict[str, list[dict[str, Any]]] = {}
  for row in results:
    cases.setdefault(str(row.get("case", "")), []).append(row)
  out = []
  for case, rows in cases.items():
    metrics = _metrics(rows)
    labels = [k for k in _LABELS[1:] if any(k in r for r in rows)]
    header = labels + [_TITLES.get(m, m) for m in metrics]
    body = [[r.get(k, "") for k in labels + metrics] for r in rows]
    out.append(f"**{case}**\n\n{_table(header, body)}")
  return "\n\n".join(out)


def _by_batch(results: list[dict[str, Any]]) -> str:
  """vmap_grid.py: µs per batch, a row per kernel and batch size."""
  impls = list(dict.fromkeys(r["impl"] for r in results))
  table: dict[tuple[str, int], dict[str, float]] = {}
  for r in results:
    kernel = r["case"].split()[1] if len(r["case"].split()) > 1 else r["case"]
    table.setdefault((kernel, r["batch"]), {})[r["impl"]] = r["us"]
  header = ["kernel", "batch"] + [f"{i}, µs" for i in impls]
  if {"grid", "sequential"} <= set(impls):
    header.append("sequential / grid")
  body = []
  for (kernel, batch), cells in sorted(table.items()):
    row = [kernel, batch] + [cells.get(i, "") for i in impls]
    if {"grid", "sequential"} <= set(impls):
      row.append(f"{cells['sequential'] / cells['grid']:.1f}×")
    body.append(row)
  return _table(header, body)


def _kernel_diff(data: dict[str, Any]) -> str:
  """kernel_diff.py: what each library hands jaxlib, and its speed."""
  out = []
  for case, impls in data.items():
    if not (isinstance(impls, dict) and "timing" in impls):
      continue
    header = ["library", "target", "call bytes", "PTX bytes", "CUBIN bytes",
              "warps", "shared memory", "TFLOP/s"]
    body = [[name, d["target"], d["opaque_bytes"], d["ptx_bytes"],
             d["cubin_bytes"], d["num_warps"], d["shared_mem"],
             impls["timing"].get(name, {}).get("TFLOPs", "")]
            for name, d in impls.items()
            if isinstance(d, dict) and "target" in d]
    same = "the same" if impls.get("ptx_same_text") else "different"
    out.append(f"**{case}** (PTX text: {same})\n\n{_table(header, body)}")
  return "\n\n".join(out)


def _bounds_check(data: dict[str, Any]) -> str:
  """bounds_check_overhead.py: the CPU memory check, on and off."""
  out = []
  for key in ("kernels", "kernels_second_run"):
    if key in data:
      body = [[name, t["on_ms"], t["off_ms"], t["on_ms"] / t["off_ms"]]
              for name, t in data[key].items()]
      out.append(f"**{key.replace('_', ' ')}** (eager calls)\n\n" + _table(
          ["kernel", "check on, ms", "check off, ms", "on / off"], body))
  if "suites" in data:
    on, off = min(data["suites"]["on_s"]), min(data["suites"]["off_s"])
    out.append("**the test suites**, best run\n\n" + _table(
        ["check on, s", "check off, s", "on / off"], [[on, off, on / off]]))
  return "\n\n".join(out)


def _cpu_interpreter(data: dict[str, Any]) -> str:
  """cpu_interpreter.py: Triton's interpreter against jt_dist's, per kernel."""
  def mib(k, key):
    return f"{k[key] / 2**20:.1f}" if key in k else ""

  def over_jnp(k):
    return f"{k['jt_dist_s'] / k['jnp_s']:.0f}×" if "jnp_s" in k else ""

  body = [[name, k["programs"], k["stock_s"], k["jt_dist_s"],
           f"{k['stock_s'] / k['jt_dist_s']:.1f}×",
           mib(k, "jt_dist_peak_bytes"),
           k.get("jnp_s", ""), over_jnp(k)]
          for name, k in data["kernels"].items()]
  out = [f"**kernels** (one CPU device, bounds check"
         f" {'on' if data.get('bounds_check', True) else 'off'})\n\n"
         + _table(["kernel", "programs", "Triton's interpreter, s",
                   "jt_dist, s", "speed-up", "jt_dist's peak, MiB",
                   "jnp, s", "jt_dist / jnp"], body)]
  steps = data.get("rms_norm_training_step", {})
  if steps:
    body = [[name, s["jnp_s"] * 1e3, s["stock_s"] * 1e3, s["jt_dist_s"] * 1e3,
             f"{s['jt_dist_s'] / s['jnp_s']:.1f}×",
             f"{s['stock_s'] / s['jnp_s']:.0f}×"]
            for name, s in steps.items()]
    out.append("**training step**, RMSNorm as Triton kernels against jnp\n\n"
               + _table(["step", "jnp, ms", "Triton's interpreter, ms",
                         "jt_dist, ms", "jt_dist / jnp",
                         "Triton's interpreter / jnp"], body))
  return "\n\n".join(out)


def _callback_collective(data: dict[str, Any]) -> str:
  """cpu_callback_collective_repro.py: each host-callback route per size."""
  routes = list(dict.fromkeys(r["route"] for r in data["runs"]))
  sizes = sorted({r["bytes_per_shard"] for r in data["runs"]})
  cells = {(r["route"], r["bytes_per_shard"]):
           f"{r['outcome']}, {r['seconds']:.1f} s" for r in data["runs"]}
  body = [[size] + [cells.get((route, size), "") for route in routes]
          for size in sizes]
  return (f"XLA's termination timeout: {data.get('terminate_s')} s.\n\n"
          + _table(["bytes per shard"] + routes, body))


def _dispatch(data: dict[str, Any]) -> str:
  """dispatch.py: µs per call and sync, the ratios, the jitted custom calls."""
  ratios = data.get("ratios", {})
  body = []
  for r in data["results"]:
    case = r["case"]
    over = [(k[len(case) + len("_over_"):], v) for k, v in ratios.items()
            if k.startswith(case + "_over_")
            and k[len(case) + len("_over_"):] in ("xla_eager", "xla_jit")]
    kind = "diagnostic" if case.startswith("diag_") else "a library call"
    body.append([case, kind, r["median_us"], r["p25_us"], r["p75_us"],
                 f"{over[0][1]:.2f}× {over[0][0]}" if over else ""])
  out = ["**one call and a sync**, µs (diagnostic rows isolate one cost;"
         " they are no library's calling form)\n\n" + _table(
             ["case", "row", "median, µs", "p25, µs", "p75, µs",
              "median over XLA's"], body)]
  cross = [[k.replace("_over_", " / "), f"{v:.2f}×"]
           for k, v in ratios.items()
           if "_over_xla_" not in k and not k.startswith("xla_")]
  if cross:
    out.append("**medians compared**\n\n" + _table(["ratio", "value"], cross))
  hlo = [[name, ", ".join(h.get("targets", [])),
          ", ".join(h.get("api_versions", [])), h.get("instructions", "")]
         for name, h in data.get("hlo", {}).items()
         if isinstance(h, dict) and "targets" in h]
  if hlo:
    out.append("**custom calls of the jitted functions**\n\n" + _table(
        ["function", "custom-call target", "API version", "HLO instructions"],
        hlo))
  first = data.get("first_call")
  if isinstance(first, dict):
    out.append("**a first call, eagerly** (the compiled Triton kernel"
               " kept, nothing else)\n\n" + _table(
                   ["triton_call, memo emptied, µs",
                    "kernel_call made afresh, µs"],
                   [[first.get("triton_call_us", ""),
                     first.get("kernel_call_us", "")]]))
  scalar = data.get("per_step_scalar")
  if isinstance(scalar, dict):
    out.append("**a per-step scalar, eagerly**\n\n" + _table(
        ["", "same value every call, µs", "new value every call, µs",
         "executables kept"],
        [["jt_dist", scalar.get("same_value_us", ""),
          scalar.get("new_value_each_call_us", ""),
          scalar.get("executables_kept", "")],
         ["XLA `x * s`", scalar.get("xla_same_value_us", ""),
          scalar.get("xla_new_value_each_call_us", ""), ""]]))
  order = data.get("output_order")
  if isinstance(order, dict):
    out.append("**a kernel declaring its output first** (kernel time)\n\n"
               + _table(["output first, µs", "outputs last, µs", "ratio"],
                        [[order.get("out_first_us", ""),
                          order.get("out_last_us", ""),
                          order.get("ratio", "")]]))
  return "\n\n".join(out)


def _launch_overhead(data: dict[str, Any]) -> str:
  """benchmarks/cpu_launch_overhead.py: one launch's wall time and profile."""
  rows = []
  for case, result in data["cases"].items():
    wall = result.get("wall_us", {})
    profile = result.get("profile", {})
    row = [case, wall.get("median", ""), wall.get("q1", ""),
           wall.get("q3", ""), profile.get("profiled_us_per_launch", "")]
    for part in ("triton_patch_lang", "jt_dist_language_scope"):
      found = profile.get(part) or {}
      row += [found.get("calls_per_launch", ""), found.get("share", "")]
    rows.append(row)
  return _table(
      ["case", "wall µs (median)", "q1", "q3", "profiled µs",
       "_patch_lang calls", "its share", "jt_dist scope calls",
       "its share"], rows)


_WALL_COST = (
    ("wall_us_per_hot_us", "wall µs per hot µs of padding, after a sync"),
    ("jt_dist_hot_us", "jt_dist's Python per call, hot loop, µs"),
    ("jt_dist_wall_us", "jt_dist's Python per call, after a sync, µs"),
    ("kernel_call_hot_us",
     "a held kernel_call's Python per call, hot loop, µs"),
    ("kernel_call_wall_us",
     "a held kernel_call's Python per call, after a sync, µs"),
    ("budget_wall_us", "the bound's budget above the floor, wall µs"),
    ("budget_hot_us", "that budget at the padding's rate, hot µs"),
    ("floor_over_xla_eager", "floor / XLA eager"),
    ("jt_dist_eager_over_xla_eager", "jt_dist eager / XLA eager"),
)


def _python_wall_cost(data: dict[str, Any]) -> str:
  """benchmarks/python_wall_cost.py: the cases, then what follows."""
  cases = _table(["case", "median µs"],
                 [[r["case"], r["median_us"]] for r in data["results"]])
  pads = _table(["padding (hashes)", "hot µs"],
                [[int(n), us] for n, us in data["pad_hot_us"].items()])
  derived = _table(["figure", "value"],
                   [[title, data[key]] for key, title in _WALL_COST
                    if data.get(key) is not None])
  return "\n\n".join((cases, pads, derived))


def render(data: dict[str, Any]) -> str:
  """A results file's tables, as Markdown.

  Args:
    data: a benchmark's JSON output.

  Returns:
    The tables, preceded by the environment the file records.
  """
  results = data.get("results")
  if "wall_us_per_hot_us" in data:
    body = _python_wall_cost(data)
  elif (isinstance(results, list) and results and "ratios" in data
      and all("median_us" in r for r in results)):
    body = _dispatch(data)
  elif isinstance(results, list) and results:
    if all("batch" in r and "us" in r for r in results):
      body = _by_batch(results)
    elif all("where" in r for r in results if "error" not in r):
      body = _by_case([r for r in results if "error" not in r])
    else:
      body = _by_case(results)
  elif any(isinstance(v, dict) and "timing" in v for v in data.values()):
    body = _kernel_diff(data)
  elif "runs" in data and "terminate_s" in data:
    body = _callback_collective(data)
  elif "kernels" in data and "rms_norm_training_step" in data:
    body = _cpu_interpreter(data)
  elif "suites" in data or "kernels" in data:
    body = _bounds_check(data)
  elif "cases" in data and "elements" in data:
    body = _launch_overhead(data)
  else:
    raise ValueError(f"no renderer for a results file with keys {list(data)}")
  note = data.get("note")
  if isinstance(note, str):
    body += f"\n\nRecorded with the results: {note}"
  return _environment(data) + body


def render_file(name: str) -> str:
  """The tables of benchmarks/results/`name`, with where they come from."""
  path = os.path.join(_RESULTS, name)
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  return (f"{render(data)}\n\n*Rendered from"
          f" `benchmarks/results/{name}`.*\n")


def expand(markdown: str) -> str:
  """Adds, after each ``<!-- results: FILE -->`` line, FILE's tables."""
  return _MARK.sub(lambda m: f"{m.group(0)}\n\n{render_file(m.group(1))}",
                   markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
  """MkDocs hook: every page's results marks become tables."""
  return expand(markdown)


if __name__ == "__main__":
  with open(sys.argv[1], encoding="utf-8") as f:
    print(render(json.load(f)))
