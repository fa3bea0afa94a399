"""CPU cost of the fine-grained recipes relative to tensorwise, on the same shapes in the same run.

Quantize: fp8mp.ops.block_quantize per recipe vs cast_to_fp8 with a tensorwise scale (amax pass
included, as current scaling pays it). GEMM: fp8mp.ops.block_scaled_gemm vs fp8mp.fp8_gemm (the
tensorwise emulation). Ratios are (recipe time) / (tensorwise time): 1.0 costs the same.
Both layouts: fp8mp.ops.block_quantize_transpose (x and x.T quantized from the same reads, as
backward needs them) vs the two block_quantize calls it replaces (the second on x.t()), as a ratio.

    python benchmarks/bench_block_scaling.py [--sizes 512x1024x1024,2048x2048x2048]
"""
from __future__ import annotations

import argparse

import torch

import fp8mp
from fp8mp.ops import block_quantize, block_quantize_transpose, block_scaled_gemm, compute_scale

from timing import median_time, parse_shapes

# name -> (activation block, weight block rows, block_k or None for the whole K, scale_mode)
RECIPES = {
    "rowwise": (None, 1, "pow2"),
    "block 128": (128, 128, "fp32"),
    "mxfp8 32": (32, 1, "e8m0_rceil"),
}


def bench(M: int, K: int, N: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.05
    amax = torch.zeros(1)

    def tensorwise_quantize():
        scale = compute_scale(x.abs().amax().reshape(1), 448.0, 0, torch.ones(1))
        return fp8mp.cast_to_fp8(x, scale, amax)

    a, b = x.to(torch.float8_e4m3fn), (w * 16).to(torch.float8_e4m3fn)
    one = torch.ones(1)
    t_quant = median_time(tensorwise_quantize, "cpu")
    t_gemm = median_time(lambda: fp8mp.fp8_gemm(a, one, b, one, out_dtype=torch.bfloat16), "cpu")
    cells = [f"{M}x{K}x{N}", f"{t_quant * 1e3:.2f}", f"{t_gemm * 1e3:.1f}"]
    for block_k, w_rows, mode in RECIPES.values():
        bk = block_k or K
        t_q = median_time(lambda: block_quantize(x, 1, bk, "e4m3", mode), "cpu")
        xq, sx = block_quantize(x, 1, bk, "e4m3", mode)
        wq, sw = block_quantize(w, w_rows, bk, "e4m3", mode)
        t_g = median_time(lambda: block_scaled_gemm(xq, sx, wq, sw, 1, w_rows, bk, None, torch.bfloat16), "cpu")
        bk_t = block_k or M
        t_both = median_time(lambda: block_quantize_transpose(x, bk, bk_t, "e4m3", mode), "cpu")
        t_two = median_time(lambda: (block_quantize(x, 1, bk, "e4m3", mode), block_quantize(x.t(), 1, bk_t, "e4m3", mode)),
                            "cpu")
        cells += [f"{t_q / t_quant:.2f}", f"{t_g / t_gemm:.2f}", f"{t_both / t_two:.2f}"]
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512x1024x1024,2048x2048x2048")
    args = parser.parse_args()
    headers = ["M x K x N", "tensorwise quantize ms", "tensorwise GEMM ms"]
    for name in RECIPES:
        headers += [f"{name} quantize x", f"{name} GEMM x", f"{name} both layouts vs 2 calls"]
    print(f"CPU, {torch.get_num_threads()} threads\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for M, K, N in parse_shapes(args.sizes):
        print("| " + " | ".join(bench(M, K, N)) + " |")


if __name__ == "__main__":
    main()
