"""Cost of the fine-grained recipes relative to tensorwise, on the same shapes in the same run (CPU or CUDA).

Quantize: fp8mp.ops.block_quantize per recipe vs cast_to_fp8 with a tensorwise scale (amax pass
included, as current scaling pays it). GEMM: fp8mp.ops.block_scaled_gemm vs fp8mp.fp8_gemm (the
tensorwise emulation). Ratios are (recipe time) / (tensorwise time): 1.0 costs the same.
Both layouts: fp8mp.ops.block_quantize_transpose (x and x.T quantized from the same reads, as
backward needs them) vs the two block_quantize calls it replaces (the second on x.t()), as a ratio.

    python benchmarks/bench_block_scaling.py [--device cpu|cuda] [--sizes 512x1024x1024,2048x2048x2048]

On CUDA each recipe's GEMM runs on the path csrc/blockwise/block_gemm_path.h picks, named in its row: native
(one cuBLASLt call with its block scale mode: rowwise OUTER_VEC and DeepSeek-V3 VEC128 / BLK128x128 on Hopper,
MXFP8 VEC32_UE8M0 on Blackwell) or chunked (one FP8 GEMM per K chunk of block_k, then the fold: MXFP8 on Hopper,
K / 32 GEMMs). The chunked MXFP8 GEMM is timed only up to CHUNKED_MAX_MNK: at 8192^3 its 256 GEMMs of
8192 x 8192 x 32 each write a 256 MiB fp32 chunk that the fold reads back, about 1 GiB of traffic a chunk, so
about 0.1 s a call at Hopper's ~3 TB/s and over a second for its repetitions, past the GPU check's step limit.
"""
from __future__ import annotations

import argparse
import os

import torch

import fp8mp
from fp8mp.ops import block_quantize, block_quantize_transpose, block_scaled_gemm, compute_scale

from results_json import record
from timing import markdown_table, median_time, parse_shapes, where

# name -> (activation block, weight block rows, block_k or None for the whole K, scale_mode)
RECIPES = {
    "rowwise": (None, 1, "pow2"),
    "block 128": (128, 128, "fp32"),
    "mxfp8 32": (32, 1, "e8m0_rceil"),
}


CHUNKED_MAX_MNK = 4096 ** 3  # the largest M * N * K whose chunked block-scaled GEMM is timed (see above)


def gemm_path(name: str, K: int, device: str) -> tuple[str, int]:
    """(path, GEMM calls) of a recipe's block_scaled_gemm: csrc/blockwise/block_gemm_path.h's choice, on a
    cuBLASLt from CUDA 12.9 on (the GPU check's CUDA 13): native where the GPU has the block scale mode."""
    block_k = RECIPES[name][0] or K
    chunked = ("chunked", -(-K // block_k))
    if device != "cuda":
        return ("CPU emulation", 0)
    if os.environ.get("FP8MP_BLOCK_GEMM_PATH") == "chunked":
        return chunked
    major = torch.cuda.get_device_capability()[0]
    native = major in (10, 12) if name.startswith("mxfp8") else major == 9
    return ("native", 1) if native else chunked


def bench(M: int, K: int, N: int, device: str = "cpu") -> dict:
    """Times in seconds: tensorwise quantize and GEMM, then per recipe its quantize, both-layouts pair and GEMM
    (those it could not run left out, with the reason under "errors")."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(M, K, generator=g).to(device), (torch.randn(N, K, generator=g) * 0.05).to(device)
    amax = torch.zeros(1, device=device)
    one = torch.ones(1, device=device)

    def tensorwise_quantize():
        scale = compute_scale(x.abs().amax().reshape(1), 448.0, 0, one)
        return fp8mp.cast_to_fp8(x, scale, amax)

    a, b = x.to(torch.float8_e4m3fn), (w * 16).to(torch.float8_e4m3fn)
    row = {"shape": f"{M}x{K}x{N}", "tensorwise_quantize_s": median_time(tensorwise_quantize, device),
           "tensorwise_gemm_s": median_time(lambda: fp8mp.fp8_gemm(a, one, b, one, out_dtype=torch.bfloat16), device),
           "recipes": {}, "errors": {}}
    for name, (block_k, w_rows, mode) in RECIPES.items():
        bk, bk_t = block_k or K, block_k or M
        times = row["recipes"][name] = {}
        path, calls = gemm_path(name, K, device)
        times["gemm_path"], times["gemm_calls"] = path, calls
        try:  # a recipe this GPU has no kernel for (MXFP8's GEMM before Blackwell): its error, and the rest goes on
            times["quantize_s"] = median_time(lambda: block_quantize(x, 1, bk, "e4m3", mode), device)
            times["both_layouts_s"] = median_time(lambda: block_quantize_transpose(x, bk, bk_t, "e4m3", mode), device)
            times["two_calls_s"] = median_time(lambda: (block_quantize(x, 1, bk, "e4m3", mode),
                                                        block_quantize(x.t(), 1, bk_t, "e4m3", mode)), device)
            xq, sx = block_quantize(x, 1, bk, "e4m3", mode)
            wq, sw = block_quantize(w, w_rows, bk, "e4m3", mode)
            if path == "chunked" and M * N * K > CHUNKED_MAX_MNK:
                row["errors"][name] = f"GEMM not timed: chunked path, {calls} GEMMs a call, above {CHUNKED_MAX_MNK} MNK"
                continue
            times["gemm_s"] = median_time(lambda: block_scaled_gemm(xq, sx, wq, sw, 1, w_rows, bk, None, torch.bfloat16),
                                          device)
        except (RuntimeError, NotImplementedError) as e:
            row["errors"][name] = str(e).splitlines()[0]
    return row


def ratio(times: dict, key: str, baseline: float | None) -> str:
    return f"{times[key] / baseline:.2f}" if key in times and baseline else "failed"


def table(rows: list[dict], device: str) -> str:
    headers = ["M x K x N", "tensorwise quantize ms", "tensorwise GEMM ms"]
    for name in RECIPES:
        headers += [f"{name} quantize x", f"{name} GEMM x (path, GEMMs)", f"{name} both layouts vs 2 calls"]
    cells = []
    for r in rows:
        row_cells = [r["shape"], f"{r['tensorwise_quantize_s'] * 1e3:.2f}", f"{r['tensorwise_gemm_s'] * 1e3:.2f}"]
        for name in RECIPES:
            t = r["recipes"][name]
            gemm = f"{ratio(t, 'gemm_s', r['tensorwise_gemm_s'])} ({t['gemm_path']}, {t['gemm_calls']})"
            row_cells += [ratio(t, "quantize_s", r["tensorwise_quantize_s"]), gemm,
                          ratio(t, "both_layouts_s", t.get("two_calls_s"))]
        cells.append(row_cells)
    text = markdown_table(f"fine-grained recipes relative to tensorwise, {where(device)}", headers, cells)
    errors = [f"{r['shape']} {name}: {error}" for r in rows for name, error in r["errors"].items()]
    return text + "".join(f"\n{line}" for line in errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sizes", default="512x1024x1024,2048x2048x2048")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    rows = [bench(M, K, N, args.device) for M, K, N in parse_shapes(args.sizes)]
    print(table(rows, args.device))
    print("ratios: recipe time / tensorwise time (1.0: the same cost); both layouts: one call / the two it replaces")
    record(args.json, "block_scaling", rows)


if __name__ == "__main__":
    main()
