#!/usr/bin/env bash
# The GPU check: one command on a lent GPU machine (one H100 or H200, torch 2.11+cu130, Python 3.12, no
# torchao, no network; one command of at most 600 s, at most 8 files back from $OUT). docs/gpu_check.md
# says how to build the wheel it installs (make gpu-wheel) and what to carry.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine: install, nvidia-smi, CUDA tests, benchmarks
#   bash benchmarks/gpu_check.sh --dry-run  # here, without a GPU: the plan, the test collection, tiny benchmarks
#
# It compiles nothing: it installs the carried wheel (dist-gpu/fp8mp-*.whl, CUDA code for 9.0) with
# pip --no-deps. Then each CUDA test file runs on its own (`pytest -m cuda FILE`) under its own time limit,
# then each benchmark. Every step appends its output to ONE log, $OUT/gpu_check.log, as it runs, and its
# figures and outcome to ONE JSON file, $OUT/gpu_check.json: two files in $OUT (three for a moment while
# the JSON is rewritten). The step limits below sum to at most 520 s, which the dry run checks.
#
# The dry run installs and builds nothing (it uses the fp8mp that imports here: `make build`), prints the
# plan, collects the CUDA test files exactly as the GPU run runs them (all in one pytest process) but with every
# module the GPU machine is not sure to hold made unimportable (benchmarks/gpu_image_imports.py: torchao, transformers, ...), fails on
# a collection error, on a file collecting fewer tests than it holds, on a CUDA test file missing from the
# plan and on a file whose limit is short of its tests; then runs every benchmark step's command on the CPU
# at tiny sizes, under the same imports (benchmarks/gpu_image/sitecustomize.py on PYTHONPATH, child processes
# included), so that a flag, an import or a JSON write that would fail on the GPU fails here first.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
  esac
done

# ---------------------------------------------------------------- the plan
# "step limit_s", in the order they run. A step `test:FILE` runs the CUDA tests of FILE; every file where
# `pytest -m cuda` selects a test must be here (the dry run checks it), smallest first, so that a slow file
# near the end costs only itself. A file's limit is at least TEST_BASE_S plus TEST_PER_100_S per 100 of its
# tests (the dry run checks it from the collected counts).
PLAN=(
  "install 25"
  "environment 9"
  "test:tests/nn/test_block_linear.py 15"
  "test:tests/nn/test_linear.py 15"
  "test:tests/ops/test_blockwise.py 16"
  "test:tests/optim/test_optim_ops.py 17"
  "test:tests/ops/test_scale_update_checks.py 17"
  "test:tests/test_build.py 18"
  "test:tests/ops/test_norm_cuda.py 24"
  "test:tests/ops/test_grouped_gemm_cuda.py 21"
  "test:tests/ops/test_cast_cuda.py 22"
  "test:tests/ops/test_scale_validation.py 28"
  "test:tests/ops/test_gemm_cuda.py 62"
  "test:tests/ops/test_blockwise_cuda.py 98"
  "test:tests/nn/test_modules_cuda.py 15"
  "bench_gemm 15"
  "bench_cast_transpose 9"
  "bench_linear 13"
  "bench_block_scaling 13"
  "gpt_loss_check 32"
  "peak_memory 14"
  "train_memory 22"
)
PLAN_BUDGET_S=${GPU_CHECK_PLAN_BUDGET_S:-520}  # the sum of the limits above may not exceed this
HARD_END_S=570     # and no step runs past this, whatever the steps before it took (the command's limit is 600 s)
TEST_BASE_S=14     # pytest, torch, CUDA context and cuBLASLt start-up of one test file, and its exit
TEST_PER_100_S=16  # 0.16 s per test
TEST_ALARM_S=30    # one test's limit (tests/conftest.py, FP8MP_TEST_TIMEOUT), so one hang costs one test
DRY_RUN_SCALE=${GPU_CHECK_DRY_RUN_SCALE:-4}  # the dry run's limits: the GPU's times this, for a small shared CPU

