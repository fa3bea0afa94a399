#!/usr/bin/env bash
# The one prepared script for a lent GPU (an H200 with 16 cores, torch 2.11+cu130 preinstalled,
# Python 3.12, no network; one device command of at most 600 s, 15 minutes of device time in all):
# builds fp8mp for the one arch present, runs the CUDA tests, then the GPU benchmarks against
# torch._scaled_mm and BF16 at the README's sizes. Budget: 540 s, enforced step by step.
#
#   bash benchmarks/gpu_check.sh            # results in $OUT (device tool) or benchmarks/out
#   bash benchmarks/gpu_check.sh --dry-run  # same steps on the CPU with tiny sizes (run by the test suite)
#
# Every step writes its own file in the output folder as it runs (NN_step.txt, line-buffered),
# and gpu_check.log collects them all, so a timeout never loses what finished before it.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done

OUT_DIR=${OUT:-benchmarks/out}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
# Close our end of the pipe and wait for tee, so the log is complete when the script returns.
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT

export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
# Step caps are sized for the H200; a dry run on a small shared CPU gets SCALE times more room.
SCALE=${GPU_CHECK_STEP_SCALE:-$(( DRY_RUN ? 4 : 1 ))}
BUDGET_S=${GPU_CHECK_BUDGET_S:-$(( 540 * SCALE ))}
STARTED=$(date +%s)
STEP_NO=0
FAILED=()

elapsed() { echo $(( $(date +%s) - STARTED )); }

# run_step NAME MAX_SECONDS CMD...: at most MAX_SECONDS and never past the budget's end.
run_step() {
  local name=$1 max_s=$(( $2 * SCALE ))
  shift 2
  STEP_NO=$((STEP_NO + 1))
  local left=$(( BUDGET_S - $(elapsed) - 5 ))
  local limit=$(( max_s < left ? max_s : left ))
  local file
  file=$(printf '%s/%02d_%s.txt' "$OUT_DIR" "$STEP_NO" "$name")
  echo
  echo "=== $name (t=$(elapsed)s, limit ${limit}s) -> $file"
  if (( limit <= 0 )); then
    echo "SKIPPED: no time left in the ${BUDGET_S}s budget" | tee "$file"
    FAILED+=("$name(skipped)")
    return 1
  fi
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout needs a process
    timeout --kill-after=5 "$limit" bash -c "$(declare -f "$1"); $1" 2>&1 | tee "$file"
  else
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$file"
  fi
  local rc=${PIPESTATUS[0]}
  if (( rc == 124 || rc == 137 )); then
    echo "TIMED OUT after ${limit}s" | tee -a "$file"
  fi
  echo "--- $name: rc=$rc (t=$(elapsed)s)"
  (( rc == 0 )) || FAILED+=("$name(rc=$rc)")
  return "$rc"
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "nvidia-smi: not available"
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: not on PATH"
  "$PY" - <<'EOF'
import ctypes, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| torch CUDA", torch.version.cuda)
if torch.cuda.is_available():
    print("GPU", torch.cuda.get_device_name(), "| capability %d.%d" % torch.cuda.get_device_capability(),
          "| cuDNN", torch.backends.cudnn.version())
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        print("cuBLASLt", lib.cublasLtGetVersion(), f"({name})")
        break
    else:
        print("cuBLASLt: library not found by name")
else:
    print("no CUDA device visible to torch")
EOF
}

if (( DRY_RUN )); then
  DEVICE=cpu
  export FP8MP_CUDA=0
  CAST_SIZE=64K CAST_COLS=256 GEMM=64x64x64 LINEAR=64x64x64 NORM=64x64 GPT_ARGS="--layers 1 --d-model 32 --batch-size 2"
  TEST_PATHS=tests/ops/test_cast_cuda.py
else
  DEVICE=cuda
  export FP8MP_CUDA=1 MAX_JOBS=${MAX_JOBS:-16}
  # One arch, the one present: the build takes a fraction of the release's four.
  if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then
    TORCH_CUDA_ARCH_LIST=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())") || TORCH_CUDA_ARCH_LIST=9.0
  fi
  export TORCH_CUDA_ARCH_LIST
  CAST_SIZE=64M CAST_COLS=8192 GEMM=8192x8192x8192 LINEAR=16384x8192x8192 NORM=16384x8192 GPT_ARGS=""
  TEST_PATHS=tests
fi
export PY DRY_RUN TEST_PATHS  # read by the step functions, which run in their own bash under timeout
echo "gpu_check: device=$DEVICE dry_run=$DRY_RUN budget=${BUDGET_S}s TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-} out=$OUT_DIR"

run_step versions 15 versions

build() {
  if (( DRY_RUN )) && "$PY" -c "import fp8mp" 2>/dev/null; then  # its libraries load: built in place or installed
    echo "dry run: fp8mp already importable, build skipped"
  else
    command -v ninja >/dev/null || "$PY" -c "import ninja" 2>/dev/null || echo "note: ninja not found, the build runs serially"
    "$PY" setup.py build_ext --inplace -q || return 1
  fi
  PYTHONPATH=$PWD "$PY" -c "
import fp8mp
cuda = fp8mp.cuda_kernels_available()
print('fp8mp', fp8mp.__version__, '| CUDA kernels:', cuda)
assert cuda or $DRY_RUN, 'CUDA kernels missing after a CUDA build'
"
}
if ! run_step build 170 build; then
  echo "BUILD FAILED: nothing else can run"
  exit 1
fi
export PYTHONPATH=$PWD

# Per-test alarm (tests/conftest.py) on top of the step's timeout; synchronous launches for clear errors.
tests() {
  # shellcheck disable=SC2086
  FP8MP_TEST_TIMEOUT=60 CUDA_LAUNCH_BLOCKING=1 "$PY" -m pytest -v --durations=20 -p no:cacheprovider -m cuda $TEST_PATHS
}
run_step tests 120 tests

run_step bench_cast 25 "$PY" benchmarks/bench_cast.py --device "$DEVICE" --dtype bfloat16 --sizes "$CAST_SIZE" --cols "$CAST_COLS"
run_step bench_cast_transpose 25 "$PY" benchmarks/bench_cast.py --device "$DEVICE" --dtype bfloat16 --transpose \
  --sizes "$CAST_SIZE" --cols "$CAST_COLS" --goal 0.85
run_step bench_gemm 30 "$PY" benchmarks/bench_gemm.py --device "$DEVICE" --sizes "$GEMM"
run_step bench_gemm_fast_accum 20 "$PY" benchmarks/bench_gemm.py --device "$DEVICE" --sizes "$GEMM" --fast-accum
run_step bench_linear 45 "$PY" benchmarks/bench_linear.py --device "$DEVICE" --shapes "$LINEAR"
run_step bench_norm 25 "$PY" benchmarks/bench_norm.py --device "$DEVICE" --dtype bfloat16 --shapes "$NORM"
# shellcheck disable=SC2086
run_step bench_gpt_step 45 "$PY" benchmarks/bench_gpt_step.py --device "$DEVICE" $GPT_ARGS

echo
if (( ${#FAILED[@]} )); then
  echo "=== done in $(elapsed)s: FAILED ${FAILED[*]}"
  exit 1
fi
echo "=== done in $(elapsed)s: all steps passed"
