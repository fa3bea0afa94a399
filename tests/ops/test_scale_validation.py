"""Scales that are not finite and > 0 (and unusable fp8_max values): refused where their value is on the host
(CPU tensors, Python numbers), made visibly non-finite on a GPU, where reading them would cost a host sync:
every value cast with such a scale is +NaN (an input NaN keeps its sign), the same bits as the CPU kernels
write (csrc/common/nan_keeping_scale.h; tests/cpp/test_cross_device_rules.cpp checks those)."""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
from fp8mp.ops import (cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias, compute_scale,
                       update_amax_history_and_scale)
from fp8mp.ops.norm import layer_norm_fp8, rms_norm_fp8

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")

BAD_SCALES = [0.0, -0.0, -1.0, -1e-30, math.inf, -math.inf, math.nan]
BAD_IDS = ["zero", "minus-zero", "negative", "tiny-negative", "inf", "minus-inf", "nan"]
E4M3_NAN, E5M2_NAN = 0x7F, 0x7F  # sign clear: the canonical NaN's code in both formats


def scalar(value: float, device="cpu") -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32, device=device)


def layernorm_fp8(x, scale, amax, fmt):
    return layer_norm_fp8(x, None, None, 1e-5, scale, amax, fmt)[0]


def rmsnorm_fp8(x, scale, amax, fmt):
    return rms_norm_fp8(x, None, 1e-5, scale, amax, fmt)[0]


CASTS = {
    "cast_to_fp8": lambda x, scale, amax, fmt: cast_to_fp8(x, scale, amax, fmt),
    "cast_to_fp8_transpose": lambda x, scale, amax, fmt: cast_to_fp8_transpose(x, scale, amax, fmt)[0],
    "cast_to_fp8_transpose_dbias": lambda x, scale, amax, fmt: cast_to_fp8_transpose_dbias(x, scale, amax, fmt)[0],
    "layernorm_fwd_fp8": layernorm_fp8,
    "rmsnorm_fwd_fp8": rmsnorm_fp8,
}


@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
@pytest.mark.parametrize("op", list(CASTS))
def test_a_cpu_cast_refuses_a_scale_that_is_not_finite_and_positive(op, bad):
    x = torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"argument 'scale' must be finite and > 0, got"):
        CASTS[op](x, scalar(bad), torch.zeros(1), "e4m3")
    CASTS[op](x, scalar(1e-30), torch.zeros(1), "e4m3")  # tiny but positive: fine


@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
def test_a_cpu_decode_refuses_a_scale_inv_that_is_not_finite_and_positive(bad):
    y = torch.randn(4, 4).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"fp8mp::cast_from_fp8: argument 'scale_inv' must be finite and > 0"):
        cast_from_fp8(y, scalar(bad))


