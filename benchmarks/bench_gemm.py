"""Benchmark fp8mp.fp8_gemm against torch._scaled_mm and fp32/bf16 torch.matmul.

    python benchmarks/bench_gemm.py                       # CUDA if available, else CPU
    python benchmarks/bench_gemm.py --device cpu --sizes 512x1024x1024,2048x2048x2048
    python benchmarks/bench_gemm.py --device cuda --sizes 4096x4096x4096,8192x8192x8192

Sizes are MxKxN: out[M, N] = a[M, K] @ b[N, K].T (the nn.Linear layout), bf16
output, no bias. Each time is the median of timed calls after every peer has run
once (timing.time_peers: which of them gets fresh pages from the kernel otherwise
depends on the order they run in); the page faults per call are printed. Ratio
columns are (time of the peer) / (time of fp8mp): above 1 means fp8mp is faster.
The fp32/bf16 peers multiply already-converted tensors (what an unquantized
nn.Linear would run), so they exclude any cast cost.
"""
from __future__ import annotations

import argparse
import time

import torch

import fp8mp

from results_json import record
from timing import markdown_table, median_time, parse_shapes, time_peers, where

# CPU: a small size and the two of the CPU GEMM goal (>= 1.0x bf16 mm at 2048^3 and 4096x1024x1024).
DEFAULT_SIZES = {"cpu": "512x1024x1024,2048x2048x2048,4096x1024x1024", "cuda": "1024x1024x1024,4096x4096x4096,8192x8192x8192"}


def bench_size(M: int, K: int, N: int, device: str, fast_accum: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=gen).to(device)
    w = (torch.randn(N, K, generator=gen) * 0.05).to(device)
    a, b = x.to(torch.float8_e4m3fn), (w * 16).to(torch.float8_e4m3fn)
    sa = torch.ones(1, device=device)
    sb = torch.full((1,), 1 / 16, device=device)
    x_bf16, w_bf16 = x.bfloat16(), w.bfloat16()
    peers = {
        "fp8mp": lambda: fp8mp.fp8_gemm(a, sa, b, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum),
        "fp32 mm": lambda: torch.matmul(x, w.t()),
        "bf16 mm": lambda: torch.matmul(x_bf16, w_bf16.t()),
    }
    timed = time_peers(peers, device)
    row = {name: seconds for name, (seconds, _) in timed.items()}
    row["faults"] = {name: faults for name, (_, faults) in timed.items()}

    def scaled_mm():
        return torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum)

    try:
        row["_scaled_mm"] = slow_peer_time(scaled_mm, 2 * M * K * N) if device == "cpu" else median_time(scaled_mm, device)
    except (RuntimeError, NotImplementedError) as e:  # e.g. _scaled_mm missing for this device/shape
        print(f"  _scaled_mm failed for {M}x{K}x{N}: {str(e).splitlines()[0]}")
        row["_scaled_mm"] = float("nan")
    row.update(shape=f"{M}x{K}x{N}", tflops=2 * M * K * N / row["fp8mp"] / 1e12)
    return row


PEERS = ["_scaled_mm", "fp32 mm", "bf16 mm"]

# torch._scaled_mm on CPU runs oneDNN's FP8 matmul, which on some CPUs is a reference kernel: 8.6 s for
# 512x1024x1024 on a Xeon with AMX (2026-12-05). Once one call has run below this rate, larger sizes
# are not run (NaN, with a note), and a call over a second is timed once rather than repeated.
SLOW_FLOPS_PER_S = 1e9
_slow_rate = {"flops_per_s": None}


def slow_peer_time(fn, flops: int) -> float:
    rate = _slow_rate["flops_per_s"]
    if rate is not None and rate < SLOW_FLOPS_PER_S:
        print(f"  _scaled_mm skipped: about {flops / rate:.0f} s per call here ({rate / 1e9:.3f} GFLOP/s)")
        return float("nan")
    started = time.perf_counter()
    fn()
    once = time.perf_counter() - started
    _slow_rate["flops_per_s"] = flops / once
    return once if once > 1.0 else median_time(fn, "cpu")


def run(device: str, sizes: str | None = None, fast_accum: bool = False) -> list[dict]:
    return [bench_size(M, K, N, device, fast_accum) for M, K, N in parse_shapes(sizes or DEFAULT_SIZES[device])]


def table(rows: list[dict], device: str) -> str:
    headers = (["M x K x N", "fp8mp ms", "fp8mp TFLOP/s"] + [f"{p} ms" for p in PEERS] + [f"vs {p}" for p in PEERS]
               + ["page faults / call (fp8mp, bf16 mm)"])
    cells = [[r["shape"], f"{r['fp8mp'] * 1e3:.3f}", f"{r['tflops']:.3f}"] + [f"{r[p] * 1e3:.3f}" for p in PEERS]
             + [f"{r[p] / r['fp8mp']:.2f}x" for p in PEERS]
             + [f"{r['faults']['fp8mp']:.0f}, {r['faults']['bf16 mm']:.0f}"] for r in rows]
    return markdown_table(f"fp8_gemm (e4m3 x e4m3 -> bf16), {where(device)}", headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if fp8mp.cuda_kernels_available() else "cpu")
    parser.add_argument("--sizes", default=None, help="comma-separated MxKxN (default depends on device)")
    parser.add_argument("--fast-accum", action="store_true", help="use_fast_accum for fp8mp and _scaled_mm (CUDA only)")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        parser.error("--device cuda needs a CUDA device and fp8mp built with its CUDA kernels")
    rows = run(args.device, args.sizes, args.fast_accum)
    print(table(rows, args.device))
    print("ratio = peer time / fp8mp time (> 1: fp8mp faster)")
    record(args.json, "gemm_fast_accum" if args.fast_accum else "gemm", rows)


if __name__ == "__main__":
    main()
