"""Benchmark fp8mp.fp8_gemm against torch._scaled_mm and fp32/bf16 torch.matmul.

    python benchmarks/bench_gemm.py                       # CUDA if available, else CPU
    python benchmarks/bench_gemm.py --device cpu --sizes 512x1024x1024,2048x2048x2048
    python benchmarks/bench_gemm.py --device cuda --sizes 4096x4096x4096,8192x8192x8192

Sizes are MxKxN: out[M, N] = a[M, K] @ b[N, K].T (the nn.Linear layout), bf16
output, no bias. Each time is the median of --repeats timed calls after a
warm-up. Ratio columns are (time of the peer) / (time of fp8mp): above 1 means
fp8mp is faster. The fp32/bf16 peers multiply already-converted tensors (what
an unquantized nn.Linear would run), so they exclude any cast cost.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import fp8mp

DEFAULT_SIZES = {"cpu": "512x1024x1024,2048x2048x2048", "cuda": "1024x1024x1024,4096x4096x4096,8192x8192x8192"}


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"size {item!r} is not MxKxN")
        sizes.append(tuple(int(p) for p in parts))
    return sizes


def median_seconds(fn, device: str, repeats: int) -> float:
    fn()  # warm-up (allocations, cuBLASLt heuristics, thread pools)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_size(M: int, K: int, N: int, device: str, repeats: int, fast_accum: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=gen).to(device)
    w = (torch.randn(N, K, generator=gen) * 0.05).to(device)
    a, b = x.to(torch.float8_e4m3fn), (w * 16).to(torch.float8_e4m3fn)
    sa = torch.ones(1, device=device)
    sb = torch.full((1,), 1 / 16, device=device)
    x_bf16, w_bf16 = x.bfloat16(), w.bfloat16()
    peers = {
        "fp8mp": lambda: fp8mp.fp8_gemm(a, sa, b, sb, out_dtype=torch.bfloat16, use_fast_accum=fast_accum),
        "_scaled_mm": lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                               use_fast_accum=fast_accum),
        "fp32 mm": lambda: torch.matmul(x, w.t()),
        "bf16 mm": lambda: torch.matmul(x_bf16, w_bf16.t()),
    }
    row = {}
    for name, fn in peers.items():
        try:
            row[name] = median_seconds(fn, device, repeats)
        except (RuntimeError, NotImplementedError) as e:  # e.g. _scaled_mm missing for this device/shape
            print(f"  {name} failed for {M}x{K}x{N}: {str(e).splitlines()[0]}")
            row[name] = float("nan")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if fp8mp.cuda_kernels_available() else "cpu")
    parser.add_argument("--sizes", type=parse_sizes, default=None, help="comma-separated MxKxN (default depends on device)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (default: cpu 5, cuda 50)")
    parser.add_argument("--fast-accum", action="store_true", help="use_fast_accum for fp8mp and _scaled_mm (CUDA only)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        parser.error("--device cuda needs a CUDA device and fp8mp built with its CUDA kernels")
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES[args.device])
    repeats = args.repeats or (5 if args.device == "cpu" else 50)

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"fp8_gemm benchmark on {where}; torch {torch.__version__}; bf16 out, e4m3 x e4m3, median of {repeats}")
    names = ["fp8mp", "_scaled_mm", "fp32 mm", "bf16 mm"]
    header = f"{'M x K x N':>20} | {'fp8mp ms':>9} {'TFLOP/s':>8} | " + " | ".join(f"{n + ' ms':>13} {'ratio':>6}" for n in names[1:])
    print(header)
    print("-" * len(header))
    for M, K, N in sizes:
        row = bench_size(M, K, N, args.device, repeats, args.fast_accum)
        ours = row["fp8mp"]
        tflops = 2 * M * K * N / ours / 1e12
        cells = " | ".join(f"{row[n] * 1e3:13.3f} {row[n] / ours:6.2f}" for n in names[1:])
        print(f"{f'{M}x{K}x{N}':>20} | {ours * 1e3:9.3f} {tflops:8.3f} | {cells}")
    print("ratio = peer time / fp8mp time (> 1: fp8mp faster)")


if __name__ == "__main__":
    main()
