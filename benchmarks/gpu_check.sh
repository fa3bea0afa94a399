#!/usr/bin/env bash
# The one prepared script for a lent GPU (H200, torch 2.11+cu130 preinstalled, Python 3.12,
# no network, 15 minutes of device time in all): builds fp8mp from source, runs the CUDA
# tests (CUDA vs CPU bit agreement for casts, GEMM vs reference, ...), then the GPU
# benchmarks. Everything goes to one log. Budget: under 8 minutes.
#
#   bash benchmarks/gpu_check.sh          # log and results in $OUT (device tool) or benchmarks/out
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-benchmarks/out}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
exec > >(tee "$LOG") 2>&1

export PYTHONUNBUFFERED=1 FP8MP_CUDA=1 MAX_JOBS=${MAX_JOBS:-16}
# Hopper only here: halves the build; CI builds 8.9;9.0.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
PY=${PYTHON:-python3}
started=$(date +%s)
step() { echo; echo "=== $* (t=$(( $(date +%s) - started ))s)"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
command -v nvcc && nvcc --version | tail -1

step "build (setup.py build_ext --inplace)"
if ! timeout 300 $PY setup.py build_ext --inplace -q; then
  echo "BUILD FAILED"
  exit 1
fi
export PYTHONPATH=$PWD
$PY -c "import fp8mp; assert fp8mp.cuda_kernels_available(), 'CUDA kernels missing'; print('fp8mp CUDA kernels: OK')"

step "CUDA tests (pytest -m cuda)"
timeout 200 $PY -m pytest -q -m cuda -p no:cacheprovider tests/
test_rc=$?

step "GPU benchmarks (benchmarks/run_all.py --device cuda)"
timeout 240 $PY benchmarks/run_all.py --device cuda --out "$OUT_DIR/RESULTS_cuda.md"
bench_rc=$?
cat "$OUT_DIR/RESULTS_cuda.md" 2>/dev/null

step "done: tests rc=$test_rc, benchmarks rc=$bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
