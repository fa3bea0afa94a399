"""Build-time look at the machine code of the torch-free CUDA kernels, no GPU needed.

A kernel file is compiled for sm_90 with nvcc and disassembled with cuobjdump
(from the CUDA toolkit or the triton wheel); `global_accesses` counts, per
kernel, the global load/store instructions by width (LDG.E.128, STG.E.U8, ...).
"""
from __future__ import annotations

import collections
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cuda_home() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


def find_nvcc() -> str | None:
    candidate = _cuda_home() / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else shutil.which("nvcc")


def find_cuobjdump() -> str | None:
    for candidate in (_cuda_home() / "bin" / "cuobjdump",):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        bundled = pathlib.Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if bundled.exists():
            return str(bundled)
    return None


def compile_sass(source: str, out_dir: pathlib.Path, arch: str = "sm_90") -> str:
    """SASS text of csrc/<source> compiled for `arch`."""
    cubin = out_dir / (pathlib.Path(source).stem + ".cubin")
    subprocess.run([find_nvcc(), "-std=c++17", "-O3", f"-arch={arch}", "-cubin", "-I", str(ROOT / "csrc"),
                    str(ROOT / "csrc" / source), "-o", str(cubin)], check=True, capture_output=True, text=True)
    return subprocess.run([find_cuobjdump(), "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout


def global_accesses(sass: str) -> dict[str, collections.Counter]:
    """{mangled kernel name: Counter of 'LDG.E.128', 'STG.E.U8', ...} (the .CONSTANT cache hint dropped)."""
    per_kernel: dict[str, collections.Counter] = {}
    current = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = per_kernel.setdefault(m.group(1), collections.Counter())
            continue
        m = re.search(r"\b((?:LDG|STG)(?:\.[A-Z0-9]+)*)", line)
        if m and current is not None:
            current[m.group(1).replace(".CONSTANT", "")] += 1
    return per_kernel


def kernels(per_kernel: dict[str, collections.Counter], *name_parts: str) -> dict[str, collections.Counter]:
    return {k: v for k, v in per_kernel.items() if all(p in k for p in name_parts)}
