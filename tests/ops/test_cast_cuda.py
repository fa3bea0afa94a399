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


def on_device_views(x: torch.Tensor, *slicers):
    """(CPU view, CUDA view) pairs, each CUDA view sliced on the device out of one copy of x: `view.cuda()` would
    copy a CPU slice into a fresh, aligned allocation and never hand the kernels the offset pointer under test.
    A slicer that starts past element 0 must leave the CUDA view's data pointer off 16-byte alignment."""
    gpu = x.cuda()
    pairs = []
    for slicer in slicers:
        cpu_view, gpu_view = slicer(x), slicer(gpu)
        if cpu_view.storage_offset() * x.element_size() % 16:
            assert gpu_view.data_ptr() % 16 != 0, "the CUDA view is 16-byte aligned: the unaligned kernel would not run"
        pairs.append((cpu_view, gpu_view))
    return pairs


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
    # Unaligned starts (sliced on the device) take the kernel's unaligned path (cast_kernel<kAlignedX = false>).
    for view, view_gpu in on_device_views(x, lambda t: t, lambda t: t[1:], lambda t: t[3:-2]):
        y_cpu, amax_cpu = cast(view, 3.7, fmt)
        amax_gpu = torch.zeros(1, device="cuda")
        y_gpu = fp8mp.cast_to_fp8(view_gpu, torch.tensor([3.7], device="cuda"), amax_gpu, fmt)
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
@pytest.mark.parametrize("shape", [(1, 1), (70, 33), (1024, 4096)])
def test_cuda_transpose_dbias_matches_cpu(shape):
    """y and yt bit for bit; dbias, a column sum in fp32 in another order of additions than the CPU's, against the
    float64 column sum within the bound of fp32 summation in any order: n terms summed with every partial sum
    rounded to fp32 err by at most (n - 1) u sum|x_i| to first order, u = 2^-24 (Higham, Accuracy and Stability of
    Numerical Algorithms, 2nd ed., (4.4)); (1 + n u) covers the second order. A wrong column, a dropped row block
    or a sum of the FP8 codes in place of x is off by far more."""
    x = torch.randn(shape, dtype=torch.bfloat16) * 30
    x[:, ::3] += 100  # columns whose sums are far from zero, next to ones that nearly cancel
    amax_cpu, amax_gpu = torch.zeros(1), torch.zeros(1, device="cuda")
    y_cpu, yt_cpu, db_cpu = fp8mp.cast_to_fp8_transpose_dbias(x, torch.tensor([2.0]), amax_cpu, "e5m2")
    y_gpu, yt_gpu, db_gpu = fp8mp.cast_to_fp8_transpose_dbias(x.cuda(), torch.tensor([2.0], device="cuda"), amax_gpu,
                                                              "e5m2")
    assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
    assert torch.equal(yt_gpu.cpu().view(torch.uint8), yt_cpu.view(torch.uint8))
    assert amax_gpu.item() == amax_cpu.item() and db_gpu.dtype == torch.float32
    rows, u = shape[0], 2.0 ** -24
    exact = x.double().sum(0)
    bound = max(rows - 1, 0) * u * (1 + rows * u) * x.double().abs().sum(0)
    for dbias in (db_gpu.cpu(), db_cpu):
        assert dbias.shape == (shape[1],)
        err = (dbias.double() - exact).abs()
        assert (err <= bound).all(), (err - bound).max()
    torch.library.opcheck(torch.ops.fp8mp.cast_to_fp8_transpose_dbias.default,
                          (x.cuda(), torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), "e4m3"))


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


# ---------------------------------------------------------------- NaN sign, >2M rows, vector paths

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_keeps_the_sign_of_nan_when_scaling(fmt):
    # fp32 NaNs of both signs and several payloads: the GPU's canonical NaN would give +NaN (0x7F) for all.
    nan_bits = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0xFFFFFFFF], dtype=torch.int64)
    x = nan_bits.to(torch.int32).view(torch.float32).repeat(40)  # 200: vector body and scalar tail
    for view, view_gpu in on_device_views(x, lambda t: t, lambda t: t[1:]):
        y_cpu, _ = cast(view, 3.7, fmt)
        y_gpu = fp8mp.cast_to_fp8(view_gpu, torch.tensor([3.7], device="cuda"), torch.zeros(1, device="cuda"), fmt)
        assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
        assert set(y_cpu.view(torch.uint8).tolist()) == {0x7F, 0xFF}


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_decode_matches_cpu_on_every_code_aligned_and_not(fmt, out_dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(9)  # 2304 codes: vectors and a tail
    y = codes.view(torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2)
    # Unaligned starts (sliced on the device) take the scalar path (cast_from_fp8_kernel<kVector = false>).
    for view, view_gpu in on_device_views(y, lambda t: t, lambda t: t[1:], lambda t: t[5:-3]):
        for scale_inv in (1.0, 0.37, 2.0**-9):
            out_cpu = fp8mp.cast_from_fp8(view, torch.tensor([scale_inv]), out_dtype)
            out_gpu = fp8mp.cast_from_fp8(view_gpu, torch.tensor([scale_inv], device="cuda"), out_dtype)
            assert torch.equal(_bits(out_gpu.cpu()), _bits(out_cpu))


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 64), (128, 256), (192, 72), (130, 64), (64, 68), (80, 8), (3, 200)])
def test_cuda_transpose_vector_and_edge_tiles_match_cpu(dtype, shape):
    # Full aligned tiles take 16-byte vectors; ragged rows/cols, and x at a 2-byte offset, the checked path.
    rows, cols = shape
    base = torch.randn(rows * cols + 1, dtype=torch.float32).to(dtype) * 40
    base[::97] = float("nan")
    for x, x_gpu in on_device_views(base, lambda t: t[:-1].view(rows, cols), lambda t: t[1:].view(rows, cols)):
        for fmt in FORMATS:
            y_cpu, yt_cpu = fp8mp.cast_to_fp8_transpose(x, torch.tensor([1.5]), torch.zeros(1), fmt)
            amax_gpu = torch.zeros(1, device="cuda")
            y_gpu, yt_gpu = fp8mp.cast_to_fp8_transpose(x_gpu, torch.tensor([1.5], device="cuda"), amax_gpu, fmt)
            assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
            assert torch.equal(yt_gpu.cpu().view(torch.uint8), yt_cpu.view(torch.uint8))
            assert math.isnan(amax_gpu.item())


@needs_cuda
@pytest.mark.cuda
def test_cuda_transpose_beyond_2m_rows():
    # 2,097,120 rows was the old limit (65535 tiles of 32 rows on grid.y).
    rows, cols = 2_097_152 + 96 + 5, 16
    x = (torch.randn(rows, cols, dtype=torch.float32) * 50).to(torch.bfloat16)
    amax_cpu, amax_gpu = torch.zeros(1), torch.zeros(1, device="cuda")
    y_cpu, yt_cpu = fp8mp.cast_to_fp8_transpose(x, torch.tensor([2.0]), amax_cpu, "e4m3")
    y_gpu, yt_gpu = fp8mp.cast_to_fp8_transpose(x.cuda(), torch.tensor([2.0], device="cuda"), amax_gpu, "e4m3")
    assert torch.equal(y_gpu.cpu().view(torch.uint8), y_cpu.view(torch.uint8))
    assert torch.equal(yt_gpu.cpu().view(torch.uint8), yt_cpu.view(torch.uint8))
    assert amax_gpu.item() == amax_cpu.item()
