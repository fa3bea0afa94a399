"""fp8mp.fp8_gemm on CUDA (cuBLASLt) against the CPU emulation and the float64 reference."""
from __future__ import annotations


import pytest
import torch

import fp8mp
from opcheck_util import opcheck_fp8_aware
from gemm_reference import (E4M3, E5M2, FORMAT_PAIRS, FP32_ACC_RTOL, OUT_DTYPES, assert_close_to_reference, fp8_randn,
                            reference_f64, scalar)


# ---------------------------------------------------------------- CUDA against the CPU emulation

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")
CUDA_SHAPES = [(1, 16, 16), (4, 7, 3), (33, 100, 17), (64, 128, 96), (256, 512, 384), (17, 2048, 130), (3, 0, 5), (0, 16, 8)]


def cuda_fp8_capable():
    return fp8mp.cuda_kernels_available() and torch.cuda.get_device_capability() >= (8, 9)


needs_fp8_gpu = pytest.mark.skipif(not cuda_fp8_capable(), reason="needs fp8mp CUDA kernels and a GPU of compute capability >= 8.9")


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cuda_matches_cpu_emulation(a_dtype, b_dtype, out_dtype, with_bias, fast_accum, shape):
    M, K, N = shape
    a = fp8_randn((M, K), a_dtype, 4.0, seed=M + K)
    b = fp8_randn((N, K), b_dtype, 0.5, seed=N + K)
    bias = (torch.randn(N) * 3).to(out_dtype) if with_bias else None
    ref64, abs_sum = reference_f64(a, 0.37, b, 2.5, bias)
    cpu = fp8mp.fp8_gemm(a, scalar(0.37), b, scalar(2.5), bias=bias, out_dtype=out_dtype)
    gpu = fp8mp.fp8_gemm(a.cuda(), scalar(0.37, "cuda"), b.cuda(), scalar(2.5, "cuda"),
                         bias=None if bias is None else bias.cuda(), out_dtype=out_dtype, use_fast_accum=fast_accum)
    assert gpu.device.type == "cuda"
    # Fast accumulation skips the periodic fp32 promotion of Hopper's FP8 accumulator: a looser bound.
    acc_rtol = 4e-3 if fast_accum else FP32_ACC_RTOL
    assert_close_to_reference(gpu, ref64, abs_sum, out_dtype, acc_rtol=acc_rtol)
    assert_close_to_reference(cpu, ref64, abs_sum, out_dtype)
    if K == 0:
        assert torch.equal(gpu.cpu(), cpu)


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_unaligned_and_strided_inputs():
    flat = fp8_randn((1 + 48 * 64,), E4M3, seed=9).cuda()
    a = flat[1:].view(48, 64)  # data pointer 1 byte past an allocation: not 16-byte aligned
    b = fp8_randn((40, 128), E4M3, seed=10).cuda()[:, ::2]  # strided
    bias = torch.randn(40, device="cuda", dtype=torch.bfloat16)
    out = fp8mp.fp8_gemm(a, scalar(1.0, "cuda"), b, scalar(1.0, "cuda"), bias=bias)
    ref64, abs_sum = reference_f64(a, 1.0, b, 1.0, bias)
    assert_close_to_reference(out, ref64, abs_sum, torch.bfloat16)


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_matches_torch_scaled_mm():
    a, b = fp8_randn((128, 256), E4M3, seed=11).cuda(), fp8_randn((64, 256), E4M3, seed=12).cuda()
    sa, sb = scalar(0.5, "cuda"), scalar(3.0, "cuda")
    bias = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    _, abs_sum = reference_f64(a, 0.5, b, 3.0, bias)
    for fast in (False, True):
        ours = fp8mp.fp8_gemm(a, sa, b, sb, bias=bias, use_fast_accum=fast)
        theirs = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast)
        # Same library, possibly a different algorithm (workspace sizes differ): equal up to accumulation order.
        assert_close_to_reference(ours, theirs.cpu().double(), abs_sum, torch.bfloat16, acc_rtol=4e-3 if fast else FP32_ACC_RTOL)


@needs_cuda
@pytest.mark.cuda
def test_cuda_opcheck_and_device_errors():
    a, b = fp8_randn((16, 32), E4M3).cuda(), fp8_randn((24, 32), E4M3, seed=1).cuda()
    s = scalar(1.0, "cuda")
    if cuda_fp8_capable():
        opcheck_fp8_aware(torch.ops.fp8mp.fp8_gemm.default, (a, s, b, s, torch.randn(24, device="cuda"), torch.float32, False))
    with pytest.raises(RuntimeError, match="'a_scale_inv' must be on the input's device"):
        fp8mp.fp8_gemm(a, scalar(1.0), b, s)
    with pytest.raises(RuntimeError, match="'b_scale_inv' must be on the input's device"):
        fp8mp.fp8_gemm(a, s, b, scalar(1.0))
    with pytest.raises(RuntimeError, match="'b' must be on the device of 'a'"):
        fp8mp.fp8_gemm(a, s, b.cpu(), s)
    with pytest.raises(RuntimeError, match="'bias' must be on the input's device"):
        fp8mp.fp8_gemm(a, s, b, s, bias=torch.randn(24, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="cannot both be float8_e5m2"):
        fp8mp.fp8_gemm(a.to(torch.float32).to(E5M2), s, b.to(torch.float32).to(E5M2), s)
