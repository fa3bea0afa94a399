# Two commands do everything on a fresh machine:
#   make demo   - create .venv, install pinned deps, build fp8mp, run the main example
#   make test   - same set-up, then Catch2 (ctest), pytest and the user install (.ci/user_install.sh)
# FP8MP_CUDA=0 gives a quick CPU-only build; the default (auto) also compiles
# the CUDA kernels when torch is a CUDA build and nvcc is present.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FP8MP_CUDA ?= auto
MAX_JOBS ?= 2
export MAX_JOBS FP8MP_CUDA
export TORCH_CUDA_ARCH_LIST ?= 8.9;9.0
ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
export CUDA_HOME ?= /usr/local/cuda
endif
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

DEPS_STAMP := $(VENV)/.deps-stamp
BUILD_STAMP := $(VENV)/.build-stamp
MODE_FILE := $(VENV)/.fp8mp-cuda-mode
# Rewritten only when FP8MP_CUDA changes, so switching modes triggers a rebuild.
$(shell mkdir -p $(VENV); [ "$$(cat $(MODE_FILE) 2>/dev/null)" = "$(FP8MP_CUDA)" ] || echo "$(FP8MP_CUDA)" > $(MODE_FILE))

.PHONY: demo test test-cpp test-py user-install build bench system-deps clean

demo: build
	$(PY) examples/train_gpt.py

test: test-cpp test-py user-install

system-deps:
	@dpkg -s catch2 cmake >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq catch2 cmake; }

$(DEPS_STAMP): requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	touch $@

$(BUILD_STAMP): $(DEPS_STAMP) $(MODE_FILE) setup.py pyproject.toml $(wildcard csrc/* csrc/*/*)
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

build: $(BUILD_STAMP)

test-cpp: system-deps $(DEPS_STAMP)
	cmake -S . -B build/cmake -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja \
	  -DCMAKE_PREFIX_PATH="$$($(PY) -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" > /dev/null
	cmake --build build/cmake -j $(MAX_JOBS)
	ctest --test-dir build/cmake --output-on-failure

test-py: build
	$(PY) -m pytest -q

# A fresh venv, torch, `pip install .` (build isolation), import, quickstart, uninstall: what a user does.
user-install:
	.ci/user_install.sh

bench: build
	$(PY) benchmarks/bench_cast.py

clean:
	rm -rf build *.egg-info fp8mp/*.so $(VENV)
