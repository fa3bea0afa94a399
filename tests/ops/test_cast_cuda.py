"""fp8mp cast ops on CUDA against the CPU kernels, bit for bit."""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
from fp8_reference import (
    FORMATS,
    SCALES,
    cast,
    all_16bit_patterns,
    random_fp32_across_exponents,
)


# ---------------------------------------------------------------- CUDA vs CPU

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_matches_cpu_on_every_16bit_pattern(fmt, dtype):
    x = all_16bit_patterns(dtype)
    for scale in SCALES:
        y_cpu, amax_cpu = cast(x, scale, fmt)
        amax_gpu = torch.zeros(1, device="cuda")
        y_gpu = fp8mp.cast_to_fp8(x.cuda(), torch.tensor([scale], device="cuda"), amax_gpu, fmt)
        assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
        assert math.isnan(amax_gpu.item()) and math.isnan(amax_cpu.item())


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_matches_cpu_random_fp32_and_offsets(fmt):
    x = random_fp32_across_exponents(1_000_003, seed=5)
    x[:8] = 1.0  # keep amax finite so it can be compared exactly
    for view in (x, x[1:], x[3:-2]):  # unaligned starts take the scalar path
        y_cpu, amax_cpu = cast(view, 3.7, fmt)
        amax_gpu = torch.zeros(1, device="cuda")
        y_gpu = fp8mp.cast_to_fp8(view.cuda(), torch.tensor([3.7], device="cuda"), amax_gpu, fmt)
        assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
        assert amax_gpu.item() == amax_cpu.item()


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 1), (33, 65), (1024, 4096), (4097, 31)])
def test_cuda_transpose_and_decode_match_cpu(shape):
    x = torch.randn(shape, dtype=torch.bfloat16) * 30
    for fmt in FORMATS:
        amax_cpu, amax_gpu = torch.zeros(1), torch.zeros(1, device="cuda")
        y_cpu, yt_cpu = fp8mp.cast_to_fp8_transpose(x, torch.tensor([2.0]), amax_cpu, fmt)
        y_gpu, yt_gpu = fp8mp.cast_to_fp8_transpose(x.cuda(), torch.tensor([2.0], device="cuda"), amax_gpu, fmt)
        assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
        assert torch.equal(yt_gpu.cpu().view(torch.uint8), yt_cpu.view(torch.uint8))
        assert amax_gpu.item() == amax_cpu.item()
        back_cpu = fp8mp.cast_from_fp8(y_cpu, torch.tensor([0.5]), torch.bfloat16)
        back_gpu = fp8mp.cast_from_fp8(y_gpu, torch.tensor([0.5], device="cuda"), torch.bfloat16)
        assert torch.equal(back_gpu.cpu().view(torch.int16), back_cpu.view(torch.int16))


@needs_cuda
@pytest.mark.cuda
def test_cuda_opcheck_and_device_errors():
    x = torch.randn(64, 32, device="cuda")
    torch.library.opcheck(torch.ops.fp8mp.cast_to_fp8.default, (x, torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), "e4m3"))
    torch.library.opcheck(torch.ops.fp8mp.cast_to_fp8_transpose.default, (x, torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), "e5m2"))
    with pytest.raises(RuntimeError, match="'scale' must be on the input's device"):
        fp8mp.cast_to_fp8(x, torch.ones(1), torch.zeros(1, device="cuda"), "e4m3")
    with pytest.raises(RuntimeError, match="'amax' must be on the input's device"):
        fp8mp.cast_to_fp8(x, torch.ones(1, device="cuda"), torch.zeros(1), "e4m3")
