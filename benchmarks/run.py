"""The benchmark runner: named suites, one JSON schema, one process each.

    python benchmarks/run.py --list
    python benchmarks/run.py --suite dispatch --quick
    python benchmarks/run.py --suite all-gpu --out benchmarks/results/h200x1
    python benchmarks/run.py --suite all-cpu --out benchmarks/results/cpu

Each suite runs in a child process of its own, under ``--timeout`` seconds
(a suite that runs past it, or fails, leaves the others' results standing),
and writes ``OUT/<suite>.json``:

    {"suite": ..., "schema": 1, "quick": false,
     "provenance": {"commit", "dirty", "code_sha256", "date", "python",
                    "jax", "jaxlib", "triton", "numpy", "jax_triton",
                    "platform", "device_kind", "devices", "cpus", ...},
     "sizes": {...},
     "results": [{"case": ..., "impl": ..., <labels>, <figures>}, ...],
     "notes": [...], "plots": [{"case", "metrics", "log"}, ...]}

``--quick`` runs tiny sizes on any host: a check that every case runs and
agrees with its reference, not a measurement (the docs refuse to render a
quick run). On a copy of the tree (without its .git, or with another
snapshot's), ``--commit`` names the commit it holds, and git is not asked.

A suite is a function in a suite module's ``SUITES`` (listed here in
``SUITES``): it takes ``quick`` and returns ``{"results": rows, "sizes":
..., "notes": [...]}``. A case is a row or a few: add one where the suite
builds its rows.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

# Suite name -> (module, CPU devices it asks for on a CPU host, what it is).
SUITES = {
    "dispatch": ("dispatch", 1, "eager and jitted dispatch of a tiny add"),
    "python_wall_cost": ("dispatch", 8,
                         "what a microsecond of Python costs after a sync"),
    "scaling": ("throughput", 8, "1 to 8 devices, each library its users'"
                " way"),
    "auto_partition": ("throughput", 8, "a sharding rule under plain jit"),
    "vmap_grid": ("throughput", 1, "jax.vmap's batched grid against a loop"),
    "autotune_choice": ("autotune", 1, "what an autotuning choice costs and"
                        " gets"),
    "multiprocess": ("autotune", None, "one process per GPU (2 x 4 CPU"
                     " devices on a CPU host)"),
    "cpu_interpreter": ("cpu", 1, "the CPU interpreter, per kernel"),
    "cpu_eager": ("cpu", 1, "an eager CPU call: first, repeated, one launch"),
    "bounds_check_overhead": ("cpu", 1, "the CPU memory check, on and off"),
    "external_kernels": ("external_kernels", 1, "Triton's tutorials and"
                         " Liger-Kernel's kernels, unchanged"),
}
GROUPS = {
    # Every GPU result the docs render, on one GPU.
    "all-gpu": ("dispatch", "python_wall_cost", "scaling", "auto_partition",
                "vmap_grid", "autotune_choice"),
    "all-cpu": ("cpu_interpreter", "cpu_eager", "bounds_check_overhead",
                "python_wall_cost", "external_kernels"),
}


def _configure(cpu_devices):
  """Asks for ``cpu_devices`` virtual devices where the host has no GPU."""
  if cpu_devices is None:
    return
  from jt_dist import testing  # pylint: disable=g-import-not-at-top
  testing.configure_cpu_devices(cpu_devices)  # GPU hosts ignore it.


def child(name, quick, path, given_commit):
  """Runs suite ``name`` in this process and writes its JSON to ``path``."""
  module_name, cpu_devices, _ = SUITES[name]
  _configure(cpu_devices)
  import timing  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(module_name)
  measured = module.SUITES[name](quick)
  result = {"suite": name, "schema": 1, "quick": quick,
            "provenance": timing.provenance(given_commit),
            "sizes": measured.get("sizes", {}),
            "results": measured["results"],
            "notes": measured.get("notes", []),
            "plots": measured.get("plots", [])}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
  return 1 if measured.get("failed") else 0


def _short(value):
  if isinstance(value, float):
    return f"{value:.4g}"
  return str(value)[:60]


def _print(result):
  print(f"\n{result['suite']}:")
  for row in result["results"]:
    figures = ", ".join(f"{k} {_short(v)}" for k, v in row.items()
                        if k not in ("case", "impl"))
    print(f"  {row['case']} | {row.get('impl', '')} | {figures}")


def _names(spec):
  names = []
  for part in spec.split(","):
    for name in GROUPS.get(part, (part,)):
      if name not in SUITES:
        raise SystemExit(f"run.py: no suite {name!r}; --list lists them")
      names.append(name)
  return names


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--suite", default="all-cpu",
                      help="suites or groups (all-gpu, all-cpu), by commas")
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes: a check that runs on any host")
  parser.add_argument("--out", help="a folder for <suite>.json")
  parser.add_argument("--timeout", type=float, default=300,
                      help="seconds per suite (default 300)")
  parser.add_argument("--commit", help="the commit, where git cannot say")
  parser.add_argument("--list", action="store_true")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--json", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return child(args.child, args.quick, args.json, args.commit)
  if args.list:
    for group, names in GROUPS.items():
      print(f"{group}: {', '.join(names)}")
    for name, (_, _, what) in SUITES.items():
      print(f"  {name}: {what}")
    return 0
  status, done = 0, {}
  for name in _names(args.suite):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, f"{name}.json")
      command = [sys.executable, os.path.abspath(__file__), "--child", name,
                 "--json", path] + (["--quick"] if args.quick else []) + (
                     ["--commit", args.commit] if args.commit else [])
      print(f"[{name}]", flush=True)
      start = time.perf_counter()
      try:
        code = subprocess.run(command, timeout=args.timeout,
                              check=False).returncode
      except subprocess.TimeoutExpired:
        code = f"ran past --timeout {args.timeout:g} s"
      print(f"[{name}] {time.perf_counter() - start:.0f} s", flush=True)
      if code != 0 or not os.path.exists(path):
        print(f"run.py: suite {name} failed: {code}", file=sys.stderr)
        status = 1
        if not os.path.exists(path):
          continue
      with open(path, encoding="utf-8") as f:
        result = json.load(f)
      _print(result)
      done[name] = result
  # Written last, so that a suite's --out in the tree leaves the tree clean
  # for the suites after it.
  for name, result in done.items() if args.out else ():
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w",
              encoding="utf-8") as f:
      json.dump(result, f, indent=1)
      f.write("\n")
  return status


if __name__ == "__main__":
  sys.exit(main())
