"""fp8mp's block-scaled ops on CUDA against the CPU kernels: quantization bit for bit, the GEMM to a stated tolerance.

The CPU kernels are themselves checked against independent references (tests/ops/test_blockwise.py:
torchao's to_mx, torchao's rowwise scaling, a DeepSeek-V3 reference), so bit equality here carries
those checks over to the GPU. Every test needs a GPU and fp8mp's CUDA kernels (`pytest -m cuda`).
"""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8mp.ops import block_quantize, block_quantize_transpose
from opcheck_util import opcheck_fp8_aware

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")

MODES = ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (shape, (block_rows, block_cols)): MXFP8 1x32, DeepSeek 1x128 and 128x128 with partial edge tiles,
# rowwise (one tile per row, wider than the row too), odd blocks, 1x1, a tall column.
QUANTIZE_CASES = [((130, 200), (1, 32)), ((257, 300), (1, 128)), ((300, 260), (128, 128)), ((96, 72), (1, 72)),
                  ((20, 50), (1, 64)), ((37, 1000), (7, 5)), ((1, 1), (1, 1)), ((5000, 3), (3, 2))]
QUANTIZE_IDS = ["mx", "1x128", "128x128", "rowwise", "rowwise-wide-block", "odd", "1x1", "tall"]
# (shape, (row_block, col_block)) of block_quantize_transpose.
TRANSPOSE_CASES = [((256, 384), (128, 128)), ((130, 200), (32, 32)), ((96, 72), (72, 96)), ((1, 1), (32, 32)),
                   ((37, 1000), (7, 5)), ((2000, 20), (32, 2000)), ((65, 129), (1, 1))]
TRANSPOSE_IDS = ["block", "mx-partial", "rowwise", "1x1", "odd", "tall", "unit-blocks"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def hard_input(shape, dtype, seed):
    """Many exponents per tile; a zero row, a tiny and a huge row; NaN, -NaN, +Inf and -Inf elements."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2((torch.rand(shape, generator=g) * 2 - 1) * 8)
    rows, cols = shape
    if rows > 3:
        x[0] = 0
        x[1] *= 1e-38
        x[2] *= 1e30
    n = x.numel()
    if n > 16:
        flat = x.view(-1)
        flat[n // 3] = float("nan")
        flat[n // 2] = float("inf")
        flat[(2 * n) // 3] = -float("inf")
        flat[n // 5] = -float("nan")  # its sign must reach the code on both devices
    return x.to(dtype)


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape,block", QUANTIZE_CASES, ids=QUANTIZE_IDS)
def test_cuda_block_quantize_equals_cpu_bit_for_bit(shape, block, dtype, fmt, mode):
    x = hard_input(shape, dtype, seed=shape[0] + block[1])
    data, scale_inv = block_quantize(x, *block, fmt, mode)
    data_gpu, scale_inv_gpu = block_quantize(x.cuda(), *block, fmt, mode)
    assert data_gpu.is_cuda and data_gpu.dtype == data.dtype and scale_inv_gpu.dtype == scale_inv.dtype
    assert torch.equal(bits(data_gpu.cpu()), bits(data))
    assert torch.equal(bits(scale_inv_gpu.cpu()), bits(scale_inv))


@needs_cuda
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("shape,blocks", TRANSPOSE_CASES, ids=TRANSPOSE_IDS)
def test_cuda_block_quantize_transpose_equals_cpu_bit_for_bit(shape, blocks, dtype, fmt, mode):
    x = hard_input(shape, dtype, seed=shape[1] + blocks[0])
    cpu = block_quantize_transpose(x, *blocks, fmt, mode)
    gpu = block_quantize_transpose(x.cuda(), *blocks, fmt, mode)
    for got, want in zip(gpu, cpu):
        assert got.is_cuda and got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_block_quantize_every_16bit_pattern_equals_cpu(dtype, mode):
    """All 65536 bit patterns (NaN payloads, subnormals, Inf), in 1x32 tiles and in both layouts of 32x32."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    for fmt in ("e4m3", "e5m2"):
        for got, want in zip(block_quantize(x.cuda(), 1, 32, fmt, mode), block_quantize(x, 1, 32, fmt, mode)):
            assert torch.equal(bits(got.cpu()), bits(want))
        cpu = block_quantize_transpose(x, 32, 32, fmt, mode)
        gpu = block_quantize_transpose(x.cuda(), 32, 32, fmt, mode)
        for got, want in zip(gpu, cpu):
            assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
def test_cuda_non_contiguous_and_offset_inputs_equal_cpu():
    base = hard_input((300, 257), torch.bfloat16, seed=9)
    for x in (base.t(), base[1:, 3:], base[::2]):
        for got, want in zip(block_quantize(x.cuda(), 1, 128, "e4m3", "fp32"), block_quantize(x, 1, 128, "e4m3", "fp32")):
            assert torch.equal(bits(got.cpu()), bits(want))
        for got, want in zip(block_quantize_transpose(x.cuda(), 32, 32, "e4m3", "e8m0_rceil"),
                             block_quantize_transpose(x, 32, 32, "e4m3", "e8m0_rceil")):
            assert torch.equal(bits(got.cpu()), bits(want))


@needs_cuda
def test_cuda_empty_inputs_give_empty_outputs():
    for shape in ((0, 64), (64, 0)):
        x = torch.empty(shape, device="cuda")
        data, scale_inv = block_quantize(x, 1, 32, "e4m3", "fp32")
        assert data.shape == shape and scale_inv.shape == (shape[0], -(-shape[1] // 32))
        assert [t.shape for t in block_quantize_transpose(x, 32, 32, "e4m3", "fp32")] == \
               [t.shape for t in block_quantize_transpose(x.cpu(), 32, 32, "e4m3", "fp32")]


@needs_cuda
@pytest.mark.parametrize("mode", ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"])
def test_opcheck_block_quantize_cuda(mode):
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default, (torch.randn(33, 70, device="cuda"), 1, 32, "e4m3", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default,
                      (torch.randn(130, 70, device="cuda").bfloat16(), 128, 128, "e5m2", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize_transpose.default,
                      (torch.randn(40, 24, device="cuda").half(), 24, 40, "e5m2", mode))


@needs_cuda
def test_cuda_kernels_refuse_what_the_cpu_kernels_refuse():
    from opcheck_util import error_of
    from test_blockwise import BAD_CALLS

    for name, call in BAD_CALLS.items():
        if name.startswith(("quantize", "transpose")):
            assert error_of(call, "cuda") == error_of(call, "cpu"), name
