"""fp8mp LayerNorm / RMSNorm forward ops (high precision and FP8 output), against torch's own norms."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.ops import norm as norm_ops
from fp8_reference import FP8_DTYPES, torch_reference_bits
from norm_reference import (DTYPES, EPS32, FORMATS, HIDDEN, check_forward,
                            gain64, make_params, make_rows)


# ---------------------------------------------------------------- forward vs torch


@pytest.mark.parametrize("case", ["affine", "no_bias", "none", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("kind", ["random", "large", "tiny_variance"])
def test_layernorm_matches_torch(kind, hidden, dtype, case):
    shape = (5, hidden) if hidden % 2 else (2, 3, hidden)
    x = make_rows(kind, shape, dtype)
    w, b = make_params(hidden, case)
    zc = case == "zero_centered"
    eps = 1e-5
    out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, b, eps, zc)
    assert out.dtype == dtype and out.shape == x.shape
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == shape[:-1]
    g64 = gain64(w, hidden, zc)
    x64 = x.double()
    ref64 = F.layer_norm(x64, (hidden,), g64, None if b is None else b.double(), eps)
    g32 = None if g64 is None else g64.float()
    ref32 = F.layer_norm(x.float(), (hidden,), g32, b, eps)
    mean64 = x64.mean(-1)
    rstd64 = 1 / (x64.var(-1, unbiased=False) + eps).sqrt()
    assert torch.all((mean.double() - mean64).abs() <= EPS32 * mean64.abs() + 1e-6 / rstd64)
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-5, atol=0)
    check_forward(out, ref64, ref32, x, rstd64, g64, dtype)


@pytest.mark.parametrize("case", ["affine", "none", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("kind", ["random", "large", "tiny_variance"])
def test_rmsnorm_matches_torch(kind, hidden, dtype, case):
    shape = (5, hidden) if hidden % 2 else (2, 3, hidden)
    x = make_rows(kind, shape, dtype)
    w, _ = make_params(hidden, case)
    zc = case == "zero_centered"
    eps = 1e-6
    out, rstd = torch.ops.fp8mp.rmsnorm_fwd(x, w, eps, zc)
    assert out.dtype == dtype and out.shape == x.shape and rstd.shape == shape[:-1] and rstd.dtype == torch.float32
    g64 = gain64(w, hidden, zc)
    x64 = x.double()
    ref64 = F.rms_norm(x64, (hidden,), g64, eps)
    ref32 = F.rms_norm(x.float(), (hidden,), None if g64 is None else g64.float(), eps)
    rstd64 = 1 / (x64.square().mean(-1) + eps).sqrt()
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-5, atol=0)
    check_forward(out, ref64, ref32, x, rstd64, g64, dtype)


def test_large_magnitude_rows_beat_one_pass_variance():
    x = make_rows("large", (64, 4096), torch.float32, seed=3)
    _, _, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    x64 = x.double()
    rstd64 = 1 / (x64.var(-1, unbiased=False) + 1e-5).sqrt()
    one_pass_var = (x.square().mean(-1) - x.mean(-1).square()).clamp_min(0)  # what a naive fp32 kernel gets
    one_pass_rstd = 1 / (one_pass_var.double() + 1e-5).sqrt()
    assert ((one_pass_rstd - rstd64).abs() / rstd64).max() > 1e-2  # the case really is hard
    assert ((rstd.double() - rstd64).abs() / rstd64).max() < 1e-5


def test_constant_rows_and_nan_rows():
    x = torch.full((3, 16), 7.25)
    x[2, 5] = math.nan
    out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    assert torch.equal(out[:2], torch.zeros(2, 16)) and mean[:2].tolist() == [7.25, 7.25]
    assert rstd[0].item() == pytest.approx(1 / math.sqrt(1e-5), rel=1e-6)
    assert out[2].isnan().all() and mean[2].isnan() and rstd[2].isnan()


def test_non_contiguous_input_and_empty_batch():
    base = torch.randn(40, 24)
    x = base.t()  # [24, 40], rows not contiguous
    w = torch.randn(40)
    out = norm_ops.layer_norm(x, w, None)
    torch.testing.assert_close(out, F.layer_norm(x, (40,), w), rtol=1e-5, atol=1e-5)
    out, rstd = torch.ops.fp8mp.rmsnorm_fwd(torch.empty(0, 8), None, 1e-6, False)
    assert out.shape == (0, 8) and rstd.shape == (0,)
    amax = torch.tensor([5.0])
    y, _, _ = torch.ops.fp8mp.layernorm_fwd_fp8(torch.empty(0, 3, 8), None, None, 1e-5, False, torch.ones(1), amax, "e4m3")
    assert y.shape == (0, 3, 8) and amax.item() == 0.0


def test_weight_dtype_may_differ_from_input_dtype():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w, b = torch.randn(64), torch.randn(64)
    out = norm_ops.layer_norm(x, w, b)
    assert out.dtype == torch.bfloat16
    out_bf16w = norm_ops.layer_norm(x, w.bfloat16(), b.bfloat16())
    ref = F.layer_norm(x.float(), (64,), w.bfloat16().float(), b.bfloat16().float()).bfloat16()
    assert (out_bf16w.float() - ref.float()).abs().max() <= 2 ** -6 * ref.float().abs().max()


# ---------------------------------------------------------------- FP8 output


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 1000, 4096])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_fp8_output_is_cast_of_high_precision_output(norm, hidden, dtype, fmt):
    shape = (9, hidden) if hidden < 4096 else (2, 2, hidden)
    x = make_rows("random", shape, dtype, seed=hidden)
    w, b = make_params(hidden, "affine")
    for scale in (1.0, 37.5, 2.0**-3, 600.0):
        scale_t = torch.tensor([scale])
        amax = torch.full((1,), -1.0)
        if norm == "layernorm":
            out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, True)
            y, mean8, rstd8 = torch.ops.fp8mp.layernorm_fwd_fp8(x, w, b, 1e-5, True, scale_t, amax, fmt)
            assert torch.equal(mean8, mean)
        else:
            out, rstd = torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, False)
            y, rstd8 = torch.ops.fp8mp.rmsnorm_fwd_fp8(x, w, 1e-6, False, scale_t, amax, fmt)
        assert torch.equal(rstd8, rstd)
        assert y.dtype == FP8_DTYPES[fmt] and y.shape == x.shape
        cast_amax = torch.zeros(1)
        expected = fp8mp.cast_to_fp8(out, scale_t, cast_amax, fmt)
        assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(y.view(torch.uint8), torch_reference_bits(out, scale, fmt))
        assert amax.item() == cast_amax.item() == out.float().abs().max().item()


def test_fp8_amax_propagates_nan_and_wrappers_match_ops():
    x = torch.randn(4, 32)
    x[3, 0] = math.nan
    amax = torch.zeros(1)
    y, _, _ = norm_ops.layer_norm_fp8(x, None, None, 1e-5, torch.ones(1), amax, "e4m3")
    assert math.isnan(amax.item())
    assert (y[3].view(torch.uint8).to(torch.int32) & 0x7F == 0x7F).all()
    amax2 = torch.zeros(1)
    y2, rstd = norm_ops.rms_norm_fp8(x[:3], torch.ones(32), 1e-6, torch.tensor([4.0]), amax2, "E5M2")
    assert y2.dtype == torch.float8_e5m2 and amax2.item() == norm_ops.rms_norm(x[:3], torch.ones(32)).abs().max().item()