PY=${PYTHON:-python3}
[[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY  # a relative path (make's .venv/bin/python): the install step runs from /
# -P: no checkout folder first on sys.path, so that `import fp8mp` finds the installed wheel, not ./fp8mp (which has
# no libraries). Python 3.10 lacks it; there the dry run imports ./fp8mp through PYTHONPATH anyway.
SAFE_PATH=$("$PY" -c 'import sys; print("-P" if sys.version_info >= (3, 11) else "")')
OUT_DIR=${OUT:-benchmarks/out}
WHEEL_DIR=${GPU_CHECK_WHEEL_DIR:-dist-gpu}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
FIGURES=$OUT_DIR/gpu_check.json
: > "$LOG"
rm -f "$FIGURES"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
# Close our end of the pipe and wait for tee, so the log is complete when the script returns.
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT
# No pytest plugin of whatever the machine holds; no progress bars in the log.
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TQDM_DISABLE=1
STARTED=$(date +%s)
elapsed() { echo $(( $(date +%s) - STARTED )); }

if (( DRY_RUN )); then
  DEVICE=cpu
  # The fp8mp built in place here (make build); the GPU run imports the installed wheel (python -P: not ./fp8mp).
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  GEMM_SIZES=64x64x64,128x96x80 CAST_SIZES=64K CAST_COLS=256 LINEAR_SHAPES=64x64x64 BLOCK_SIZES=64x128x96
  GPT_ARGS="--layers 1 --d-model 32 --heads 2 --context 16 --batch-size 2 --steps 4"
  MEMORY_ARGS="--step-widths 64x128x64 --tokens 32"
  TRAIN_MEMORY_ARGS="--quick --rounds 1"
  TRAIN_MEMORY_RUNS="BF16 AMP,fp8mp memory-lean"  # each run is a fresh process: two here
else
  DEVICE=cuda
  GEMM_SIZES=4096x4096x4096,8192x8192x8192 CAST_SIZES=16M,64M,256M CAST_COLS=8192 LINEAR_SHAPES=16384x8192x8192
  BLOCK_SIZES=4096x4096x4096,8192x8192x8192
  GPT_ARGS="--steps 50"
  MEMORY_ARGS=""
  TRAIN_MEMORY_ARGS="--rounds 1"
  TRAIN_MEMORY_RUNS="FP32,BF16 AMP,fp8mp compute-only,fp8mp memory-lean"  # not torchao's: the machine lacks it
fi

# ---------------------------------------------------------------- the steps
# What the check imports besides torch (fp8mp's runtime dependencies, its `test` extra, matplotlib for the GPT
# step): those the GPU machine lacks are installed, without network, from the wheels `make gpu-wheel` puts in
# $WHEEL_DIR/deps (for its Python, at requirements-test.txt's pins); what the machine has is left as it is.
CHECK_PACKAGES="numpy tqdm pytest hypothesis ml_dtypes matplotlib"
install_missing_deps() {
  local missing
  missing=$("$PY" -c "import importlib.util, sys
print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))" $CHECK_PACKAGES)
  if [[ -z $missing ]]; then
    echo "the machine holds $CHECK_PACKAGES"
  elif [[ -d $WHEEL_DIR/deps ]]; then
    echo "installing from $WHEEL_DIR/deps what the machine lacks: $missing"
    # shellcheck disable=SC2086
    "$PY" -m pip install --no-index --find-links "$WHEEL_DIR/deps" --no-cache-dir --disable-pip-version-check -q \
      $missing
  else
    echo "the machine lacks $missing and $WHEEL_DIR/deps is not here (make gpu-wheel downloads it): the steps" \
      "that import them will say so"
  fi
}

step_install() {
  local wheels=("$WHEEL_DIR"/fp8mp-*.whl)
  if (( DRY_RUN )); then
    local built=""
    [[ -f ${wheels[0]} ]] || built=" (not built here yet: make gpu-wheel)"
    echo "dry run: installs nothing; the GPU run installs ${wheels[0]}$built"
  else
    if [[ ! -f ${wheels[0]} ]]; then
      echo "no wheel in $WHEEL_DIR/: build it with 'make gpu-wheel' and carry $WHEEL_DIR (docs/gpu_check.md)"
      return 1
    fi
    (( ${#wheels[@]} == 1 )) || { echo "more than one wheel in $WHEEL_DIR/: ${wheels[*]}"; return 1; }
    "$PY" -m pip install --no-deps --no-index --force-reinstall --no-cache-dir --disable-pip-version-check -q \
      "${wheels[0]}" || return 1
    install_missing_deps || return 1
  fi
  # From / and with -P: the installed fp8mp, never the source folder fp8mp/ of this checkout.
  (cd / && "$PY" $SAFE_PATH -c "
import fp8mp
from fp8mp.ops import _build_info
print('fp8mp', fp8mp.__version__, 'from', fp8mp.__file__)
print(fp8mp.cuda_kernels_status(), '| built for CUDA', _build_info.CUDA, 'archs', repr(_build_info.CUDA_ARCHS),
      'with torch', _build_info.BUILT_WITH_TORCH)
assert fp8mp.cuda_kernels_available() or $DRY_RUN, 'nothing can run on a GPU: ' + fp8mp.cuda_kernels_status()
")
}

step_environment() {
  nvidia-smi 2>/dev/null || echo "nvidia-smi: not available"
  "$PY" - <<'EOF'
import ctypes, importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| torch CUDA", torch.version.cuda)
missing = []
for name in ("numpy", "tqdm", "pytest", "hypothesis", "ml_dtypes", "matplotlib"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}", end="; ")
    except ImportError:
        missing.append(name)
print("\nmissing:", ", ".join(missing) or "none")
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    print("GPU", torch.cuda.get_device_name(), f"| capability {major}.{minor}", "| cuDNN", torch.backends.cudnn.version())
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        print("cuBLASLt", lib.cublasLtGetVersion(), f"({name})")
        break
    from fp8mp.ops import _build_info
    archs = [a.replace("+PTX", "") for a in _build_info.CUDA_ARCHS.split(";") if a]
    if f"{major}.{minor}" not in archs:
        print(f"WARNING: the wheel holds code for {_build_info.CUDA_ARCHS!r} only, this GPU is {major}.{minor}: "
              f"make gpu-wheel GPU_WHEEL_ARCH={major}.{minor}")
else:
    print("no CUDA device visible to torch")
EOF
}

test_command() {  # the pytest command of CUDA test files (the GPU run: one file a step), the same in both runs
  local pytest=("$PY" $SAFE_PATH -m pytest -p no:cacheprovider -m cuda "$@")
  if (( DRY_RUN )); then
    PYTHONPATH=$PYTHONPATH:$PWD/benchmarks "${pytest[@]}" -p gpu_image_imports -qq --collect-only \
      --continue-on-collection-errors
  else
    FP8MP_TEST_TIMEOUT=$TEST_ALARM_S "${pytest[@]}" -v -rfEs --durations=5
  fi
}

step_bench_gemm() {
  "$PY" benchmarks/bench_gemm.py --device "$DEVICE" --sizes "$GEMM_SIZES" --json "$FIGURES" &&
    "$PY" benchmarks/bench_gemm.py --device "$DEVICE" --sizes "$GEMM_SIZES" --fast-accum --json "$FIGURES"
}

step_bench_cast_transpose() {
  "$PY" benchmarks/bench_cast.py --device "$DEVICE" --dtype bfloat16 --transpose --sizes "$CAST_SIZES" \
    --cols "$CAST_COLS" --goal 0.85 --json "$FIGURES"
}

step_bench_linear() {
  "$PY" benchmarks/bench_linear.py --device "$DEVICE" --shapes "$LINEAR_SHAPES" --json "$FIGURES"
}

step_bench_block_scaling() {
  "$PY" benchmarks/bench_block_scaling.py --device "$DEVICE" --sizes "$BLOCK_SIZES" --json "$FIGURES"
}

step_gpt_loss_check() {  # FP8, BF16 and FP32 runs of examples/train_gpt.py; its pictures go to a scratch folder
  local scratch
  scratch=$(mktemp -d)
  # shellcheck disable=SC2086
  "$PY" examples/train_gpt.py --device "$DEVICE" $GPT_ARGS --out "$scratch" --json "$FIGURES"
  local rc=$?
  rm -rf "$scratch"
  return "$rc"
}

step_peak_memory() {
  # shellcheck disable=SC2086
  "$PY" benchmarks/bench_memory.py --device "$DEVICE" $MEMORY_ARGS --json "$FIGURES"
}

step_train_memory() {  # bytes by category and peak GPU memory of one training step of the demo GPT, per run
  # shellcheck disable=SC2086
  "$PY" benchmarks/bench_train_memory.py --device "$DEVICE" --models gpt --runs "$TRAIN_MEMORY_RUNS" \
    $TRAIN_MEMORY_ARGS --json "$FIGURES"
}

# ---------------------------------------------------------------- running them
# run_step NAME LIMIT: runs step NAME under min(LIMIT, what is left before HARD_END_S), its output into the
# log as it comes, then appends its outcome to the JSON file. Returns the step's exit status.
STEP_OUTPUT=$(mktemp)
FAILED=()
run_step() {
  local name=$1 limit=$(( $2 * (DRY_RUN ? DRY_RUN_SCALE : 1) )) started=$(elapsed)
  local left=$(( HARD_END_S * (DRY_RUN ? DRY_RUN_SCALE : 1) - started ))
  (( limit < left )) || limit=$left
  echo
  echo "=== $name (t=${started}s, limit ${limit}s)"
  local rc
  if (( limit <= 0 )); then
    echo "SKIPPED: no time left before ${HARD_END_S}s" | tee "$STEP_OUTPUT"
    rc=124
  elif [[ $name == test:* ]] && (( DRY_RUN )); then  # its line of the one collection of every planned file
    grep -E "^${name#test:}: [0-9]+$" "$COLLECTED" | tee "$STEP_OUTPUT"
    rc=${PIPESTATUS[0]}
    (( rc == 0 )) || grep -F "${name#test:}" "$COLLECTED" | head -20 | tee "$STEP_OUTPUT"
  elif [[ $name == test:* ]]; then
    if [[ -n $TESTS_UNRUNNABLE ]]; then
      echo "SKIPPED: $TESTS_UNRUNNABLE" | tee "$STEP_OUTPUT"
      rc=3
    else
      timeout --kill-after=5 "$limit" bash -c "$(declare -f test_command); test_command '${name#test:}'" 2>&1 \
        | tee "$STEP_OUTPUT"
      rc=${PIPESTATUS[0]}
    fi
  elif (( DRY_RUN )); then  # every benchmark and example under the GPU machine's imports, child processes too
    local also=""
    [[ $name == gpt_loss_check ]] && also=matplotlib  # the GPT report's plots: carried (docs/gpu_check.md)
    PYTHONPATH=$PWD/benchmarks/gpu_image:$PYTHONPATH GPU_IMAGE_ALSO=$also \
      timeout --kill-after=5 "$limit" bash -c "$(declare -f "step_$name"); step_$name" 2>&1 | tee "$STEP_OUTPUT"
    rc=${PIPESTATUS[0]}
  else
    timeout --kill-after=5 "$limit" bash -c "$(declare -f "step_$name"); step_$name" 2>&1 | tee "$STEP_OUTPUT"
    rc=${PIPESTATUS[0]}
  fi
  (( rc == 124 || rc == 137 )) && echo "TIMED OUT after ${limit}s" | tee -a "$STEP_OUTPUT"
  echo "--- $name: rc=$rc ($(( $(elapsed) - started ))s)"
  local summary
  summary=$(grep -v '^\s*$' "$STEP_OUTPUT" | tail -1 | sed 's/^[= ]*//; s/[= ]*$//' | cut -c1-300)
  "$PY" benchmarks/results_json.py "$FIGURES" --step "$name" "$rc" "$(( $(elapsed) - started ))" "$limit" "$summary"
  (( rc == 0 )) || FAILED+=("$name(rc=$rc)")
  return "$rc"
}

# What the steps read, for the `bash -c` each runs in under `timeout`.
export PY SAFE_PATH DEVICE FIGURES WHEEL_DIR DRY_RUN TEST_ALARM_S \
  GEMM_SIZES CAST_SIZES CAST_COLS LINEAR_SHAPES BLOCK_SIZES GPT_ARGS MEMORY_ARGS TRAIN_MEMORY_ARGS TRAIN_MEMORY_RUNS

print_plan() {
  local total=0 entry name limit
  echo "plan ($( ((DRY_RUN)) && echo "dry run on the CPU, each limit x$DRY_RUN_SCALE" || echo 'GPU run')):"
  for entry in "${PLAN[@]}"; do
    read -r name limit <<< "$entry"
    printf '  %-46s %4ss\n' "$name" "$limit"
    total=$(( total + limit ))
  done
  printf '  %-46s %4ss (at most %ss)\n' "sum of the limits" "$total" "$PLAN_BUDGET_S"
  PLAN_TOTAL_S=$total
}

echo "gpu_check: device=$DEVICE dry_run=$DRY_RUN python=$PY out=$OUT_DIR wheel_dir=$WHEEL_DIR" \
  "$(date -u '+%Y-%m-%d %H:%M UTC')"
print_plan
"$PY" benchmarks/results_json.py "$FIGURES" plan "$(printf '%s\n' "${PLAN[@]}" | "$PY" -c \
  'import json, sys; print(json.dumps([{"step": s, "limit_s": int(t)} for s, t in (l.split() for l in sys.stdin)]))')"
if (( PLAN_TOTAL_S > PLAN_BUDGET_S )); then
  echo "PLAN OVER BUDGET: the limits sum to ${PLAN_TOTAL_S}s, more than ${PLAN_BUDGET_S}s"
  exit 1
fi

# The dry run's checks of the test plan against the tests themselves: the whole tree collected here, where every
# package is installed, says which files hold CUDA tests and how many.
check_test_plan() {
  local expected
  expected=$("$PY" $SAFE_PATH -m pytest -p no:cacheprovider -m cuda -q --collect-only --continue-on-collection-errors \
    tests 2>&1 | grep '::' | sed 's/::.*//' | sort | uniq -c)
  if [[ -z $expected ]]; then
    echo "TEST PLAN: collecting 'pytest -m cuda tests' found no tests"
    return 1
  fi
  local bad=0 count file entry name limit planned
  planned=$(printf '%s\n' "${PLAN[@]}" | sed -n 's/^test:\([^ ]*\) .*/\1/p')
  while read -r count file; do
    if ! grep -qx "$file" <<< "$planned"; then
      echo "TEST PLAN: $file holds $count CUDA tests and is not in the plan"
      bad=1
    fi
  done <<< "$expected"
  for entry in "${PLAN[@]}"; do
    read -r name limit <<< "$entry"
    [[ $name == test:* ]] || continue
    file=${name#test:}
    count=$(awk -v f="$file" '$2 == f {print $1}' <<< "$expected")
    count=${count:-0}
    local floor=$(( TEST_BASE_S + (count * TEST_PER_100_S + 99) / 100 ))
    printf '  %-46s %4s tests, limit %3ss >= %3ss\n' "$file" "$count" "$limit" "$floor"
    EXPECTED_COUNT[$file]=$count
    if (( count == 0 )); then
      echo "TEST PLAN: $file holds no CUDA test: remove it from the plan"
      bad=1
    elif (( limit < floor )); then
      echo "TEST PLAN: $file's limit ${limit}s is short of ${floor}s for its $count tests"
      bad=1
    fi
  done
  return "$bad"
}

declare -A EXPECTED_COUNT=()
COLLECTED=""  # the dry run's one collection of the planned files
TESTS_UNRUNNABLE=""
if (( DRY_RUN )); then
  echo
  echo "=== the CUDA test files (collected here with every package installed)"
  if ! check_test_plan; then
    echo "TEST PLAN FAILED"
    exit 1
  fi
  # Every planned file collected as the GPU run collects it (the GPU machine's imports), in one pytest process:
  # each test step below shows its file's line of it (a process a file would cost a torch start-up each).
  COLLECTED=$(mktemp)
  mapfile -t planned_files < <(printf '%s\n' "${PLAN[@]}" | sed -n 's/^test:\([^ ]*\) .*/\1/p')
  test_command "${planned_files[@]}" > "$COLLECTED" 2>&1
  echo "collected under the GPU machine's imports: rc=$? ($(grep -cE '^tests/.*: [0-9]+$' "$COLLECTED") files)"
fi

for entry in "${PLAN[@]}"; do
  read -r name limit <<< "$entry"
  run_step "$name" "$limit"
  rc=$?
  if [[ $name == install ]] && (( rc != 0 )); then
    echo "INSTALL FAILED: nothing else can run"
    exit 1
  fi
  if [[ $name == environment ]] && ! "$PY" -c "import pytest, hypothesis, ml_dtypes, numpy" 2>/dev/null; then
    TESTS_UNRUNNABLE="this machine's Python lacks pytest, hypothesis, ml_dtypes or numpy (see 'missing' above):"
    TESTS_UNRUNNABLE+=" carry them as wheels (docs/gpu_check.md); the benchmarks still run"
    echo "$TESTS_UNRUNNABLE"
  fi
  if (( DRY_RUN )) && [[ $name == test:* ]] && (( rc == 0 )); then
    file=${name#test:}
    collected=$(sed -n "s|^$file: \([0-9]*\)\$|\1|p" "$STEP_OUTPUT")
    if [[ ${collected:-0} != "${EXPECTED_COUNT[$file]}" ]]; then
      echo "COLLECTION SHORT: $file collects ${collected:-0} CUDA tests as the GPU machine would," \
        "${EXPECTED_COUNT[$file]} with every package"
      FAILED+=("$name(collected ${collected:-0} of ${EXPECTED_COUNT[$file]})")
    fi
  fi
done
rm -f "$STEP_OUTPUT" ${COLLECTED:+"$COLLECTED"}

echo
if (( ${#FAILED[@]} )); then
  echo "=== done in $(elapsed)s: FAILED ${FAILED[*]}"
  exit 1
fi
echo "=== done in $(elapsed)s: all steps passed"