@pytest.mark.parametrize("bad", [0.0, -448.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"])
def test_a_cpu_scale_update_refuses_an_unusable_fp8_max(bad):
    amax, history = torch.ones(2), torch.zeros(4, 2)
    scale, scale_inv = torch.ones(2), torch.ones(2)
    with pytest.raises(ValueError, match=r"argument 'fp8_max' must be finite and > 0, got .* at index 1"):
        update_amax_history_and_scale(amax, history, scale, scale_inv, torch.tensor([448.0, bad]), 0, "max")


@pytest.mark.parametrize("bad", [0, -448.0, math.inf, math.nan, True, "448"])
def test_compute_scale_refuses_an_unusable_fp8_max(bad):
    with pytest.raises(ValueError, match=r"fp8_max must be a finite number > 0"):
        compute_scale(torch.ones(1), bad, 0, torch.ones(1))
    assert compute_scale(torch.tensor([2.0]), 448, 0, torch.ones(1)).item() == 224.0


def _input_with_nans(device):
    x = torch.randn(8, 16)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = math.inf, -math.inf, math.nan, -math.nan
    return x.to(device)


@needs_cuda
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
@pytest.mark.parametrize("op", ["cast_to_fp8", "cast_to_fp8_transpose", "cast_to_fp8_transpose_dbias"])
def test_cuda_cast_with_a_bad_scale_writes_nan_codes(op, bad, fmt):
    x = _input_with_nans("cuda")
    amax = torch.zeros(1, device="cuda")
    codes = CASTS[op](x, scalar(bad, "cuda"), amax, fmt).view(torch.uint8).cpu()
    want = torch.full_like(codes, E4M3_NAN if fmt == "e4m3" else E5M2_NAN)
    want[3, 3] = 0xFF  # -NaN input: its sign survives
    assert torch.equal(codes, want)
    assert math.isnan(amax.item())  # amax is of x (which holds a NaN), not of the scaled values


@needs_cuda
@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
@pytest.mark.parametrize("op", ["layernorm_fwd_fp8", "rmsnorm_fwd_fp8"])
def test_cuda_norm_with_a_bad_scale_writes_nan_codes(op, bad):
    x = torch.randn(8, 16, device="cuda")
    codes = CASTS[op](x, scalar(bad, "cuda"), torch.zeros(1, device="cuda"), "e4m3").view(torch.uint8).cpu()
    assert torch.equal(codes, torch.full_like(codes, E4M3_NAN))


@needs_cuda
@pytest.mark.parametrize("out_dtype,nan_bits", [(torch.float32, (0x7FC00000, -0x00400000)),
                                                (torch.bfloat16, (0x7FC0, -0x0040)), (torch.float16, (0x7E00, -0x0200))],
                         ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("bad", BAD_SCALES, ids=BAD_IDS)
def test_cuda_decode_with_a_bad_scale_inv_writes_nan(bad, out_dtype, nan_bits):
    y = torch.tensor([0x38, 0xB8, 0x00, 0x7F, 0xFF], dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = cast_from_fp8(y.cuda(), scalar(bad, "cuda"), out_dtype).cpu()
    int_type = torch.int32 if out_dtype == torch.float32 else torch.int16
    got = out.view(int_type).tolist()
    positive, negative = nan_bits  # +NaN and the -NaN code's own NaN (as a signed integer)
    assert got == [positive] * 4 + [negative]


@needs_cuda
@pytest.mark.parametrize("bad", [0.0, -448.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"])
def test_cuda_scale_update_with_an_unusable_fp8_max_makes_the_scale_nan(bad):
    amax, history = torch.full((2,), 3.0, device="cuda"), torch.zeros(4, 2, device="cuda")
    scale, scale_inv = torch.ones(2, device="cuda"), torch.ones(2, device="cuda")
    update_amax_history_and_scale(amax, history, scale, scale_inv, torch.tensor([448.0, bad], device="cuda"), 0, "max")
    assert scale[0].item() == pytest.approx(448.0 / 3.0) and scale_inv[0].item() == pytest.approx(3.0 / 448.0)
    assert scale[1:].cpu().view(torch.int32).item() == 0x7FC00000
    assert scale_inv[1:].cpu().view(torch.int32).item() == 0x7FC00000


@needs_cuda
@pytest.mark.parametrize("fp8", [False, True], ids=["hp", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_norm_nan_made_by_inf_minus_inf_has_the_cpu_bits(dtype, fp8):
    """+Inf and -Inf in one row: the statistics make a NaN (Inf - Inf) that the GPU would write as 0x7FFFFFFF
    and x86 as -NaN; both devices write the canonical +NaN, in the outputs, the FP8 codes and mean / rstd.
    Only row 1 is compared bit for bit: the finite rows' statistics are sums in another order on each device
    (the CPU in 16 lanes and a tree, the GPU in lane pairs and a butterfly), so they may differ in the last bit."""
    x = torch.randn(4, 64)
    x[1, 3], x[1, 40] = math.inf, -math.inf
    x = x.to(dtype)
    results = []
    for device in ("cpu", "cuda"):
        xd = x.to(device)
        if fp8:
            out = torch.ops.fp8mp.layernorm_fwd_fp8(xd, None, None, 1e-5, False, scalar(1.0, device),
                                                    torch.zeros(1, device=device), "e4m3")
        else:
            out = torch.ops.fp8mp.layernorm_fwd(xd, None, None, 1e-5, False)
        assert out[0][1].float().isnan().all()  # Inf - Inf in row 1's statistics reaches every output of the row
        results.append([t.cpu()[1:2].contiguous().view(torch.uint8) for t in out])  # out [4, 64], mean / rstd [4]
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
