"""Renders ``scaling.py``'s JSON as Markdown tables, with the run's noise.

    python benchmarks/readme_table.py benchmarks/results/h200x1/scaling.json
"""

import json
import sys

_COLUMNS = (
    ("jt_dist_sharded", "jt_dist `sharded_triton_call`"),
    ("jt_dist_shard_map", "`jax.shard_map(jt_dist.triton_call)`"),
    ("jax_triton_shard_map", "`jax.shard_map(jax_triton.triton_call)`"),
    ("xla", "XLA"),
)
_AGAIN = "jt_dist_sharded (timed again)"
_VARIANTS = (
    "jt_dist_shard_map[legacy target]",
    "jt_dist_shard_map[FFI, no CUBIN]",
    "jt_dist[scalar-argument form]",
    "jax_triton[scalar-argument form]",
)


def _rate(row):
  unit = "TFLOPs" if "TFLOPs" in row else "GBps"
  return row[unit], unit


def _cell(rows, impl):
  row = rows.get(impl)
  if row is None:
    return "n/a"
  return f"{_rate(row)[0]:,.0f}"


def _winner(rows):
  best = max((impl for impl, _ in _COLUMNS if impl in rows),
             key=lambda impl: _rate(rows[impl])[0])
  return dict(_COLUMNS)[best]


def _noise(rows):
  """How far apart the same function measured twice in the run came."""
  if _AGAIN not in rows or "jt_dist_sharded" not in rows:
    return ""
  again = _rate(rows[_AGAIN])[0] / _rate(rows["jt_dist_sharded"])[0]
  return f"{abs(again - 1) * 100:.1f}%"


def render(data) -> str:
  """The tables, one per problem: a row per device count and placement."""
  by_case = {}
  for row in data["results"]:
    if "error" in row:
      continue
    key = (row["devices"], row.get("where", "mesh"))
    by_case.setdefault(row["case"], {}).setdefault(key, {})[row["impl"]] = row
  lines = []
  for case, table in by_case.items():
    unit = _rate(next(iter(next(iter(table.values())).values())))[1]
    lines.append(f"\n**{case}** ({unit.replace('TFLOPs', 'TFLOP/s').replace('GBps', 'GB/s')}"
                 " for the whole problem)\n")
    header = " | ".join(title for _, title in _COLUMNS)
    lines.append(f"| GPUs | {header} | fastest | noise |")
    lines.append("| --- " * (len(_COLUMNS) + 3) + "|")
    for (devices, where), rows in sorted(table.items()):
      label = (f"{devices}" if where == "mesh"
               else f"1 (one shard of {devices}, alone)")
      cells = " | ".join(_cell(rows, impl) for impl, _ in _COLUMNS)
      lines.append(f"| {label} | {cells} | {_winner(rows)} | {_noise(rows)} |")
    extra = [(devices, where, impl, rows[impl])
             for (devices, where), rows in sorted(table.items())
             for impl in _VARIANTS if impl in rows]
    if extra:
      lines.append("\nLabelled variants:\n")
      for devices, where, impl, row in extra:
        lines.append(f"- {impl}, {devices} GPU(s), {where}:"
                     f" {_rate(row)[0]:,.0f}")
  return "\n".join(lines)


if __name__ == "__main__":
  with open(sys.argv[1]) as f:
    print(render(json.load(f)))
