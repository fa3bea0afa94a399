"""fp8_gemm's CPU paths side by side: FP8 -> fp32 + an IEEE fp32 GEMM, and fp8mp's AVX512-BF16 and
AMX kernels (csrc/gemm/cpu_gemm_path.h). The path is fixed once per process, so each runs in its own
subprocess (FP8MP_CPU_GEMM=fp32|avx512bf16|amx), timing
torch's fp32 and bf16 mm in the same process as peers; the automatic choice is printed too (a path
this CPU lacks falls back to fp32, shown in the "forced path" column).

    python benchmarks/bench_gemm_paths.py [--sizes 512x1024x1024,2048x2048x2048,4096x1024x1024]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = ("import json, sys, bench_gemm; from fp8mp.ops import cpu_gemm_path; "
         "rows = bench_gemm.run('cpu', sys.argv[1]); print(json.dumps({'path': cpu_gemm_path(), 'rows': rows}))")
PEERS = ["fp32 mm", "bf16 mm"]
DEFAULT_SIZES = "512x1024x1024,2048x2048x2048,4096x1024x1024"


def run_path(path: str, sizes: str) -> dict:
    env = dict(os.environ, FP8MP_CPU_GEMM=path, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
    done = subprocess.run([sys.executable, "-c", CHILD, sizes], env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(device: str, sizes: str = DEFAULT_SIZES) -> list[dict]:
    if device != "cpu":
        raise SystemExit("the CPU GEMM paths are CPU only")
    rows = []
    for path in ("fp32", "avx512bf16", "amx"):
        result = run_path(path, sizes)
        rows += [dict(r, path=result["path"]) for r in result["rows"]]
    return rows


def table(rows: list[dict], device: str) -> str:
    from timing import markdown_table
    from fp8mp.ops import cpu_gemm_path
    headers = ["M x K x N", "forced path", "fp8mp ms"] + [f"{p} ms" for p in PEERS] + [f"vs {p}" for p in PEERS]
    cells = [[r["shape"], r["path"], f"{r['fp8mp'] * 1e3:.2f}"] + [f"{r[p] * 1e3:.2f}" for p in PEERS]
             + [f"{r[p] / r['fp8mp']:.2f}x" for p in PEERS] for r in rows]
    return markdown_table(f"fp8_gemm CPU paths (e4m3 x e4m3 -> bf16), automatic choice here: {cpu_gemm_path()}",
                          headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES)
    args = parser.parse_args()
    print(table(run("cpu", args.sizes), "cpu"))
    print("ratio = peer time / fp8mp time (> 1: fp8mp faster)")


if __name__ == "__main__":
    main()
