"""fp8mp cast ops, checked bit-exactly against ml_dtypes and torch's own float8 casts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8mp
from fp8_reference import (
    FORMATS,
    FP8_DTYPES,
    SCALES,
    cast,
    all_16bit_patterns,
    dbias_reference,
    decode_reference,
    is_nan_code,
    ml_dtypes_reference_bits,
    random_fp32_across_exponents,
    torch_reference_bits,
)
from opcheck_util import opcheck_fp8_aware

def assert_matches_references(x, scale, fmt):
    y, amax = cast(x, scale, fmt)
    assert y.dtype == FP8_DTYPES[fmt] and y.shape == x.shape
    bits = y.view(torch.uint8)
    expected_torch = torch_reference_bits(x, scale, fmt)
    mismatch = (bits != expected_torch).nonzero()
    assert mismatch.numel() == 0, (
        f"{len(mismatch)} codes differ from torch, first at x={x.flatten()[mismatch[0]].item()!r}: "
        f"got {bits.flatten()[mismatch[0]].item():#x}, torch {expected_torch.flatten()[mismatch[0]].item():#x}"
    )
    expected_ml = torch.from_numpy(ml_dtypes_reference_bits(x, scale, fmt))
    nan = is_nan_code(expected_ml, fmt)
    assert torch.equal(is_nan_code(bits, fmt), nan)
    assert torch.equal(bits[~nan], expected_ml[~nan])
    # NaN is sign|0x7F in both formats.
    assert torch.all((bits[nan].to(torch.int32) & 0x7F) == 0x7F)
    return y, amax


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", SCALES)
def test_every_16bit_pattern_matches_references(dtype, fmt, scale):
    x = all_16bit_patterns(dtype)
    _, amax = assert_matches_references(x, scale, fmt)
    assert math.isnan(amax.item())  # the patterns include NaNs


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", [1.0, 3.7, 2.0**-20, 2.0**20])
def test_million_random_fp32_across_exponents(fmt, scale):
    x = random_fp32_across_exponents(1_000_000, seed=int(scale * 1000) % 997)
    assert_matches_references(x, scale, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_round_to_even(fmt):
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)  # non-negative codes below NaN
    values = torch.from_numpy(decode_reference(codes, fmt))
    finite = torch.isfinite(values)
    values, codes = values[finite], codes[finite]
    midpoints = (values[:-1].double() + values[1:].double()) / 2  # exact in fp32
    x = torch.cat([midpoints, -midpoints]).float()
    y, _ = cast(x, 1.0, fmt)
    lower, upper = codes[:-1].to(torch.int32), codes[1:].to(torch.int32)
    even = torch.where(lower % 2 == 0, lower, upper)
    got = y.view(torch.uint8).to(torch.int32)
    assert torch.equal(got[: len(even)], even)
    assert torch.equal(got[len(even):], even | 0x80)


@pytest.mark.parametrize("fmt", FORMATS)
def test_saturation_specials_and_signed_zero(fmt):
    big = {"e4m3": 448.0, "e5m2": 57344.0}[fmt]
    x = torch.tensor([1e30, -1e30, big * 1.03, -big * 1.2, math.inf, -math.inf, math.nan, 0.0, -0.0])
    y, amax = cast(x, 1.0, fmt)
    decoded = y.float()
    assert decoded[:4].tolist() == [big, -big, big, -big]
    if fmt == "e4m3":
        assert decoded[4:6].tolist() == [big, -big]
    else:
        assert decoded[4:6].tolist() == [math.inf, -math.inf]
    assert math.isnan(decoded[6].item())
    assert y.view(torch.uint8)[7:].tolist() == [0x00, 0x80]
    assert math.isnan(amax.item())


@pytest.mark.parametrize("fmt", FORMATS)
def test_subnormals_are_exact(fmt):
    codes = torch.arange(1, 1 << (3 if fmt == "e4m3" else 2), dtype=torch.uint8)  # exponent field 0
    values = torch.from_numpy(decode_reference(codes, fmt))
    y, _ = cast(values, 1.0, fmt)
    assert torch.equal(y.view(torch.uint8), codes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_amax_is_exact_max_abs(dtype):
    x = (torch.randn(1000, 37) * 50).to(dtype)
    _, amax = cast(x, 1.0, "e4m3")
    assert amax.item() == x.float().abs().max().item()
    amax_inf = cast(torch.tensor([1.0, -math.inf]).to(dtype), 1.0, "e4m3")[1]
    assert amax_inf.item() == math.inf


def test_amax_overwrites_and_empty_input_gives_zero():
    amax = torch.tensor([123.0])
    fp8mp.cast_to_fp8(torch.empty(0, 4), torch.ones(1), amax, "e4m3")
    assert amax.item() == 0.0


def test_non_contiguous_and_nd_inputs():
    base = torch.randn(8, 33, 17) * 30
    for x in (base.transpose(0, 2), base[:, ::3, 1:], base.permute(1, 2, 0)):
        assert not x.is_contiguous()
        y, amax = assert_matches_references(x, 2.0, "e4m3")
        assert y.is_contiguous() and amax.item() == x.abs().max().item()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
# (2048, 1152): y and yt (4.5 MiB) outgrow two threads' 2 MiB L2 caches, so the kernel streams them
# (cpu_features.h's larger_than_l2_caches).
@pytest.mark.parametrize("shape", [(1, 1), (3, 130), (257, 65), (64, 64), (128, 1000), (2048, 1152)])
def test_transpose_equals_cast_of_transpose(fmt, dtype, shape):
    x = (torch.randn(shape) * 100).to(dtype)
    scale = torch.tensor([1.5])
    amax_y, amax_t = torch.zeros(1), torch.zeros(1)
    y, yt = fp8mp.cast_to_fp8_transpose(x, scale, amax_t, fmt)
    expected = fp8mp.cast_to_fp8(x, scale, amax_y, fmt)
    expected_t = fp8mp.cast_to_fp8(x.t().contiguous(), scale, torch.zeros(1), fmt)
    assert yt.is_contiguous() and yt.shape == (shape[1], shape[0])
    assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(yt.view(torch.uint8), expected_t.view(torch.uint8))
    assert torch.equal(y.view(torch.uint8), torch_reference_bits(x, 1.5, fmt))
    assert amax_t.item() == amax_y.item() == x.float().abs().max().item()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (1, 700), (63, 5), (64, 64), (65, 513), (257, 65), (300, 1100), (2048, 1152)])
def test_transpose_dbias_fuses_the_column_sums(fmt, dtype, shape):
    """y, yt and amax are cast_to_fp8_transpose's; dbias has exactly the bits of the documented order of fp32
    additions (a reference that adds in another order differs in the last bits: it would fail)."""
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(shape[0] * 7 + shape[1])) * 30).to(dtype)
    scale = torch.tensor([1.5])
    amax, amax_ref = torch.zeros(1), torch.zeros(1)
    y, yt, dbias = fp8mp.cast_to_fp8_transpose_dbias(x, scale, amax, fmt)
    y_ref, yt_ref = fp8mp.cast_to_fp8_transpose(x, scale, amax_ref, fmt)
    assert torch.equal(y.view(torch.uint8), y_ref.view(torch.uint8))
    assert torch.equal(yt.view(torch.uint8), yt_ref.view(torch.uint8))
    assert amax.item() == amax_ref.item()
    assert dbias.dtype == torch.float32 and dbias.shape == (shape[1],)
    np.testing.assert_array_equal(dbias.view(torch.int32).numpy(), dbias_reference(x).view(np.int32))
    torch.testing.assert_close(dbias.double(), x.double().sum(0), rtol=1e-5, atol=1e-3)


def test_transpose_dbias_is_the_same_for_any_number_of_threads():
    x = torch.randn(1000, 777, dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append(fp8mp.cast_to_fp8_transpose_dbias(x, torch.ones(1), torch.zeros(1), "e5m2")[2])
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(r.view(torch.int32), results[0].view(torch.int32)) for r in results)


def test_transpose_dbias_propagates_nan_and_inf():
    x = torch.ones(130, 5)
    x[70, 1], x[3, 2], x[100, 2] = float("nan"), float("inf"), float("-inf")
    x[0, 3] = float("inf")
    amax = torch.zeros(1)
    _, _, dbias = fp8mp.cast_to_fp8_transpose_dbias(x, torch.ones(1), amax, "e4m3")
    assert math.isnan(amax.item())
    assert dbias[0].item() == 130.0 and math.isnan(dbias[1].item()) and math.isnan(dbias[2].item())
    assert dbias[3].item() == float("inf") and dbias[4].item() == 130.0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale_inv", [1.0, 0.25, 3.7])
def test_cast_from_fp8_all_codes(fmt, out_dtype, scale_inv):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    y = codes.view(FP8_DTYPES[fmt])
    out = fp8mp.cast_from_fp8(y, torch.tensor([scale_inv]), out_dtype)
    assert out.dtype == out_dtype
    expected = (torch.from_numpy(decode_reference(codes, fmt)) * torch.tensor(scale_inv)).to(out_dtype)
    torch_expected = (y.to(torch.float32) * torch.tensor(scale_inv)).to(out_dtype)
    for ref in (expected, torch_expected):
        assert torch.equal(out.isnan(), ref.isnan())
        assert torch.equal(out[~out.isnan()].view(torch.int16 if out_dtype != torch.float32 else torch.int32),
                           ref[~ref.isnan()].view(torch.int16 if out_dtype != torch.float32 else torch.int32))


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    fmt=st.sampled_from(FORMATS),
    log2_scale=st.integers(-12, 12),
    magnitude=st.sampled_from([1e-6, 1.0, 100.0, 1e5]),
    seed=st.integers(0, 2**16),
)
def test_property_random_shapes(shape, dtype, fmt, log2_scale, magnitude, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * magnitude).to(dtype)
    _, amax = assert_matches_references(x, 2.0**log2_scale, fmt)
    assert amax.item() == (x.float().abs().max().item() if x.numel() else 0.0)


# ---------------------------------------------------------------- opcheck


OPCHECK_CASES = [
    ("cast_to_fp8", lambda: (torch.randn(16, 32), torch.tensor([2.0]), torch.zeros(1), "e4m3")),
    ("cast_to_fp8", lambda: (torch.randn(3, 5, 7, dtype=torch.bfloat16), torch.tensor([0.5]), torch.zeros(1), "e5m2")),
    ("cast_to_fp8", lambda: (torch.randn(40, 24).t(), torch.tensor([1.0]), torch.zeros(1), "E4M3")),
    ("cast_to_fp8_transpose", lambda: (torch.randn(48, 80, dtype=torch.float16), torch.tensor([4.0]), torch.zeros(1), "e4m3")),
    ("cast_to_fp8_transpose", lambda: (torch.randn(7, 3), torch.tensor([1.0]), torch.zeros(1), "e5m2")),
    ("cast_to_fp8_transpose_dbias", lambda: (torch.randn(70, 33, dtype=torch.bfloat16), torch.tensor([2.0]), torch.zeros(1), "e5m2")),
    ("cast_to_fp8_transpose_dbias", lambda: (torch.randn(40, 24).t(), torch.tensor([1.0]), torch.zeros(1), "e4m3")),
    ("cast_from_fp8", lambda: (torch.randn(16, 8).to(torch.float8_e4m3fn), torch.tensor([0.5]), torch.bfloat16)),
    ("cast_from_fp8", lambda: (torch.randn(5).to(torch.float8_e5m2), torch.tensor([2.0]), torch.float32)),
]


@pytest.mark.parametrize("name,make_args", OPCHECK_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPCHECK_CASES)])
def test_opcheck(name, make_args):
    opcheck_fp8_aware(getattr(torch.ops.fp8mp, name).default, make_args())


# ---------------------------------------------------------------- bad input


def test_bad_format_names_fmt():
    with pytest.raises(ValueError, match="'fmt'"):
        fp8mp.cast_to_fp8(torch.randn(4), torch.ones(1), torch.zeros(1), "e3m4")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
def test_bad_input_dtype_names_x(dtype):
    with pytest.raises(RuntimeError, match="'x'"):
        fp8mp.cast_to_fp8(torch.ones(4, dtype=dtype), torch.ones(1), torch.zeros(1), "e4m3")


@pytest.mark.parametrize("arg", ["scale", "amax"])
@pytest.mark.parametrize(
    "bad,error", [(torch.ones(1, dtype=torch.float64), RuntimeError), (torch.ones(2), ValueError), (torch.ones(1, 0), ValueError)]
)
def test_bad_scalar_tensors_name_the_argument(arg, bad, error):
    args = {"scale": torch.ones(1), "amax": torch.zeros(1)}
    args[arg] = bad
    with pytest.raises(error, match=f"'{arg}'"):
        fp8mp.cast_to_fp8(torch.randn(4), args["scale"], args["amax"], "e4m3")


def test_python_float_scale_is_rejected_naming_scale():
    with pytest.raises(RuntimeError, match="scale"):
        torch.ops.fp8mp.cast_to_fp8(torch.randn(4), 1.0, torch.zeros(1), "e4m3")


def test_transpose_needs_2d():
    with pytest.raises(ValueError, match="'x' must be 2-D"):
        fp8mp.cast_to_fp8_transpose(torch.randn(2, 3, 4), torch.ones(1), torch.zeros(1), "e4m3")


def test_cast_from_fp8_bad_arguments():
    y = torch.randn(4).to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="'y'"):
        fp8mp.cast_from_fp8(torch.randn(4), torch.ones(1), torch.float32)
    with pytest.raises(RuntimeError, match="'out_dtype'"):
        fp8mp.cast_from_fp8(y, torch.ones(1), torch.float64)
    with pytest.raises(ValueError, match="'scale_inv'"):
        fp8mp.cast_from_fp8(y, torch.ones(3), torch.float32)
