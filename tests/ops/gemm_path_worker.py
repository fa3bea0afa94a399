"""Runs fp8_gemm on the CPU path that FP8MP_CPU_GEMM forces (set by test_gemm_cpu_paths.py) and saves
the operands' codes, the outputs and the path the process took, for the parent test to check."""
from __future__ import annotations

import sys

import torch

import fp8mp
from fp8mp.ops import cpu_gemm_path


def cases() -> dict:
    """name -> (a, b): random, all-max, cancelling signs, long K, integer-valued (order-free), ragged operands."""
    gen = torch.Generator().manual_seed(17)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    k_long = 16384
    alternating = torch.tensor([448.0, -448.0]).repeat(k_long // 2)
    return {
        "random_e4m3": ((torch.randn(65, 1000, generator=gen) * 8).to(e4m3), torch.randn(33, 1000, generator=gen).to(e4m3)),
        "random_e4m3_e5m2": ((torch.randn(40, 300, generator=gen) * 100).to(e4m3),
                             (torch.randn(50, 300, generator=gen) * 1e-3).to(e5m2)),
        "all_max": (torch.full((8, k_long), 448.0).to(e4m3), torch.full((4, k_long), -448.0).to(e4m3)),
        "cancelling": (torch.full((8, k_long), 448.0).to(e4m3), alternating.expand(6, k_long).contiguous().to(e4m3)),
        "long_k_random": (torch.randn(16, k_long, generator=gen).to(e4m3), torch.randn(24, k_long, generator=gen).to(e4m3)),
        "integers": (torch.randint(-8, 9, (70, 4096), generator=gen).float().to(e4m3),
                     torch.randint(-8, 9, (20, 4096), generator=gen).float().to(e4m3)),
        "many_rows": (torch.randn(2100, 4096, generator=gen).to(e4m3), torch.randn(8, 4096, generator=gen).to(e4m3)),
        # Neither M, N nor K a multiple of the AVX512-BF16 kernel's tile (12 x 32, K in pairs): padded edges.
        "ragged": ((torch.randn(13, 333, generator=gen) * 3).to(e5m2), torch.randn(45, 333, generator=gen).to(e4m3)),
    }


def main(out_path: str) -> None:
    one = torch.ones(1)
    results = {"path": cpu_gemm_path(), "cases": {}}
    for name, (a, b) in cases().items():
        out = fp8mp.fp8_gemm(a, one, b, one, out_dtype=torch.float32)
        results["cases"][name] = (a.view(torch.uint8), str(a.dtype), b.view(torch.uint8), str(b.dtype), out)
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
