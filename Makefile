# Two commands do everything on a fresh machine:
#   make demo   - create .venv, install pinned deps, build fp8mp, run the main example
#   make test   - same set-up, then Catch2 (ctest), pytest in .venv (torch 2.14.1), the user
#                 install (.ci/user_install.sh), and the same fp8mp wheel installed into fresh
#                 venvs with other torch versions (requirements-ci-torch*.txt), where what a torch
#                 version can change is tested again; it prints each stage's time at its end
#   make wheel  - dist/fp8mp-*.whl: one wheel for CPython >= 3.10 and torch >= 2.11
#   make docs   - the user guide (docs/, Sphinx) into build/docs, warnings as errors
#   make gpu-wheel - dist-gpu/fp8mp-*.whl: the same wheel with CUDA code for Hopper (9.0) only, what
#                 benchmarks/gpu_check.sh installs on a lent H100/H200 (docs/gpu_check.md); its dry run
#                 (make test-gpu-check-dry-run) is part of test-py, through tests/test_gpu_check.py
# FP8MP_CUDA=0 gives a quick CPU-only build; the default (auto) also compiles
# the CUDA kernels when torch is a CUDA build and nvcc is present.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FP8MP_CUDA ?= auto
MAX_JOBS ?= 2
export MAX_JOBS FP8MP_CUDA
export TORCH_CUDA_ARCH_LIST ?= 8.9;9.0;10.0;12.0+PTX
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda
endif
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# The venvs of make demo / make test get their pinned packages from uv (requirements-uv.txt, pinned): it
# installs a CUDA build of torch with what it needs in under a minute where pip takes about five, which keeps
# make test's four torch venvs within its time. pip's find-links (the machine's local torch wheels) are passed
# on; uv keeps no cache here, as pip keeps none (PIP_NO_CACHE_DIR below). The user's path stays pip's
# (.ci/user_install.sh, `pip install fp8mp-*.whl`).
UV := $(VENV)/bin/uv
UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(UV) pip install -q --no-cache $(addprefix --find-links ,$(UV_FIND_LINKS))
DEPS_STAMP := $(VENV)/.deps-stamp
BUILD_STAMP := $(VENV)/.build-stamp
MODE_FILE := $(VENV)/.fp8mp-cuda-mode
# Rewritten only when FP8MP_CUDA changes, so switching modes triggers a rebuild.
$(shell mkdir -p $(VENV); [ "$$(cat $(MODE_FILE) 2>/dev/null)" = "$(FP8MP_CUDA)" ] || echo "$(FP8MP_CUDA)" > $(MODE_FILE))

# torch versions the wheel is also tested with, each from requirements-ci-torch<V>.txt in .venv-torch<V>.
WHEEL_TORCHES ?= 211 212 215 213cpu
# What those venvs run (paths under the copied tests/, pytest options). .venv (torch 2.14.1) runs the whole
# suite. With the oldest (2.11) and newest (2.15) torch, as the stable-ABI promise needs: everything a torch
# version can change (the build, every op through the stable ABI, fakes, opcheck, autograd, dispatch, compile,
# the modules, scaling, training, the integrations, the layering), less the whole-run tests that only repeat
# those pieces at length (the examples' training runs, the fuzzer, the GPU check's dry run, the kill/resume,
# resharded-checkpoint and soak runs, the memory benchmark's CLI, the tensor-parallel torchrun runs); 2.12 (its
# dynamo differs from both: it once broke the compile tests alone) and the CPU build of 2.13 run the build, the
# ops, compile and a module on top. This keeps make test within 45 minutes on a 2-core machine
# (`make test-wheel-torch212 WHEEL_TESTS_212=` runs all of WHEEL_TESTS).
# tests/test_packaging.py and tests/test_docs_*.py are about the source checkout, so .venv runs them.
WHOLE_RUN_TESTS := tests/examples tests/test_fuzz.py tests/test_gpu_check.py tests/training/test_kill_resume.py \
  tests/training/test_soak.py tests/test_bench_train_memory.py tests/test_bench_step_in_backward.py \
  tests/optim/test_dcp_reshard.py tests/parallel/test_tensor_parallel.py tests/test_bench_fsdp.py \
  tests/test_loss_parity_memory_lean.py tests/test_bit_digests.py tests/planning/test_plan_precision.py
# The framework integrations run in .venv, against the frameworks' pinned releases (requirements-frameworks*.txt
# for torchtitan and TRL, which the wheel venvs do not install).
FRAMEWORK_TESTS := tests/integrations/test_lightning.py tests/integrations/test_accelerate.py \
  tests/integrations/test_torchtitan.py tests/integrations/test_trl.py
