"""fp8mp.fp8_gemm on CUDA (cuBLASLt) against the CPU emulation and the float64 reference.

The GPU's error bound is the FP8 tensor cores' (gemm_reference.tensor_core_bound: about 14 significant bits in the
partial sums of an MMA, DeepSeek-V3 section 3.3.2), not fp32's: cuBLASLt's result is never the CPU's bit for bit."""
from __future__ import annotations


import pytest
import torch

import fp8mp
from opcheck_util import opcheck_fp8_aware
from gemm_reference import (E4M3, E5M2, FORMAT_PAIRS, OUT_DTYPES, assert_close_to_reference, check_cuda_gemm, fp8_randn,
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
    # Fast accumulation promotes Hopper's FP8 accumulator to fp32 less often (or never): the tensor cores' bound
    # assumes no promotion, so it holds for both modes.
    check_cuda_gemm(gpu, a, 0.37, b, 2.5, bias, out_dtype)
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
    check_cuda_gemm(out, a, 1.0, b, 1.0, bias, torch.bfloat16)


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_matches_torch_scaled_mm():
    a, b = fp8_randn((128, 256), E4M3, seed=11).cuda(), fp8_randn((64, 256), E4M3, seed=12).cuda()
    sa, sb = scalar(0.5, "cuda"), scalar(3.0, "cuda")
    bias = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    for fast in (False, True):
        ours = fp8mp.fp8_gemm(a, sa, b, sb, bias=bias, use_fast_accum=fast)
        theirs = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16, use_fast_accum=fast)
        # Same library, possibly a different algorithm (workspace sizes differ): each within the tensor cores'
        # bound of the float64 reference.
        check_cuda_gemm(ours, a, 0.5, b, 3.0, bias, torch.bfloat16)
        check_cuda_gemm(theirs, a, 0.5, b, 3.0, bias, torch.bfloat16)


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


# ---------------------------------------------------------------- alignment, plan cache, padding

@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_cuda_16_byte_offset_operands_after_aligned_ones(out_dtype):
    # Same shape first with 256-byte aligned buffers, then with views 16 bytes into an allocation:
    # cuBLASLt must be told the smaller alignment (and a cached plan must not be reused across it).
    M, K, N = 128, 256, 64
    a_flat = fp8_randn((16 + M * K,), E4M3, 3.0, seed=21).cuda()
    b_flat = fp8_randn((16 + N * K,), E4M3, 0.5, seed=22).cuda()
    bias_flat = (torch.randn(8 + N) * 2).to(out_dtype).cuda()
    aligned = (a_flat[:M * K].view(M, K), b_flat[:N * K].view(N, K), bias_flat[:N])
    offset = (a_flat[16:].view(M, K), b_flat[16:].view(N, K), bias_flat[16 // bias_flat.element_size():][:N])
    assert offset[0].data_ptr() % 256 == 16 and offset[1].data_ptr() % 256 == 16
    for a, b, bias in (aligned, offset, aligned, offset):
        out = fp8mp.fp8_gemm(a, scalar(0.5, "cuda"), b, scalar(2.0, "cuda"), bias=bias, out_dtype=out_dtype)
        check_cuda_gemm(out, a.cpu(), 0.5, b.cpu(), 2.0, bias.cpu(), out_dtype)


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_cached_plans_give_the_same_bits_and_follow_the_scales():
    a, b = fp8_randn((96, 160), E4M3, seed=23).cuda(), fp8_randn((48, 160), E5M2, seed=24).cuda()
    bias = torch.randn(48, device="cuda", dtype=torch.bfloat16)
    first = fp8mp.fp8_gemm(a, scalar(1.0, "cuda"), b, scalar(1.0, "cuda"), bias=bias)
    for _ in range(3):  # the cached descriptor, now with this call's pointers
        again = fp8mp.fp8_gemm(a, scalar(1.0, "cuda"), b, scalar(1.0, "cuda"), bias=bias)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))
    scaled = fp8mp.fp8_gemm(a, scalar(4.0, "cuda"), b, scalar(0.25, "cuda"), bias=bias * 0)
    unscaled = fp8mp.fp8_gemm(a, scalar(1.0, "cuda"), b, scalar(1.0, "cuda"), bias=bias * 0)
    assert torch.equal(scaled.view(torch.int16), unscaled.view(torch.int16))  # 4 * 0.25 == 1 exactly
    doubled = fp8mp.fp8_gemm(a, scalar(2.0, "cuda"), b, scalar(1.0, "cuda"))
    check_cuda_gemm(doubled, a.cpu(), 2.0, b.cpu(), 1.0, None, torch.bfloat16)


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(40, 100, 24), (7, 33, 17), (64, 64, 50)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_padding_writes_every_padded_byte(shape):
    # The padded copies are written in one pass (no memset first): poison the caching allocator with
    # NaN bytes so that any byte the pad kernel skipped would show up in the result.
    M, K, N = shape
    poison = torch.full((64 << 20,), 0xFF, dtype=torch.uint8, device="cuda")
    del poison
    a = fp8_randn((M, K), E4M3, 2.0, seed=M).cuda()
    b = fp8_randn((N, K), E4M3, 1.0, seed=N).cuda()
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for out_dtype in OUT_DTYPES:
        out = fp8mp.fp8_gemm(a, scalar(1.0, "cuda"), b, scalar(1.0, "cuda"), bias=bias.to(out_dtype),
                             out_dtype=out_dtype)
        assert torch.isfinite(out).all()
        check_cuda_gemm(out, a.cpu(), 1.0, b.cpu(), 1.0, bias.to(out_dtype).cpu(), out_dtype)
