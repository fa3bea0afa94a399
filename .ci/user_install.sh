#!/usr/bin/env bash
# What a new user does, and nothing more: a fresh virtualenv, torch, fp8mp, import fp8mp, run the
# quickstart, uninstall. fp8mp comes from FP8MP_WHEEL when set (the wheel of `make wheel`: the
# user's path, `pip install fp8mp-*.whl`), else from `pip install .` with pip's default build
# isolation (no dev requirements, no flags; `make user-install-source`). The source is a copy of the checkout's files as a fresh clone has them
# (tracked and untracked, not ignored: no build/ or in-place .so), and everything runs outside it,
# so the installed package is what imports.
# The build is whatever `pip install .` does (FP8MP_CUDA and friends pass through if set).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.14.1}"
WORK="$(mktemp -d /tmp/fp8mp-user-install.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
start=$SECONDS
step() { echo "[user_install $((SECONDS - start))s] $*"; }

step "fresh venv in $WORK/venv"
"$PYTHON" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/python" -m pip --disable-pip-version-check --quiet)
step "pip install $TORCH_SPEC"
"${PIP[@]}" install "$TORCH_SPEC"
torch_done=$SECONDS
if [ -n "${FP8MP_WHEEL:-}" ]; then
    what="pip install $(basename "$FP8MP_WHEEL")"
    step "$what"
    "${PIP[@]}" install "$FP8MP_WHEEL"
else
    what="pip install ."
    step "copy the source (as a fresh clone) to $WORK/src"
    mkdir "$WORK/src"
    git -C "$REPO" ls-files -z --cached --others --exclude-standard | (cd "$REPO" && xargs -0 cp --parents -t "$WORK/src")
    step "pip install . (in $WORK/src)"
    (cd "$WORK/src" && "${PIP[@]}" install .)
fi
install_s=$((SECONDS - torch_done))
cd "$WORK"
step "import fp8mp"
"$WORK/venv/bin/python" -c "import fp8mp, sys; assert fp8mp.__file__.startswith('$WORK/venv/'), fp8mp.__file__; print('fp8mp', fp8mp.__version__, 'from', fp8mp.__file__)"
step "examples/quickstart.py"
"$WORK/venv/bin/python" "$REPO/examples/quickstart.py"
step "pip uninstall -y fp8mp"
"${PIP[@]}" uninstall -y fp8mp
if "$WORK/venv/bin/python" -c "import fp8mp" 2>/dev/null; then
    echo "user_install: fp8mp still imports after pip uninstall" >&2
    exit 1
fi
step "done: $what took ${install_s}s, everything $((SECONDS - start))s"