# fp8mp's own CPU dispatch (the ISA levels, the GEMM and optimizer loops a CPU takes): the same code under every
# torch, so .venv alone runs it.
CPU_PATH_TESTS := tests/ops/test_cpu_isa.py tests/optim/test_optim_cpu_paths.py
WHEEL_TESTS ?= tests --ignore=tests/test_packaging.py --ignore=tests/test_docs_paths.py --ignore=tests/test_docs_text.py \
  $(addprefix --ignore=,$(WHOLE_RUN_TESTS) $(FRAMEWORK_TESTS) $(CPU_PATH_TESTS))
TORCH_API_TESTS := tests/test_build.py tests/test_layers.py tests/ops/test_cast.py tests/ops/test_gemm.py \
  tests/ops/test_aliasing.py tests/ops/test_scale_update.py tests/ops/test_fake_checks.py tests/nn/test_linear.py \
  tests/nn/test_torch_autocast.py tests/optim/test_optimizers.py
WHEEL_TESTS_212 ?= $(TORCH_API_TESTS) tests/nn/test_compile_gpt.py tests/nn/test_threads.py
WHEEL_TESTS_213cpu ?= $(TORCH_API_TESTS)
# pytest's worker processes (pytest-xdist; a file's tests stay in one worker, so its module fixtures run once).
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadfile
# Each of those venvs holds a CUDA build of torch (~6 GB) and is removed once its tests pass, and pip keeps
# no cache (a CUDA torch adds ~3 GB there): CI's disk once ran out at the third venv. KEEP_WHEEL_VENVS=1 keeps
# them for a quicker rerun here.
KEEP_WHEEL_VENVS ?=
export PIP_NO_CACHE_DIR := 1
WHEEL_DIR := dist
WHEEL_STAMP := $(VENV)/.wheel-stamp

.PHONY: demo test docs test-cpp test-py test-wheels test-gpu-check-dry-run user-install user-install-source build wheel \
  gpu-wheel bench system-deps clean

demo: wheel
	$(PY) examples/train_gpt.py

# make test runs these in order, stops at the first that fails, and prints each one's time (.ci/stages).
TEST_STAGES := test-cpp test-py docs user-install $(addprefix test-wheel-torch,$(WHEEL_TORCHES))
test:
	@bash .ci/stages $(TEST_STAGES)

system-deps:
	@dpkg -s catch2 cmake >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq catch2 cmake; }

$(DEPS_STAMP): requirements-uv.txt requirements-dev.txt requirements-test.txt requirements-frameworks.txt \
  requirements-frameworks-nodeps.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-uv.txt
	$(UV_INSTALL) --python $(PY) -r requirements-dev.txt
	$(UV_INSTALL) --python $(PY) --no-deps -r requirements-frameworks-nodeps.txt
	touch $@

# One compilation: the in-place build (fp8mp/*.abi3.so, what pytest in the repo imports), then
# the wheel packs the same objects, and .venv gets the wheel (what examples/ import).
$(BUILD_STAMP): $(DEPS_STAMP) $(MODE_FILE) setup.py pyproject.toml $(wildcard csrc/* csrc/*/*)
	$(PY) setup.py -q build_ext --inplace
	touch $@

# The wheel also packs the Python package: a changed or new module rebuilds it (the compiled objects stay).
$(WHEEL_STAMP): $(BUILD_STAMP) $(shell find fp8mp -name '*.py' ! -name _build_info.py 2>/dev/null)
	rm -rf $(WHEEL_DIR) build/lib.*  # no stale files of an older build in the wheel
	$(PY) setup.py -q bdist_wheel -d $(WHEEL_DIR)
	ls -l $(WHEEL_DIR)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --force-reinstall $(WHEEL_DIR)/fp8mp-*.whl
	touch $@

build: $(BUILD_STAMP)

wheel: $(WHEEL_STAMP)

test-cpp: system-deps $(DEPS_STAMP)
	cmake -S . -B build/cmake -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" > /dev/null
	cmake --build build/cmake -j $(MAX_JOBS)
	ctest --test-dir build/cmake --output-on-failure

# --durations: the 25 slowest tests printed at the end, where CI time goes.
test-py: wheel
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --durations=25

# The wheel in a fresh venv per torch version, the suite run from a copy of tests/ outside the
# repo so that it imports the installed fp8mp, not the source tree.
test-wheels: $(addprefix test-wheel-torch,$(WHEEL_TORCHES))

