"""Runs fp8_gemm on the CPU path that FP8MP_CPU_GEMM forces (set by test_gemm_cpu_paths.py) and saves
the operands' codes, the outputs and the path the process took, for the parent test to check; also the
outputs (and a block_scaled_gemm's) under torch.autocast and under a lowered fp32 matmul precision."""
from __future__ import annotations

import ctypes
import glob
import os
import sys

import torch

import fp8mp
from fp8mp.ops import cpu_gemm_path


def fp32_gemm_route() -> str:
    """The route of the fp32 path's GEMM in this process (csrc/common/torch_fp32_matmul.h), from the library's
    C entry point: "mkl_sgemm", "onednn" or "aten_bmm"."""
    (library,) = glob.glob(os.path.join(os.path.dirname(fp8mp.__file__), "_C*.so"))
    route = ctypes.CDLL(library).fp8mp_cpu_fp32_gemm_route
    route.restype = ctypes.c_char_p
    return route().decode()


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
        # Neither M, N nor K a multiple of the AVX512-BF16 kernel's tile (12 x 32, K in pairs) or the AMX
        # kernel's (32 x 32, K in steps of 32): padded edges.
        "ragged": ((torch.randn(13, 333, generator=gen) * 3).to(e5m2), torch.randn(45, 333, generator=gen).to(e4m3)),
        "ragged_large": ((torch.randn(161, 1057, generator=gen) * 3).to(e4m3), torch.randn(95, 1057, generator=gen).to(e5m2)),
        # One panel of rows (M <= 32): the AMX kernel's threads split the b panels, 32 columns to one thread
        # and the 33rd to the other (a thread that wrote past its own columns raced it there).
        "few_rows_split_columns": (torch.randn(20, 200, generator=gen).to(e4m3), torch.randn(33, 200, generator=gen).to(e4m3)),
        # An output (9 MiB of fp32) larger than the L2 caches of two threads: the AMX kernel writes it with
        # non-temporal stores.
        "large_output": (torch.randn(1536, 40, generator=gen).to(e4m3), torch.randn(1504, 40, generator=gen).to(e5m2)),
        # A few panels of rows against a b more than twice as wide: the AMX kernel's threads each take all of a
        # and a share of b's 6 panels (the last one ragged).
        "small_a_wide_b": ((torch.randn(70, 300, generator=gen) * 3).to(e4m3), torch.randn(181, 300, generator=gen).to(e5m2)),
    }


def user_state() -> tuple:
    """The global torch settings a user owns that a CPU GEMM could read (fp8mp must neither read nor change them)."""
    return (torch.get_float32_matmul_precision(), torch.backends.mkldnn.matmul.fp32_precision,
            torch.is_autocast_enabled("cpu"), torch.get_num_threads())


def gemms(one: torch.Tensor, operands: dict) -> dict:
    """fp8_gemm of every case, and block_scaled_gemm (1x128 blocks, the K chunks through torch's fp32 GEMM) of one."""
    out = {name: fp8mp.fp8_gemm(a, one, b, one, out_dtype=torch.float32) for name, (a, b) in operands.items()}
    a, b = operands["random_e4m3"]
    (a_q, a_s), (b_q, b_s) = (fp8mp.ops.block_quantize(t.float(), 1, 128) for t in (a, b))
    out["block_scaled"] = fp8mp.ops.block_scaled_gemm(a_q, a_s, b_q, b_s, 1, 1, 128, out_dtype=torch.float32)
    return out


EPILOGUE_SCALES = (0.5, 0.375)  # a_scale_inv, b_scale_inv: their product 0.1875 is exact in fp32


def epilogues(operands: dict) -> dict:
    """(name, out dtype) -> (bias, fp8_gemm with scales and bias) for a ragged case and a many-row one (which the
    fp32 path takes in several row blocks, its fp32 out holding the sums in place)."""
    gen = torch.Generator().manual_seed(5)
    sa, sb = (torch.tensor([s]) for s in EPILOGUE_SCALES)
    out = {}
    for name in ("ragged_large", "many_rows"):
        a, b = operands[name]
        for dtype in (torch.float32, torch.bfloat16):
            bias = torch.randn(b.shape[0], generator=gen).to(dtype)
            out[name, str(dtype)] = (bias, fp8mp.fp8_gemm(a, sa, b, sb, bias, out_dtype=dtype))
    return out


def main(out_path: str) -> None:
    one = torch.ones(1)
    operands = cases()
    results = {"path": cpu_gemm_path(), "fp32_gemm": fp32_gemm_route(), "cases": {}}
    plain = gemms(one, operands)
    for name, (a, b) in operands.items():
        results["cases"][name] = (a.view(torch.uint8), str(a.dtype), b.view(torch.uint8), str(b.dtype), plain[name])
    results["block_scaled"] = plain["block_scaled"]
    results["epilogues"] = epilogues(operands)
    # Every case again: a kernel whose threads race to write the same output gives other bits some times.
    results["repeated"] = [gemms(one, operands) for _ in range(3)]
    # The same GEMMs under the user's torch.autocast(cpu, bf16), then with the fp32 matmul precision lowered
    # to bf16 (which changes torch's own fp32 mm on a CPU with bf16 units): the outputs must not change.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        state = user_state()
        results["under_autocast"] = gemms(one, operands)
        results["autocast_state_kept"] = user_state() == state
    before = user_state()
    torch.set_float32_matmul_precision("medium")
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    state = user_state()
    results["under_low_precision"] = gemms(one, operands)
    results["low_precision_state_kept"] = user_state() == state
    torch.set_float32_matmul_precision(before[0])
    torch.backends.mkldnn.matmul.fp32_precision = before[1]
    results["plain"] = plain
    torch.save(results, out_path)


if __name__ == "__main__":
    main(sys.argv[1])
