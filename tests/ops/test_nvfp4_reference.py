"""tests/nvfp4_reference.py held to the formats' fp64 definitions and to torchao 0.18's nvfp4_quantize (CPU).

torchao is imported inside `_torchao_nvfp4` (the pattern of tests/torchao_reference.py), so this module collects
and its spec tests run where torchao is absent. Where torchao and the spec part, the test asserts the difference.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import nvfp4_reference as ref

WHY = "torchao is this test's independent reference and is not installed"


def _torchao_nvfp4(x: np.ndarray, two_level: bool) -> tuple[np.ndarray, np.ndarray]:
    """(block scale bytes, packed codes) of torchao's nvfp4_quantize of fp32 x; two-level with its
    per_tensor_amax_to_scale of amax(|x|), as torchao's NVFP4Tensor callers do."""
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason=WHY)
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    pts = nv.per_tensor_amax_to_scale(t.abs().max()) if two_level else None
    scales, packed = nv.nvfp4_quantize(t, 16, pts)
    return scales.view(torch.uint8).numpy(), packed.numpy()


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(48)
    outliers = rng.standard_normal((32, 128)) * np.where(rng.random((32, 128)) < 0.03, 3e4, 1.0)
    # Blocks far below the tensor amax: their block scales clamp at E4M3's 2**-6 and their values land on
    # E2M1's subnormal 0.5 or round to (signed) zero; the last rows are fp32 subnormals.
    small = rng.standard_normal((16, 64)) * 10.0 ** rng.uniform(-9, 0, (16, 1))
    small[0, 0] = 1000.0
    small[-2:] = rng.standard_normal((2, 64)) * 1e-40
    ties = rng.choice([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], size=(8, 32)) * rng.choice([-1, 1], size=(8, 32))
    ties[:, ::16] = 6.0  # block amax 6: one-level scale 1, so x/1 sits exactly on E2M1 midpoints (ties to even)
    return {
        "random": rng.standard_normal((64, 256)) * 3.0,
        "outliers": outliers,
        "subnormal_range": small,
        "fp32_subnormal": rng.standard_normal((4, 32)) * 1e-41,
        "ties": ties,
        "signed_zeros": np.array([[0.0, -0.0] * 8 + [1.0] * 16]),
        "wide": rng.standard_normal((8, 64)) * 10.0 ** rng.uniform(-30, 30, (8, 64)),
    }


# ---------------------------------------------------------------- the formats against fp64 formulas


def test_every_e2m1_code_decodes_to_its_fp64_formula():
    for c in range(16):
        s, e, m = c >> 3, (c >> 1) & 3, c & 1
        want = (-1) ** s * (2.0 ** (1 - 1) * (m / 2) if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))
        got = ref.e2m1_decode(np.array([c]))[0]
        assert got == want and np.signbit(got) == bool(s), c
        assert float(np.array([c], np.uint8).view(ml_dtypes.float4_e2m1fn)[0]) == want  # ml_dtypes agrees
    assert sorted(set(ref.E2M1_VALUES[:8])) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_every_e4m3_bit_pattern_decodes_to_its_fp64_formula():
    got = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            assert np.isnan(got[b]), b  # the only NaN encodings, 0x7F and 0xFF; no Inf
            continue
        want = (-1) ** s * (2.0 ** (1 - 7) * (m / 8) if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))
        assert got[b] == want and np.signbit(got[b]) == bool(s), b
    assert np.nanmax(got) == ref.F8_MAX and ref.E4M3_TINY == 2.0 ** -6


def test_e2m1_encode_rounds_to_nearest_even_saturates_and_keeps_the_sign():
    y = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.1, 1e30, np.inf, -0.0, -0.1, -0.25, -5.0, -np.inf])
    want = np.array([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -0.0, -0.0, -0.0, -4.0, -6.0])
    codes = ref.e2m1_encode(y)
    np.testing.assert_array_equal(ref.e2m1_decode(codes), want)
    np.testing.assert_array_equal(np.signbit(ref.e2m1_decode(codes)), np.signbit(y))  # -0 keeps code 8
    # every grid value encodes to its own code, and a fine sweep lands on the nearest value
    assert (ref.e2m1_encode(ref.E2M1_VALUES) == np.arange(16)).all()
    sweep = np.linspace(-7, 7, 2801)
    dist = np.abs(ref.e2m1_decode(ref.e2m1_encode(sweep)) - np.clip(sweep, -6, 6))
    assert (dist <= np.abs(np.clip(sweep, -6, 6)[:, None] - ref.E2M1_VALUES).min(axis=1)).all()
    # ml_dtypes' own E2M1 cast (round to nearest even) agrees in range
    inside = np.random.default_rng(1).uniform(-6, 6, 4096).astype(np.float32)
    np.testing.assert_array_equal(ref.e2m1_decode(ref.e2m1_encode(inside)),
                                  inside.astype(ml_dtypes.float4_e2m1fn).astype(np.float64))
    with pytest.raises(ValueError, match="y"):
        ref.e2m1_encode(np.array([np.nan]))


