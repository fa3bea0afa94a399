"""Every repository path that the docs, the code comments and the docstrings name exists.

A path is a word that starts with one of the repository's top folders (`csrc/`, `fp8mp/`, `tests/`,
`benchmarks/`, `examples/`, `docs/`, `.ci/`) and ends with a file extension (`csrc/ops.cpp`) or a slash
(`csrc/blockwise/`). Words inside URLs, globs (`fp8mp/*.so`) and templates (`bench_<name>.py`) are not
paths. A link that climbs out of its folder (`../benchmarks/RESULTS.md` in docs/) names the path after
the climb.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_FOLDERS = ("csrc", "fp8mp", "tests", "benchmarks", "examples", "docs", ".ci")
_TOP = "|".join(re.escape(folder) for folder in TOP_FOLDERS)
PATH = re.compile(
    r"(?<![\w./\-*])"                                   # not the tail of a URL, a longer path or a glob
    rf"((?:{_TOP})/(?:[\w\-.]+/)*(?:[\w\-]+(?:\.[\w\-]+)*\.[A-Za-z0-9]+)?)"  # folders, then a file.ext or nothing
    r"(?![\w/*<{])"                                     # a whole word: no glob or template continues it
)
CLIMB = re.compile(rf"(?<![\w.])(?:\.\./)+(?=(?:{_TOP})/)")
CODE_SUFFIXES = (".py", ".h", ".cpp", ".cu", ".cuh", ".sh", ".md")
TOP_FILES = ("README.md", "Makefile", "setup.py", "CMakeLists.txt", "benchmarks/RESULTS.md")
# Named in the docs but written by a build or a run, never committed (each must stay git-ignored).
OUTPUTS = {
    "fp8mp/_C.abi3.so": "the build (setup.py)",
    "fp8mp/_cuda_ops.abi3.so": "the CUDA build (setup.py)",
    "fp8mp/ops/_build_info.py": "the build (setup.py)",
    "examples/out/": "examples/train_gpt.py",
    "benchmarks/out/": "benchmarks/gpu_check.sh",
}


def named_paths(text: str) -> list[tuple[int, str]]:
    """(line number, path) of every repository path `text` names."""
    text = CLIMB.sub("", text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in PATH.finditer(text) if m.group(1)]


def scanned_files() -> list[str]:
    """The tracked files whose text names paths: docs, benchmark results, code with its comments."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [path for path in listed.split()
            if path in TOP_FILES or (path.startswith("docs/") and path.endswith(".md"))
            or (path.split("/")[0] in ("fp8mp", "csrc", "tests", "benchmarks", "examples")
                and path.endswith(CODE_SUFFIXES))]


def is_output(path: str) -> bool:
    return path in OUTPUTS or any(path.startswith(out) for out in OUTPUTS if out.endswith("/"))


def missing_paths(files: list[str]) -> list[str]:
    missing = []
    for name in files:
        with open(os.path.join(REPO, name), encoding="utf-8") as f:
            text = f.read()
        for line, path in named_paths(text):
            if not os.path.exists(os.path.join(REPO, path)) and not is_output(path):
                missing.append(f"{name}:{line}: {path}")
    return missing


needs_checkout = pytest.mark.skipif(not os.path.isdir(os.path.join(REPO, ".git")) and
                                    not os.path.isfile(os.path.join(REPO, ".git")),
                                    reason="not a git checkout of fp8mp (a copy of tests/ only)")


def test_the_pattern_finds_paths_and_only_paths():
    text = ("see csrc/common/fp8_format.h, the folder csrc/blockwise/ and tests/ops/test_cast.py::test_x;\n"
            "[plot](../benchmarks/RESULTS_speedup_cpu.png) and `fp8mp/quantized/stored_weight.py`.\n"
            "not: https://example.org/docs/index.html, fp8mp/*.abi3.so, benchmarks/bench_<name>.py, "
            "csrc/<family>/x.h, fp8mp.nn.Linear, my_tests/a.py, benchmarks/out, csrc/cast/x.{h,cpp}\n")
    assert [path for _, path in named_paths(text)] == [
        "csrc/common/fp8_format.h", "csrc/blockwise/", "tests/ops/test_cast.py",
        "benchmarks/RESULTS_speedup_cpu.png", "fp8mp/quantized/stored_weight.py"]
    assert named_paths("a\nb csrc/ops.cpp") == [(2, "csrc/ops.cpp")]


@needs_checkout
def test_a_dead_path_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    dead = "csrc/" + "fp8_format.h"  # in two pieces, so that this file names no dead path itself
    (tmp_path / "README.md").write_text(f"the encoder is in {dead}\n")
    assert missing_paths(["README.md"]) == [f"README.md:1: {dead}"]


@needs_checkout
def test_every_path_the_docs_and_the_code_name_exists():
    files = scanned_files()
    assert "README.md" in files and "csrc/ops.cpp" in files and "fp8mp/__init__.py" in files
    assert missing_paths(files) == []


@needs_checkout
@pytest.mark.parametrize("path", sorted(OUTPUTS))
def test_the_named_outputs_are_never_committed(path):
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO)
    assert ignored.returncode == 0, f"{path} (written by {OUTPUTS[path]}) is named as an output but not git-ignored"


@needs_checkout
@pytest.mark.parametrize("package", ["csrc", "fp8mp"])
def test_the_architecture_page_names_every_folder(package):
    folders = sorted(entry.name for entry in os.scandir(os.path.join(REPO, package))
                     if entry.is_dir() and not entry.name.startswith(("_", ".")))
    with open(os.path.join(REPO, "docs", "architecture.md"), encoding="utf-8") as f:
        page = f.read()
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert [folder for folder in folders if f"{package}/{folder}/" not in page] == []
    if package == "csrc":  # README's layout lists the op families by folder
        assert [folder for folder in folders if f"{folder}/" not in readme] == []
