"""Fused FP8 cast + amax vs torch eager and vs a plain copy, on CPU (and CUDA when available).

Peers, measured in the same run on the same input:
  eager:  amax = x.abs().amax(); y = (x * scale).clamp(-max, max).to(fp8)   (what users write without fp8mp)
  clone:  x.clone()                                                          (memory-bandwidth yardstick)
Ratios printed: eager_time / fp8mp_time (speed-up) and bandwidth of fp8mp / bandwidth of clone,
where bandwidth counts the bytes each op must move (cast: read x, write 1 byte/element; clone: read + write x).

    python benchmarks/bench_cast.py [--device cpu|cuda] [--sizes 1M,4M,16M,64M] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse
import time

import torch

import fp8mp
from fp8mp.fp8_format import FP8_DTYPES, FP8_MAX


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def median_time(fn, device: str, min_repeats: int = 5, min_seconds: float = 0.3) -> float:
    """Median wall time of fn() in seconds, after one warm-up call."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    start_all = time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start_all < min_seconds:
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
        if len(times) >= 200:
            break
    times.sort()
    return times[len(times) // 2]


def bench_one(numel: int, dtype: torch.dtype, device: str, fmt: str = "e4m3", transpose: bool = False) -> dict:
    cols = 4096
    x = torch.randn(numel // cols, cols, dtype=dtype, device=device)
    scale = torch.tensor([2.0], device=device)
    amax = torch.zeros(1, device=device)
    fp8_dtype, fp8_max = FP8_DTYPES[fmt], FP8_MAX[fmt]

    if transpose:
        def fused():
            return fp8mp.cast_to_fp8_transpose(x, scale, amax, fmt)

        def eager():
            amax.copy_(x.abs().amax())
            y = (x.float() * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
            return y, y.t().contiguous()
    else:
        def fused():
            return fp8mp.cast_to_fp8(x, scale, amax, fmt)

        def eager():
            amax.copy_(x.abs().amax())
            return (x.float() * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)

    t_fused = median_time(fused, device)
    t_eager = median_time(eager, device)
    t_clone = median_time(lambda: x.clone(), device)
    in_bytes = x.numel() * x.element_size()
    fused_bytes = in_bytes + x.numel() * (2 if transpose else 1)
    return {
        "numel": x.numel(),
        "fp8mp_ms": t_fused * 1e3,
        "eager_ms": t_eager * 1e3,
        "clone_ms": t_clone * 1e3,
        "speedup_vs_eager": t_eager / t_fused,
        "fp8mp_GBps": fused_bytes / t_fused / 1e9,
        "clone_GBps": 2 * in_bytes / t_clone / 1e9,
        "bandwidth_vs_clone": (fused_bytes / t_fused) / (2 * in_bytes / t_clone),
    }


def run(device: str, sizes: list[int], dtype: torch.dtype, transpose: bool = False) -> list[dict]:
    rows = []
    for numel in sizes:
        row = bench_one(numel, dtype, device, transpose=transpose)
        row["transpose"] = transpose
        rows.append(row)
    return rows


def format_table(rows: list[dict], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| elements | fp8mp ms | eager ms | clone ms | speed-up vs eager | fp8mp GB/s | clone GB/s | bandwidth vs clone |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['numel'] / 2**20:.0f}M | {r['fp8mp_ms']:.2f} | {r['eager_ms']:.2f} | {r['clone_ms']:.2f} | "
            f"{r['speedup_vs_eager']:.2f}x | {r['fp8mp_GBps']:.1f} | {r['clone_GBps']:.1f} | {r['bandwidth_vs_clone']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default="1M,4M,16M,64M")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--transpose", action="store_true", help="benchmark cast_to_fp8_transpose")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    dtype = getattr(torch, args.dtype)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = run(args.device, sizes, dtype, args.transpose)
    op = "cast_to_fp8_transpose" if args.transpose else "cast_to_fp8"
    print(format_table(rows, f"{op}, {args.dtype} -> e4m3, {args.device}, {torch.get_num_threads()} threads"))


if __name__ == "__main__":
    main()