def test_packing_puts_the_first_element_in_the_low_nibble_as_torchao_does():
    codes = np.arange(16, dtype=np.uint8)[None, :]
    packed = ref.pack(codes)
    assert packed[0, 0] == 0x10 and packed[0, 7] == 0xFE  # (e0 | e1 << 4), (e14 | e15 << 4)
    np.testing.assert_array_equal(ref.unpack(packed), codes)
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels", reason=WHY)
    np.testing.assert_array_equal(kernels.pack_uint4(torch.from_numpy(codes)).numpy(), packed)


# ---------------------------------------------------------------- bit-identical to torchao 0.18


@pytest.mark.parametrize("two_level", [False, True], ids=["one_level", "two_level"])
@pytest.mark.parametrize("name", list(_inputs()))
def test_codes_and_block_scales_match_torchao_bit_for_bit(name, two_level):
    x = _inputs()[name].astype(np.float32)
    codes, scales, ts = ref.quantize(x, two_level)
    want_scales, want_packed = _torchao_nvfp4(x, two_level)
    np.testing.assert_array_equal(scales.view(np.uint8), want_scales)
    np.testing.assert_array_equal(ref.pack(codes), want_packed)
    if two_level:
        assert ts == np.float32(np.abs(x).max()) / np.float32(2688.0)


def test_inf_saturates_under_one_level_scaling_as_torchao_does():
    x = np.ones((2, 32), np.float32)
    x[0, 3], x[1, 20] = np.inf, -np.inf
    codes, scales, _ = ref.quantize(x, two_level=False)
    want_scales, want_packed = _torchao_nvfp4(x, two_level=False)
    np.testing.assert_array_equal(scales.view(np.uint8), want_scales)
    np.testing.assert_array_equal(ref.pack(codes), want_packed)
    assert ref.e2m1_decode(codes)[0, 3] == 6.0 and ref.e2m1_decode(codes)[1, 20] == -6.0
    assert float(scales[0, 0]) == 448.0


def test_where_torchao_and_the_spec_part_the_reference_follows_the_spec():
    # All-zero tensor, two-level: torchao's per-tensor scale is 0 and every block scale 0/0 = NaN (byte 0xFF);
    # the reference takes TE's per-tensor scale 1 for amax 0, so the zeros quantize to zero with finite scales.
    zeros = np.zeros((4, 32), np.float32)
    codes, scales, ts = ref.quantize(zeros, two_level=True)
    assert ts == 1.0 and (codes == 0).all() and (scales.astype(np.float32) == ref.E4M3_TINY).all()
    want_scales, _ = _torchao_nvfp4(zeros, two_level=True)
    assert np.isnan(want_scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).all()
    # NaN (any scaling) and Inf (two-level): torchao gives NaN block scales; E2M1 has no NaN: the reference refuses.
    nan = np.ones((1, 16), np.float32)
    nan[0, 5] = np.nan
    inf = np.ones((1, 16), np.float32)
    inf[0, 5] = np.inf
    for x, two_level in [(nan, False), (nan, True), (inf, True)]:
        with pytest.raises(ValueError, match="x"):
            ref.quantize(x, two_level)
        want_scales, _ = _torchao_nvfp4(x, two_level)
        assert np.isnan(want_scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).all()


# ---------------------------------------------------------------- error bound, 16x16 weight blocks


def _half_ulp(y: np.ndarray) -> np.ndarray:
    """Half the E2M1 spacing around |y| (spacing 0.5 below 2, 1 in [2, 4), 2 from 4, where saturation at 6 of
    a value up to 7 stays inside it)."""
    a = np.abs(y)
    return np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))


@pytest.mark.parametrize("two_level", [False, True], ids=["one_level", "two_level"])
@pytest.mark.parametrize("name", ["random", "outliers", "subnormal_range", "ties", "wide"])
def test_quantize_dequantize_error_within_half_an_e2m1_ulp(name, two_level):
    x = _inputs()[name].astype(np.float32)
    codes, scales, ts = ref.quantize(x, two_level)
    s = ref.dequantize(np.ones_like(codes) * 2, scales, ts)  # code 2 is 1.0: the total scale per element
    y = x.astype(np.float64) / s
    err = np.abs(x - ref.dequantize(codes, scales, ts))
    # One-level scaling has no per-tensor scale: a block whose amax / 6 passes 448 gets the scale 448 and its
    # values beyond 6 * 448 saturate there (the reason for the two-level scheme). Elsewhere |y| <= 6 * (1 + 2**-4).
    clamped = np.repeat(scales.astype(np.float32) == ref.F8_MAX, 16, axis=1) & (np.abs(y) > 7.0)
    assert two_level is False or not clamped.any()
    assert np.abs(y[~clamped]).max() <= 7.0
    np.testing.assert_array_equal(np.abs(ref.e2m1_decode(codes[clamped])), 6.0)
    bound = _half_ulp(y) * s * (1 + 2.0 ** -20) + np.abs(x) * 2.0 ** -21
    assert (err[~clamped] <= bound[~clamped]).all()


