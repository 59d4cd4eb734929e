"""Every eager-dispatch run of one tree, side by side, against issue 20's bounds.

One run of ``dispatch.py`` or ``python_wall_cost.py`` is a median over
interleaved rounds, and the hosts' noise moves it by a few percent from run
to run. This collects the ratios of several committed runs into one file,
so that the docs show every run rather than a chosen one:

    python benchmarks/dispatch_runs.py --out benchmarks/results/dispatch_runs.json \\
        h100x1/dispatch.json h100x1/repeat_runs/dispatch_run2.json ... \\
        --earlier h100x1/repeat_runs/before_thread_safety/dispatch_run1.json ...

Paths are under ``benchmarks/results/``. A run under
``repeat_runs/LABEL/`` is of the tree LABEL names. Runs of an earlier
tree's code (``--earlier``) are shown, and left out of the count of runs
within each bound.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BOUNDS = {"eager_over_xla": 1.15, "eager_over_jax_triton": 1.0,
          "jit_over_jax_triton": 1.01, "sharded_over_xla": 1.3}


def _dispatch_row(data: dict[str, Any]) -> dict[str, Any]:
  ratios = data["ratios"]
  return {
      "benchmark": "dispatch.py",
      "eager_over_xla": ratios["jt_dist_eager_over_xla_eager"],
      "floor_over_xla": ratios["diag_floor_caller_args_entry_fn_over_xla_eager"],
      "eager_over_jax_triton": ratios.get("jt_dist_eager_over_jax_triton_eager"),
      "jit_over_jax_triton": ratios.get("jt_dist_jit_over_jax_triton_jit"),
      "sharded_over_xla": ratios["jt_dist_sharded_1dev_eager_over_xla_eager"],
  }


def _wall_cost_row(data: dict[str, Any]) -> dict[str, Any]:
  return {"benchmark": "python_wall_cost.py",
          "eager_over_xla": data["jt_dist_eager_over_xla_eager"],
          "floor_over_xla": data["floor_over_xla_eager"]}


def _tree(name: str, counted: bool) -> str:
  """``repeat_runs/LABEL/…`` names its tree; other runs are the current one's."""
  parts = name.split("/")
  if "repeat_runs" in parts and len(parts) > parts.index("repeat_runs") + 2:
    return parts[parts.index("repeat_runs") + 1]
  return "current" if counted else "earlier"


def row(name: str, counted: bool = True) -> dict[str, Any]:
  """One run's ratios, the device it ran on, its tree, whether counted."""
  with open(os.path.join(_RESULTS, name), encoding="utf-8") as f:
    data = json.load(f)
  found = (_wall_cost_row(data) if "wall_us_per_hot_us" in data
           else _dispatch_row(data))
  device = data.get("environment", {}).get("device_kind", "")
  return {"case": name, "tree": _tree(name, counted), "counted": counted,
          "device": device, **found}


def summary(names: list[str], earlier: list[str] = ()) -> dict[str, Any]:
  """Every run's row, and how many of the current tree's meet each bound."""
  rows = ([row(name) for name in names]
          + [row(name, counted=False) for name in earlier])
  met = {}
  for ratio, bound in BOUNDS.items():
    values = [r[ratio] for r in rows
              if r.get(ratio) is not None and r["counted"]]
    met[ratio] = {"bound": bound, "runs": len(values),
                  "within": sum(v <= bound for v in values)}
  return {"bounds": BOUNDS, "runs": rows, "met": met}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("files", nargs="+")
  parser.add_argument("--earlier", nargs="*", default=[])
  args = parser.parse_args(argv)
  out = summary(args.files, args.earlier)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out["met"], indent=1))


if __name__ == "__main__":
  main()
