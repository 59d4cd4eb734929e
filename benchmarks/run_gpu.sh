#!/usr/bin/env bash
# The whole GPU verification in one call, for a lent GPU machine:
#   1. the test suites (tests/ and tests_multigpu/) on the real GPUs,
#   2. every example, and the doctor (python -m jt_dist),
#   3. the benchmarks (benchmarks/run.py), side by side with jax-triton
#      (from .whl/ when carried) and XLA,
#   4. the autotuning choice (benchmarks/autotune_choice.py) and, with 2 or
#      more GPUs, one process per GPU (benchmarks/multiprocess_gpu.py),
#   5. scaling.py and auto_partition.py at 1, 2, 4 and 8 GPUs (as many as
#      the host has),
#   6. eager and jitted dispatch (benchmarks/dispatch.py) on one GPU.
# Everything lands in $OUT (default benchmarks/results/latest): logs, JUnit
# XML and the benchmarks' JSON. Usage:
#   bash benchmarks/run_gpu.sh [all|tests|examples|bench|autotune|scaling|dispatch] [run.py args...]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
shift || true
OUT=${OUT:-benchmarks/results/latest}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JT_DIST_CACHE_DIR="${JT_DIST_CACHE_DIR:-/tmp/jt_dist_cache}"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import jax, triton; print('jax', jax.__version__, 'triton', triton.__version__, jax.devices())" | tee "$OUT/versions.txt"
status=0
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
  echo "== python -m jt_dist"
  python3 -m jt_dist 2>&1 | tee "$OUT/doctor.log"
  (( PIPESTATUS[0] == 0 )) || status=1
fi
if [[ $what == all || $what == bench ]]; then
  python3 benchmarks/run.py --out "$OUT/benchmarks.json" "$@" 2>&1 \
    | grep -v "cudart_stub\|absl::" | tee "$OUT/benchmarks.log" || status=1
fi
if [[ $what == all || $what == autotune ]]; then
  python3 benchmarks/autotune_choice.py --out "$OUT/autotune_choice.json" 2>&1 \
    | grep -v "cudart_stub\|absl::" | tee "$OUT/autotune_choice.log"
  (( PIPESTATUS[0] == 0 )) || status=1
  if (( $(nvidia-smi -L | grep -c "^GPU ") >= 2 )); then
    python3 benchmarks/multiprocess_gpu.py --out "$OUT/multiprocess_gpu.json" 2>&1 \
      | grep -v "cudart_stub\|absl::" | tee "$OUT/multiprocess_gpu.log"
    (( PIPESTATUS[0] == 0 )) || status=1
  fi
fi
if [[ $what == all || $what == scaling ]]; then
  for script in scaling auto_partition; do
    python3 "benchmarks/$script.py" --out "$OUT/$script.json" 2>&1 \
      | grep -v "cudart_stub\|absl::" | tee "$OUT/$script.log"
    (( PIPESTATUS[0] == 0 )) || status=1
  done
fi
if [[ $what == all || $what == dispatch ]]; then
  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} python3 benchmarks/dispatch.py \
    --out "$OUT/dispatch.json" 2>&1 \
    | grep -v "cudart_stub\|absl::" | tee "$OUT/dispatch.log"
  (( PIPESTATUS[0] == 0 )) || status=1
fi
exit $status
