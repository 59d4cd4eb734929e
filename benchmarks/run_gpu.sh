#!/usr/bin/env bash
# The whole GPU verification in one call, for a lent GPU machine:
#   1. the test suites (tests/ and tests_multigpu/) on the real GPUs,
#   2. every example, and the doctor (python -m jt_dist doctor),
#   3. the benchmark suites (benchmarks/run.py): every GPU suite the docs
#      render, on one GPU; with 2 or more GPUs, scaling and auto_partition
#      on all of them, and one process per GPU (the multiprocess suite).
#
# Usage:
#   bash benchmarks/run_gpu.sh [all|tests|examples|bench]
#
# Where things go:
#   * logs, JUnit XML, nvidia-smi's and the versions' output: $OUT, a new
#     temporary directory when OUT is unset; never the repository;
#   * each suite's JSON: $OUT/results/<device>/<suite>.json, and, where the
#     docs render that file (a `<!-- results: <device>/<suite>.json -->`
#     line in docs/), benchmarks/results/<device>/<suite>.json, which the
#     run overwrites. <device> is the GPU's model and count, e.g. h200x1;
#     set DEVICE and DEVICE_ONE to name them otherwise.
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
# The all-gpu suites run on one GPU of the host.
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
# Runs the suites $2 on device $1 with the rest as run.py's arguments:
# their JSON to $OUT/results/$1/, each copied over
# benchmarks/results/$1/<suite>.json where the docs render that file.
bench() {
  local device=$1 suites=$2 json
  shift 2
  mkdir -p "$OUT/results/$device"
  python3 benchmarks/run.py --suite "$suites" --out "$OUT/results/$device" \
    "$@" 2>&1 | grep -v "cudart_stub\|absl::" | tee -a "$OUT/bench.log"
  (( PIPESTATUS[0] == 0 )) || status=1
  for json in "$OUT/results/$device"/*.json; do
    [[ -f $json ]] || continue
    local name
    name=$(basename "$json" .json)
    if grep -rqE "^<!-- *results: *$device/$name\.json *-->" docs; then
      mkdir -p "benchmarks/results/$device"
      cp "$json" "benchmarks/results/$device/$name.json"
      echo "run_gpu.sh: $json -> benchmarks/results/$device/ (rendered by docs/)"
    fi
  done
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
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} bench "$ONE_DEVICE" all-gpu
  if (( gpu_count >= 2 )); then
    bench "$DEVICE" scaling,auto_partition,multiprocess --timeout 900
  fi
fi
echo "run_gpu.sh: logs and results in $OUT; the results the docs render also in benchmarks/results/"
exit $status
