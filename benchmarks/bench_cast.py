"""Fused FP8 cast + amax (and + transpose) vs torch eager and vs a plain copy.

Peers, measured in the same run on the same input:
  eager:  amax = x.abs().amax(); y = (x * scale).clamp(-max, max).to(fp8)   (what users write without fp8mp)
          (+ y.t().contiguous() for the transpose variant)
  clone:  x.clone()                                                          (memory-bandwidth yardstick)
Ratios: eager time / fp8mp time (speed-up), and fp8mp's bandwidth / clone's bandwidth, where
bandwidth counts the bytes each op must move (cast: read x, write 1 byte per element per output;
clone: read + write x).

    python benchmarks/bench_cast.py [--device cpu|cuda] [--sizes 1M,4M,16M,64M] [--dtype float32] [--transpose]
"""
from __future__ import annotations

import argparse

import torch

import fp8mp
from fp8mp.ops.format import FP8_DTYPES, FP8_MAX

from results_json import record
from timing import cpu_matrix_units, format_size, markdown_table, parse_size, time_peers, where

DEFAULT_SIZES = {"cpu": "1M,4M,16M,64M", "cuda": "1M,16M,64M,256M"}


def bench_one(numel: int, dtype: torch.dtype, device: str, transpose: bool, fmt: str = "e4m3", cols: int = 4096) -> dict:
    x = torch.randn(max(1, numel // cols), cols, dtype=dtype, device=device)
    scale = torch.tensor([2.0], device=device)
    amax = torch.zeros(1, device=device)
    fp8_dtype, fp8_max = FP8_DTYPES[fmt], FP8_MAX[fmt]

    def eager():
        amax.copy_(x.abs().amax())
        y = (x.float() * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
        return (y, y.t().contiguous()) if transpose else y

    if transpose:
        def fused():
            return fp8mp.cast_to_fp8_transpose(x, scale, amax, fmt)
    else:
        def fused():
            return fp8mp.cast_to_fp8(x, scale, amax, fmt)

    # All three warmed up before any is timed (timing.time_peers): timed first in a fresh process, fused's 2 MiB
    # outputs at 1M elements got fresh pages in about half the runs (600+ page faults a call, 3x the time).
    timed = time_peers({"fused": fused, "eager": eager, "clone": lambda: x.clone()}, device)
    t_fused, t_eager, t_clone = (timed[name][0] for name in ("fused", "eager", "clone"))
    in_bytes = x.numel() * x.element_size()
    fused_bytes = in_bytes + x.numel() * (2 if transpose else 1)
    return {
        "numel": x.numel(), "transpose": transpose, "dtype": str(dtype).replace("torch.", ""),
        "fp8mp_ms": t_fused * 1e3, "eager_ms": t_eager * 1e3, "clone_ms": t_clone * 1e3,
        "speedup_vs_eager": t_eager / t_fused,
        "fp8mp_GBps": fused_bytes / t_fused / 1e9, "clone_GBps": 2 * in_bytes / t_clone / 1e9,
        "bandwidth_vs_clone": (fused_bytes / t_fused) / (2 * in_bytes / t_clone),
        "faults": (timed["fused"][1], timed["clone"][1]),
    }


def run(device: str, sizes: str | None = None, dtype: str = "float32", transpose: bool = False,
        cols: int = 4096) -> list[dict]:
    numels = [parse_size(s) for s in (sizes or DEFAULT_SIZES[device]).split(",")]
    return [bench_one(n, getattr(torch, dtype), device, transpose, cols=cols) for n in numels]


def goal_line(rows: list[dict], goal: float) -> str:
    """'goal ... met' / 'NOT met' for the bandwidth of fp8mp against x.clone()'s, per row."""
    worst = min(r["bandwidth_vs_clone"] for r in rows)
    verdict = "met" if worst >= goal else "NOT met"
    return f"goal: bandwidth >= {goal:.0%} of x.clone(): {verdict} (worst {worst:.0%})"


def table(rows: list[dict], device: str) -> str:
    op = "cast_to_fp8_transpose" if rows[0]["transpose"] else "cast_to_fp8"
    # Page faults per call: a clone whose output glibc maps afresh each call (64 MiB and up) pays about 1 us per
    # 4 KiB page, which then flatters the ratio against it.
    headers = ["elements", "fp8mp ms", "eager ms", "clone ms", "speed-up vs eager", "fp8mp GB/s", "clone GB/s",
               "bandwidth vs clone", "page faults / call (fp8mp, clone)"]
    cells = [[format_size(r["numel"]), f"{r['fp8mp_ms']:.2f}", f"{r['eager_ms']:.2f}", f"{r['clone_ms']:.2f}",
              f"{r['speedup_vs_eager']:.2f}x", f"{r['fp8mp_GBps']:.1f}", f"{r['clone_GBps']:.1f}",
              f"{r['bandwidth_vs_clone']:.0%}", "{:.0f}, {:.0f}".format(*r["faults"])] for r in rows]
    return markdown_table(f"{op} + amax, {rows[0]['dtype']} -> e4m3, {where(device)}", headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default=None, help="comma-separated element counts, e.g. 1M,16M")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--transpose", action="store_true", help="benchmark cast_to_fp8_transpose")
    parser.add_argument("--cols", type=int, default=4096, help="columns of the 2-D input (rows = elements / cols)")
    parser.add_argument("--goal", type=float, default=None, help="print whether bandwidth vs clone reaches this")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    rows = run(args.device, args.sizes, args.dtype, args.transpose, args.cols)
    print(table(rows, args.device))
    if args.device == "cpu":
        print(f"\nCPU: {cpu_matrix_units()}")
    if args.goal is not None:
        print(goal_line(rows, args.goal))
    record(args.json, "cast_transpose" if args.transpose else "cast", rows)


if __name__ == "__main__":
    main()
