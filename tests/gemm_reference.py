"""fp8_gemm references: float64 products of torch-decoded operands, and the fp32 accumulation bound."""
from __future__ import annotations
import torch
import fp8mp

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMAT_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]
OUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP32_ACC_RTOL = 1e-5  # fp32 accumulation-order error, relative to sum |a_mk * b_nk|

# (M, K, N): aligned and not (K, N not multiples of 16 are padded on CUDA), M = 1, K = 1, K = 0, empty results.
SHAPES = [(1, 16, 16), (4, 7, 3), (33, 100, 17), (64, 128, 96), (128, 48, 256), (1, 1, 1), (3, 0, 5), (0, 16, 8), (7, 16, 0)]


def fp8_randn(shape, dtype, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def scalar(v, device="cpu"):
    return torch.tensor([v], dtype=torch.float32, device=device)


def reference_f64(a, a_scale_inv, b, b_scale_inv, bias):
    """Exact-ish result before the final rounding, and sum_k |a_mk b_nk| * scale (for the error bound)."""
    a64, b64 = a.cpu().to(torch.float32).double(), b.cpu().to(torch.float32).double()
    scale = float(a_scale_inv) * float(b_scale_inv)
    out = (a64 @ b64.t()) * scale
    abs_sum = (a64.abs() @ b64.abs().t()) * abs(scale)
    if bias is not None:
        out = out + bias.cpu().double()
        abs_sum = abs_sum + bias.cpu().double().abs()
    return out, abs_sum


def assert_close_to_reference(out, ref64, abs_sum, out_dtype, acc_rtol=FP32_ACC_RTOL):
    assert out.dtype == out_dtype and out.shape == ref64.shape and out.is_contiguous()
    info = torch.finfo(out_dtype)
    # One ulp of out_dtype at |ref| (eps * |ref| bounds it), the smallest step near zero, fp32 accumulation error.
    tol = info.eps * ref64.abs() + info.tiny * info.eps + acc_rtol * abs_sum
    err = (out.cpu().double() - ref64).abs()
    bad = (err > tol).nonzero()
    assert bad.numel() == 0, (
        f"{len(bad)} of {out.numel()} elements off, first at {tuple(bad[0].tolist())}: "
        f"got {out.cpu().double()[tuple(bad[0])].item()!r}, reference {ref64[tuple(bad[0])].item()!r}, "
        f"tolerance {tol[tuple(bad[0])].item()!r}"
    )


def run_and_check(a, b, a_scale_inv, b_scale_inv, bias, out_dtype, **kwargs):
    out = fp8mp.fp8_gemm(a, scalar(a_scale_inv, a.device), b, scalar(b_scale_inv, a.device), bias=bias,
                         out_dtype=out_dtype, **kwargs)
    ref64, abs_sum = reference_f64(a, a_scale_inv, b, b_scale_inv, bias)
    assert_close_to_reference(out, ref64, abs_sum, out_dtype)
    return out
