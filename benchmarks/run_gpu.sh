#!/usr/bin/env bash
# The whole GPU verification in one call, for a lent GPU machine:
#   1. the test suites (tests/ and tests_multigpu/) on the real GPUs,
#   2. every example, and the doctor (python -m jt_dist doctor),
#   3. the benchmarks (benchmarks/run.py), side by side with jax-triton
#      (from .whl/ when carried) and XLA,
#   4. the autotuning choice (benchmarks/autotune_choice.py) and, with 2 or
#      more GPUs, one process per GPU (benchmarks/multiprocess_gpu.py),
#   5. scaling.py and auto_partition.py at 1, 2, 4 and 8 GPUs (as many as
#      the host has),
#   6. eager and jitted dispatch (benchmarks/dispatch.py), and what Python
#      costs an eager call (benchmarks/python_wall_cost.py), on one GPU.
#
# Usage:
#   bash benchmarks/run_gpu.sh [all|tests|examples|bench|autotune|scaling|dispatch] [run.py args...]
#
# Where things go:
#   * logs, JUnit XML, nvidia-smi's and the versions' output: $OUT, a new
#     temporary directory when OUT is unset; never the repository;
#   * each benchmark's JSON: $OUT/results/<device>/<benchmark>.json, and,
#     where the docs render that file (a `<!-- results: <device>/<benchmark>.json -->`
#     line in docs/), benchmarks/results/<device>/<benchmark>.json, which
#     the run overwrites. benchmarks/results/ holds only what the docs
#     render: to publish another device's or benchmark's result, add its
#     line to docs/benchmarks.md and copy the file from $OUT. <device> is
#     the GPU's model and count, e.g. h100x1 or h200x2 (dispatch.py and
#     python_wall_cost.py, which run on one GPU: h200x1); set DEVICE and
#     DEVICE_ONE to name them otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/jt_dist_gpu.XXXXXX")}
OUT=$(realpath -m "$OUT")
case $OUT/ in
  "$PWD"/*)
    echo "run_gpu.sh: OUT=$OUT is inside the repository; give a directory outside it" >&2
    exit 2 ;;
esac
mkdir -p "$OUT"
echo "run_gpu.sh: logs in $OUT"

# The GPU's model, lower-cased without its vendor and memory ("NVIDIA H100
# 80GB HBM3" -> h100), and how many there are.
gpu_names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null)
gpu_model=$(echo "${gpu_names:-none}" | head -n 1 | sed 's/^NVIDIA //' \
  | awk '{print tolower($1)}' | cut -d- -f1)
gpu_count=$(echo "$gpu_names" | grep -c .)
DEVICE=${DEVICE:-${gpu_model}x${gpu_count}}
# dispatch.py and python_wall_cost.py run on one GPU of the host.
ONE_DEVICE=${DEVICE_ONE:-${gpu_model}x1}

if compgen -G ".whl/*.whl" > /dev/null; then
  site=$(mktemp -d "${TMPDIR:-/tmp}/jt_dist_site.XXXXXX")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH=$site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JT_DIST_CACHE_DIR="${JT_DIST_CACHE_DIR:-$OUT/jt_dist_cache}"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import jax, triton; print('jax', jax.__version__, 'triton', triton.__version__, jax.devices())" | tee "$OUT/versions.txt"
status=0
# Runs benchmarks/$2.py on device $1 with the rest as its arguments: its
# JSON to $OUT/results/$1/$2.json, copied over benchmarks/results/$1/$2.json
# where the docs render that file; its output to $OUT/$2.log.
bench() {
  local device=$1 name=$2
  shift 2
  local json=$OUT/results/$device/$name.json
  mkdir -p "$OUT/results/$device"
  rm -f "$json"
  python3 "benchmarks/$name.py" --out "$json" "$@" 2>&1 \
    | grep -v "cudart_stub\|absl::" | tee "$OUT/$name.log"
  (( PIPESTATUS[0] == 0 )) || status=1
  [[ -f $json ]] || return 0
  if grep -rqE "^<!-- *results: *$device/$name\.json *-->" docs; then
    mkdir -p "benchmarks/results/$device"
    cp "$json" "benchmarks/results/$device/$name.json"
    echo "run_gpu.sh: $json -> benchmarks/results/$device/ (rendered by docs/)"
  else
    echo "run_gpu.sh: $json is not rendered by docs/, so it stays in \$OUT"
  fi
}
if [[ $what == all || $what == tests ]]; then
  python3 -m pytest tests tests_multigpu -q -p no:cacheprovider -rs \
    --junitxml="$OUT/junit.xml" > "$OUT/tests.log" 2>&1 || status=1
  tail -n 60 "$OUT/tests.log"
fi
if [[ $what == all || $what == examples ]]; then
  # A function, not a piped loop: a loop's assignments die in its subshell.
  run_examples() {
    local failed=0 example
    for example in examples/*.py; do
      echo "== $example"
      case $example in
        # Its command line is the interface: run the artifacts made on a CPU.
        examples/export_kernel.py) python3 "$example" --run examples/artifacts ;;
        *) python3 "$example" ;;
      esac || failed=1
    done
    return $failed
  }
  run_examples 2>&1 | grep -v "cudart_stub\|absl::" | tee "$OUT/examples.log"
  (( PIPESTATUS[0] == 0 )) || status=1
  echo "== python -m jt_dist doctor"
  python3 -m jt_dist doctor 2>&1 | tee "$OUT/doctor.log"
  (( PIPESTATUS[0] == 0 )) || status=1
fi
if [[ $what == all || $what == bench ]]; then
  bench "$DEVICE" run "$@"
fi
if [[ $what == all || $what == autotune ]]; then
  bench "$DEVICE" autotune_choice
  if (( gpu_count >= 2 )); then
    bench "$DEVICE" multiprocess_gpu
  fi
fi
if [[ $what == all || $what == scaling ]]; then
  bench "$DEVICE" scaling
  bench "$DEVICE" auto_partition
fi
if [[ $what == all || $what == dispatch ]]; then
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} bench "$ONE_DEVICE" dispatch
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} bench "$ONE_DEVICE" python_wall_cost
fi
echo "run_gpu.sh: logs and results in $OUT; the results the docs render also in benchmarks/results/"
exit $status
