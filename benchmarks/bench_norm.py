"""Fused LayerNorm / RMSNorm + FP8 cast + amax vs torch's norm followed by a cast, on CPU (and CUDA when available).

Peer, measured in the same run on the same input (what users write without fp8mp):
  y = F.layer_norm(x, (H,), w, b)        (or F.rms_norm(x, (H,), w))
  amax = y.abs().amax(); y8 = y.clamp(-448, 448).to(torch.float8_e4m3fn)
fp8mp: layernorm_fwd_fp8 / rmsnorm_fwd_fp8 (one pass writes FP8, mean/rstd and amax).
Ratio printed: peer time / fp8mp time (> 1: fp8mp is faster). The high-precision
fp8mp op (layernorm_fwd / rmsnorm_fwd) vs torch's norm alone is shown too.

    python benchmarks/bench_norm.py [--device cpu|cuda] [--shapes 8192x1024,16384x4096] [--dtype float32|bfloat16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import markdown_table, median_time, parse_shapes, where  # noqa: E402

import fp8mp  # noqa: E402,F401


def bench_one(norm: str, rows: int, hidden: int, dtype: torch.dtype, device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, dtype=dtype, device=device, generator=gen)
    w = torch.randn(hidden, dtype=dtype, device=device, generator=gen)
    b = torch.randn(hidden, dtype=dtype, device=device, generator=gen)
    scale = torch.tensor([2.0], device=device)
    amax = torch.zeros(1, device=device)

    if norm == "layernorm":
        def fused():
            return torch.ops.fp8mp.layernorm_fwd_fp8(x, w, b, 1e-5, False, scale, amax, "e4m3")

        def ours_hp():
            return torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, False)

        def torch_hp():
            return F.layer_norm(x, (hidden,), w, b, 1e-5)
    else:
        def fused():
            return torch.ops.fp8mp.rmsnorm_fwd_fp8(x, w, 1e-6, False, scale, amax, "e4m3")

        def ours_hp():
            return torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, False)

        def torch_hp():
            return F.rms_norm(x, (hidden,), w, 1e-6)

    def peer():
        y = torch_hp()
        amax.copy_(y.abs().amax())
        return (y * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

    t_fused, t_peer = median_time(fused, device), median_time(peer, device)
    t_ours_hp, t_torch_hp = median_time(ours_hp, device), median_time(torch_hp, device)
    return {
        "norm": norm,
        "shape": f"{rows}x{hidden}",
        "fused_ms": t_fused * 1e3,
        "peer_ms": t_peer * 1e3,
        "ratio": t_peer / t_fused,
        "ours_hp_ms": t_ours_hp * 1e3,
        "torch_hp_ms": t_torch_hp * 1e3,
        "hp_ratio": t_torch_hp / t_ours_hp,
    }


DEFAULT_SHAPES = {"cpu": "8192x1024,16384x4096", "cuda": "16384x4096,65536x8192"}


def run(device: str, shapes: str | None = None, dtype: str = "float32") -> list[dict]:
    rows = [bench_one(norm, r, h, getattr(torch, dtype), device)
            for norm in ("layernorm", "rmsnorm") for r, h in parse_shapes(shapes or DEFAULT_SHAPES[device])]
    for row in rows:
        row["dtype"] = dtype
    return rows


def table(rows: list[dict], device: str) -> str:
    headers = ["norm", "shape", "fp8mp fused ms", "torch norm + cast ms", "vs torch norm + cast", "fp8mp norm ms",
               "torch norm ms", "vs torch norm"]
    cells = [[r["norm"], r["shape"], f"{r['fused_ms']:.2f}", f"{r['peer_ms']:.2f}", f"{r['ratio']:.2f}x",
              f"{r['ours_hp_ms']:.2f}", f"{r['torch_hp_ms']:.2f}", f"{r['hp_ratio']:.2f}x"] for r in rows]
    return markdown_table(f"norm + FP8 cast, {rows[0]['dtype']} -> e4m3, {where(device)}", headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", default=None, help="comma-separated ROWSxHIDDEN (default depends on device)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    print(table(run(args.device, args.shapes, args.dtype), args.device))


if __name__ == "__main__":
    main()
