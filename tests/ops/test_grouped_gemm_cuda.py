"""The grouped GEMMs on a GPU: each group against the float64 reference with fp32 accumulation's bound, as
tests/ops/test_gemm_cuda.py holds fp8_gemm (gemm_reference.tensor_core_bound: the FP8 tensor cores' partial sums
keep about 14 significant bits, DeepSeek-V3 section 3.3.2; not the CPU's fp32 order, so not bit for bit),
and an empty group writes nothing into the forward output and zeros into its weight gradient."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8mp.ops import fp8_grouped_gemm, fp8_grouped_gemm_wgrad
from gemm_reference import (FORMAT_PAIRS, OUT_DTYPES, assert_within_tensor_core_bound, check_cuda_gemm, fp8_randn,
                            scalar, tensor_core_bound)
from test_grouped_gemm import GROUPINGS, group_ranges, grouped_operands, offsets

needs_fp8_gpu = pytest.mark.skipif(
    not (fp8mp.cuda_kernels_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="needs fp8mp CUDA kernels and a GPU of compute capability >= 8.9")
CUDA_GROUPINGS = ["with_empty_groups", "one_group_all", "top8_e64"]


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("grouping", CUDA_GROUPINGS)
@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS, ids=lambda d: str(d).split("_")[-1])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_cuda_grouped_gemm_each_group_within_the_fp64_bound(grouping, a_dtype, b_dtype, out_dtype):
    counts = GROUPINGS[grouping]
    N, K = 32, 48
    a, b, b_scale_inv = grouped_operands(counts, N, K, a_dtype, b_dtype, seed=len(counts))
    bias = (torch.randn(len(counts), N) * 2).to(out_dtype)
    out = fp8_grouped_gemm(a.cuda(), scalar(0.37, "cuda"), b.cuda(), b_scale_inv.cuda(), offsets(counts).cuda(),
                           bias.cuda(), out_dtype)
    assert out.device.type == "cuda" and out.shape == (sum(counts), N) and out.dtype == out_dtype
    out = out.cpu()
    for g, (s, e) in enumerate(group_ranges(counts)):
        check_cuda_gemm(out[s:e].contiguous(), a[s:e], 0.37, b[g], float(b_scale_inv[g]), bias[g], out_dtype)


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("grouping", CUDA_GROUPINGS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_cuda_grouped_wgrad_each_group_within_the_fp64_bound(grouping, out_dtype):
    counts = GROUPINGS[grouping]
    N, K, T = 48, 32, sum(counts)
    a = fp8_randn((N, T), torch.float8_e5m2, 2.0, seed=T)
    b = fp8_randn((K, T), torch.float8_e4m3fn, 1.0, seed=T + 1)
    out = fp8_grouped_gemm_wgrad(a.cuda(), scalar(0.5, "cuda"), b.cuda(), scalar(1.75, "cuda"), offsets(counts).cuda(),
                                 out_dtype).cpu()
    assert out.shape == (len(counts), N, K)
    for g, (s, e) in enumerate(group_ranges(counts)):
        check_cuda_gemm(out[g], a[:, s:e].contiguous(), 0.5, b[:, s:e].contiguous(), 1.75, None, out_dtype)
        if e == s:
            assert torch.equal(out[g], torch.zeros(N, K, dtype=out_dtype))


@needs_fp8_gpu
@pytest.mark.cuda
def test_cuda_block_wgrad_each_group_within_the_fp64_bound():
    """block_scaled_grouped_gemm_wgrad on a GPU, rowwise, DeepSeek-V3 and MXFP8 blocks over the CUDA groupings (one
    test, as the GPU check's time plan counts tests): each group against the float64 GEMM of its dequantized
    columns; an empty group gives zeros."""
    from fp8mp.ops import block_scaled_grouped_gemm_wgrad
    from test_grouped_gemm import RECIPES, block_dequantized, quantize_group_columns
    for recipe in ("rowwise", "deepseek_v3", "mxfp8"):
        _, block_k, mode = RECIPES[recipe]
        for grouping in CUDA_GROUPINGS:
            counts = GROUPINGS[grouping]
            N, K, T = 48, 32, sum(counts)
            gen = torch.Generator().manual_seed(T)
            dy_t, x_t = torch.randn(N, T, generator=gen), torch.randn(K, T, generator=gen)
            a, sa, a_parts = quantize_group_columns(dy_t, counts, block_k, mode)
            b, sb, b_parts = quantize_group_columns(x_t, counts, block_k, mode)
            out = block_scaled_grouped_gemm_wgrad(a.cuda(), sa.cuda(), b.cuda(), sb.cuda(), offsets(counts).cuda(),
                                                  block_k or max(T, 1), torch.float32).cpu()
            for g, (s, e) in enumerate(group_ranges(counts)):
                group_block = block_k or max(e - s, 1)
                a64 = block_dequantized(a_parts[g][0], a_parts[g][1], 1, group_block)
                b64 = block_dequantized(b_parts[g][0], b_parts[g][1], 1, group_block)
                # Each block's scales apply in fp32 after its MMAs: the accumulator is promoted every block.
                bound = tensor_core_bound(a64, b64, promote_every=block_k)
                assert_within_tensor_core_bound(out[g], a64 @ b64.t(), bound, torch.float32)


@needs_fp8_gpu
@pytest.mark.cuda
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_block_scaled_grouped_gemm_along_m_each_group_within_the_fp64_bound(out_dtype):
    """block_scaled_grouped_gemm on a GPU (grouped along M: each group's rows with their own scale rows and the
    group's weight and weight scales), rowwise, DeepSeek-V3 and MXFP8 blocks over the CUDA groupings, rows of very
    different ranges so that a group handed another group's scales is off by far more than the bound: each group
    against the float64 GEMM of its dequantized operands within the tensor cores' bound, promoted every K block."""
    from fp8mp.ops import block_quantize, block_scaled_grouped_gemm
    from test_grouped_gemm import RECIPES, block_dequantized
    for recipe in ("rowwise", "deepseek_v3", "mxfp8"):
        b_block_rows, block_k, mode = RECIPES[recipe]
        for grouping in CUDA_GROUPINGS:
            counts = GROUPINGS[grouping]
            G, M, N, K = len(counts), sum(counts), 144, 256
            bk = block_k or K
            gen = torch.Generator().manual_seed(G)
            x = torch.randn(M, K, generator=gen) * torch.logspace(-3, 3, M).view(M, 1)
            w = torch.randn(G, N, K, generator=gen) * 0.02
            a, sa = block_quantize(x, 1, bk, "e4m3", mode)
            quantized = [block_quantize(w[g], b_block_rows, bk, "e4m3", mode) for g in range(G)]
            b, sb = torch.stack([q[0] for q in quantized]), torch.stack([q[1] for q in quantized])
            bias = torch.randn(G, N, generator=gen).to(out_dtype)
            out = block_scaled_grouped_gemm(a.cuda(), sa.cuda(), b.cuda(), sb.cuda(), offsets(counts).cuda(),
                                            b_block_rows, bk, bias.cuda(), out_dtype)
            assert out.is_cuda and out.shape == (M, N) and out.dtype == out_dtype
            out = out.cpu()
            for g, (s, e) in enumerate(group_ranges(counts)):
                a64 = block_dequantized(a[s:e], sa[s:e], 1, bk)
                b64 = block_dequantized(b[g], sb[g], b_block_rows, bk)
                ref64 = a64 @ b64.t() + bias[g].double()
                bound = tensor_core_bound(a64, b64, promote_every=bk)
                bound = bound + 2.0 ** -24 * (ref64.abs() + bound)  # the bias's fp32 addition
                assert_within_tensor_core_bound(out[s:e], ref64, bound, out_dtype)
