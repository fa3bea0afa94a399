"""Runs the CPU casts (cast_to_fp8, its transposes and dbias) and norms (LayerNorm, RMSNorm, forward with and
without the FP8 output, backward) over inputs holding every bf16 and fp16 bit pattern, fp32 specials and ragged
shapes, in a process whose vector loops run the level FP8MP_CPU_ISA asks for, and saves what they wrote with
the level that ran (torch.save), for test_cpu_isa.py to compare bit for bit across levels.

    python cpu_isa_worker.py OUT
"""
from __future__ import annotations

import sys

import torch

import fp8mp
from fp8mp.ops import cpu_isa

ops = torch.ops.fp8mp


def cast_inputs() -> dict:
    """name -> tensor: every bf16 and every fp16 bit pattern (NaNs, Infs, subnormals included), and fp32 values
    over fp32's whole range with its specials, each in a ragged 2-D shape (the transposes' 64 x 64 blocks and
    16 x 16 edges)."""
    gen = torch.Generator().manual_seed(3)
    every16 = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    fp32 = torch.randint(-(1 << 31), (1 << 31) - 1, (300 * 333,), generator=gen, dtype=torch.int64).to(torch.int32)
    fp32 = fp32.view(torch.float32).clone()
    fp32[:6] = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
    fp32[6:1000] = torch.randn(994, generator=gen) * 300  # around E4M3's and E5M2's ranges
    return {"bf16": every16.view(torch.bfloat16).reshape(256, 256), "fp16": every16.view(torch.float16).reshape(512, 128),
            "fp32": fp32.reshape(300, 333), "fp32_rows_of_64": torch.randn(128, 1000, generator=gen) * 50}


def casts() -> dict:
    out = {}
    for name, x in cast_inputs().items():
        for fmt in ("e4m3", "e5m2"):
            for scale_value in (1.0, 0.7):
                scale = torch.tensor([scale_value])
                amax = torch.zeros(1)
                y = ops.cast_to_fp8(x, scale, amax, fmt)
                amax_t = torch.zeros(1)
                yt = ops.cast_to_fp8_transpose(x, scale, amax_t, fmt)
                amax_d = torch.zeros(1)
                yd = ops.cast_to_fp8_transpose_dbias(x, scale, amax_d, fmt)
                out[name, fmt, scale_value] = (y, amax, *yt, amax_t, *yd, amax_d)
    return out


def norms() -> dict:
    """LayerNorm and RMSNorm of rows of 17, 1000 and 1024 (tails of the 16 lanes, none), fp32 and bf16."""
    gen = torch.Generator().manual_seed(4)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for hidden in (17, 1000, 1024):
            x = (torch.randn(37, hidden, generator=gen) * 4 + 1).to(dtype)
            w = (torch.randn(hidden, generator=gen) + 1).to(dtype)
            b = torch.randn(hidden, generator=gen).to(dtype)
            go = torch.randn(37, hidden, generator=gen).to(dtype)
            scale, amax = torch.tensor([2.0]), torch.zeros(1)
            ln = ops.layernorm_fwd(x, w, b, 1e-5, False)
            ln8 = ops.layernorm_fwd_fp8(x, w, b, 1e-5, False, scale, amax, "e4m3")
            rms = ops.rmsnorm_fwd(x, w, 1e-6, True)
            amax_r = torch.zeros(1)
            rms8 = ops.rmsnorm_fwd_fp8(x, w, 1e-6, True, scale, amax_r, "e5m2")
            out[str(dtype), hidden] = (*ln, *ln8, amax, *rms, *rms8, amax_r,
                                       *ops.layernorm_bwd(go, x, ln[1], ln[2], w, False),
                                       *ops.rmsnorm_bwd(go, x, rms[1], w, True))
    return out


def main(out_path: str) -> None:
    torch.set_num_threads(2)
    results = {"cpu_isa": cpu_isa(), "cpu_gemm_path": fp8mp.ops.cpu_gemm_path(), "casts": casts(), "norms": norms()}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