test-wheel-torch%: wheel
	@df -h --output=avail . | tail -1 | xargs echo "disk free before .venv-torch$*:"
	@test -x .venv-torch$*/bin/python || $(PYTHON) -m venv .venv-torch$*
	$(UV_INSTALL) --python .venv-torch$*/bin/python -r requirements-ci-torch$*.txt
	.venv-torch$*/bin/python -m pip uninstall -q -y fp8mp 2>/dev/null || true
	.venv-torch$*/bin/python -m pip install -q --disable-pip-version-check $(WHEEL_DIR)/fp8mp-*.whl
	rm -rf build/wheel-tests-$* && mkdir -p build/wheel-tests-$* && cp -r tests examples benchmarks csrc pyproject.toml build/wheel-tests-$*/
	cd build/wheel-tests-$* && ../../.venv-torch$*/bin/python -c 'import fp8mp, torch; print("torch", torch.__version__, "|", fp8mp.cuda_kernels_status())' \
	  && ../../.venv-torch$*/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) $(or $(WHEEL_TESTS_$*),$(WHEEL_TESTS))
	$(if $(KEEP_WHEEL_VENVS),,rm -rf .venv-torch$* build/wheel-tests-$*)

# A fresh venv, torch, the wheel (the user's path), import, quickstart, uninstall: what a user does.
user-install: wheel
	FP8MP_WHEEL="$$(ls $(WHEEL_DIR)/fp8mp-*.whl)" .ci/user_install.sh

# The same from source: `pip install .` with build isolation (compiles everything again: minutes).
user-install-source:
	.ci/user_install.sh

# The guide imports the in-place build (docs/conf.py puts the checkout first on sys.path) for its API reference.
docs: $(BUILD_STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs build/docs
	@echo "docs: build/docs/index.html"
# The wheel benchmarks/gpu_check.sh carries to a lent Hopper GPU: CUDA code for 9.0 alone (GPU_WHEEL_ARCH),
# built from a copy of the sources in build/gpu-wheel/src so that neither the in-place build (fp8mp/*.so,
# fp8mp/ops/_build_info.py) nor dist/ changes; the copy keeps its ninja objects, so a rebuild compiles only
# what changed.
GPU_WHEEL_DIR := dist-gpu
GPU_WHEEL_SRC := build/gpu-wheel/src
GPU_WHEEL_ARCH ?= 9.0
# Beside it, dist-gpu/deps: wheels (for the GPU machine's Python, GPU_PYTHON) of what the check imports besides
# torch, at requirements-test.txt's pins; gpu_check.sh installs from there, without network, those the machine
# lacks. About 45 MB, within what the device tool carries (64 MiB with the working tree).
GPU_PYTHON ?= 3.12
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
GPU_CHECK_PACKAGES := numpy tqdm pytest hypothesis ml_dtypes matplotlib
space := $(subst ,, )
gpu-wheel: $(DEPS_STAMP)
	mkdir -p $(GPU_WHEEL_SRC)
	rm -rf $(GPU_WHEEL_SRC)/fp8mp $(GPU_WHEEL_SRC)/csrc
	cp -a fp8mp csrc setup.py pyproject.toml README.md $(GPU_WHEEL_SRC)/  # -a keeps mtimes: ninja stays incremental
	find $(GPU_WHEEL_SRC)/fp8mp \( -name '*.so' -o -name _build_info.py -o -name __pycache__ \) -prune -exec rm -rf {} +
	rm -rf $(GPU_WHEEL_DIR) $(GPU_WHEEL_SRC)/build/lib.*
	cd $(GPU_WHEEL_SRC) && FP8MP_CUDA=1 TORCH_CUDA_ARCH_LIST=$(GPU_WHEEL_ARCH) $(abspath $(PY)) setup.py -q bdist_wheel -d $(abspath $(GPU_WHEEL_DIR))
	grep -E '^($(subst $(space),|,$(GPU_CHECK_PACKAGES)))==' requirements-test.txt > $(GPU_WHEEL_DIR)/deps-requirements.txt
	$(PY) -m pip download -q --disable-pip-version-check --only-binary=:all: --implementation cp \
	  --python-version $(GPU_PYTHON) $(addprefix --platform ,$(GPU_PLATFORMS)) -d $(GPU_WHEEL_DIR)/deps \
	  -r $(GPU_WHEEL_DIR)/deps-requirements.txt
	ls -l $(GPU_WHEEL_DIR); du -sh $(GPU_WHEEL_DIR)/deps

bench: wheel
	$(PY) benchmarks/bench_cast.py

# benchmarks/gpu_check.sh --dry-run: the GPU check's plan and its test collection, here, without a GPU.
test-gpu-check-dry-run: build
	PYTHON=$(PY) bash benchmarks/gpu_check.sh --dry-run

clean:
	rm -rf build dist $(GPU_WHEEL_DIR) *.egg-info fp8mp/*.so fp8mp/ops/_build_info.py $(VENV) .venv-torch*