@pytest.mark.parametrize("two_level", [False, True], ids=["one_level", "two_level"])
def test_weight_blocks_of_16x16_share_one_scale_and_transpose_exactly(two_level):
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((48, 64)) * np.exp(rng.standard_normal((48, 64)))).astype(np.float32)
    codes, scales, ts = ref.quantize_2d(w, two_level)
    assert scales.shape == (3, 4)
    # each tile's scale is the 1-D rule on the tile's amax: a 16-element block holding that amax gets the same
    tile_amax = np.abs(w).reshape(3, 16, 4, 16).max(axis=(1, 3))
    probe = np.zeros((12, 16), np.float32)
    probe[:, 0] = tile_amax.reshape(-1)
    probe_ts = ts if two_level else None
    _, probe_scales = ref._quantize_blocks(probe[:, None, :], probe[:, :1], probe_ts)
    np.testing.assert_array_equal(probe_scales.reshape(3, 4).view(np.uint8), scales.view(np.uint8))
    # W and W^T quantize to the same values, so forward and backward see one quantized weight
    codes_t, scales_t, ts_t = ref.quantize_2d(np.ascontiguousarray(w.T), two_level)
    np.testing.assert_array_equal(codes_t, codes.T)
    np.testing.assert_array_equal(scales_t.view(np.uint8), scales.T.view(np.uint8))
    deq = ref.dequantize(codes, scales, ts, tile_rows=16)
    np.testing.assert_array_equal(ref.dequantize(codes_t, scales_t, ts_t, tile_rows=16), deq.T)
    s = ref.dequantize(np.full_like(codes, 2), scales, ts, tile_rows=16)
    y = w / s
    assert (np.abs(w - deq) <= _half_ulp(y) * s * (1 + 2.0 ** -20) + np.abs(w) * 2.0 ** -21).all()
    with pytest.raises(ValueError, match="x"):
        ref.quantize_2d(w[:40], two_level)


# ---------------------------------------------------------------- random Hadamard transform


def test_hadamard16_is_sylvester_and_orthogonal():
    h = ref.hadamard16()
    i, j = np.indices((16, 16))
    popcount = np.vectorize(lambda v: bin(int(v)).count("1"))(i & j)
    np.testing.assert_array_equal(h, (-1.0) ** popcount)  # Sylvester: H[i, j] = (-1)^popcount(i & j)
    np.testing.assert_array_equal(h @ h.T, 16 * np.eye(16))
    for seed in (0, 1, 12345):
        r = ref.rht_matrix(seed)
        np.testing.assert_allclose(r @ r.T, np.eye(16), rtol=0, atol=1e-15)
        np.testing.assert_allclose(r.T @ r, np.eye(16), rtol=0, atol=1e-15)


def test_rht_inverse_undoes_it_and_keeps_norms():
    x = np.random.default_rng(3).standard_normal((8, 64)) * 100
    y = ref.rht(x, seed=11)
    np.testing.assert_allclose(ref.rht_inverse(y, seed=11), x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(y.reshape(8, 4, 16), axis=-1),
                               np.linalg.norm(x.reshape(8, 4, 16), axis=-1), rtol=1e-14)
    assert not np.allclose(ref.rht_inverse(y, seed=12), x)  # another seed does not undo it
    with pytest.raises(ValueError, match="x"):
        ref.rht(x[:, :20], seed=11)


def test_rht_signs_follow_the_seed():
    for seed in (0, 7, 2**40):
        signs = ref.rht_signs(seed)
        np.testing.assert_array_equal(signs, 1 - 2 * np.random.default_rng(seed).integers(0, 2, 16))
        np.testing.assert_array_equal(signs, ref.rht_signs(seed))
        assert set(signs) <= {-1.0, 1.0}
        np.testing.assert_array_equal(ref.rht_matrix(seed), signs[:, None] * ref.hadamard16() / 4)
    assert len({tuple(ref.rht_signs(s)) for s in range(8)}) > 1
    # pinned, so a change of the rule (or of numpy's PCG64 stream) shows here
    np.testing.assert_array_equal(ref.rht_signs(0), [-1, -1, -1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1])
