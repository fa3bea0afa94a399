"""fp8mp.fp8_gemm: out = (a @ b.T) * (a_scale_inv * b_scale_inv) + bias, against independent references.

The main reference decodes with torch's own float8 -> float32 conversion and
multiplies in float64, so it shares no code with fp8mp. fp8mp accumulates in
fp32, so results are compared with a bound on fp32 accumulation error
(relative to sum_k |a_mk * b_nk|) plus one ulp of the output dtype, the
rounding step that error can tip over.
"""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
from fp8_reference import decode_reference, is_nan_code
from opcheck_util import opcheck_fp8_aware
from gemm_reference import (E4M3, E5M2, FORMAT_PAIRS, OUT_DTYPES, SHAPES, assert_close_to_reference, fp8_randn,
                            reference_f64, run_and_check, scalar)


# ---------------------------------------------------------------- CPU against the float64 reference


@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS, ids=lambda d: str(d).split("_")[-1] if isinstance(d, torch.dtype) else None)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_reference(a_dtype, b_dtype, out_dtype, with_bias, shape):
    M, K, N = shape
    a = fp8_randn((M, K), a_dtype, 4.0, seed=M * 7 + K)
    b = fp8_randn((N, K), b_dtype, 0.5, seed=N * 11 + K)
    bias = (torch.randn(N) * 3).to(out_dtype) if with_bias else None
    out = run_and_check(a, b, 0.37, 2.5, bias, out_dtype)
    if K == 0 and M and N:  # an empty sum: exactly the bias, or zeros
        expected = bias.expand(M, N) if with_bias else torch.zeros(M, N, dtype=out_dtype)
        assert torch.equal(out, expected)


@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS)
def test_every_product_of_finite_codes_is_exact(a_dtype, b_dtype):
    """K = 1: out = every product of two finite FP8 values, each exact in fp32 (at most 7 significant bits)."""
    def finite_codes(dtype):
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        values = codes.view(dtype).to(torch.float32)
        return codes[torch.isfinite(values)].view(dtype).reshape(-1, 1)

    a, b = finite_codes(a_dtype), finite_codes(b_dtype)
    out = fp8mp.fp8_gemm(a, scalar(1.0), b, scalar(1.0), out_dtype=torch.float32)
    expected = a.to(torch.float32) * b.to(torch.float32).t()
    assert torch.equal(out, expected)
    # torch's decode (used by expected) agrees with ml_dtypes' on these codes.
    fmt = "e4m3" if a_dtype == E4M3 else "e5m2"
    assert torch.equal(a.to(torch.float32).flatten(), torch.from_numpy(decode_reference(a.view(torch.uint8).flatten(), fmt)))


def test_nan_and_inf_propagate():
    a = fp8_randn((3, 32), E4M3)
    b = fp8_randn((4, 32), E5M2)
    a.view(torch.uint8)[1, 5] = 0x7F  # E4M3 NaN
    b.view(torch.uint8)[2, 7] = 0x7C  # E5M2 +Inf
    assert is_nan_code(a.view(torch.uint8)[1, 5:6], "e4m3").item()
    out = fp8mp.fp8_gemm(a, scalar(1.0), b, scalar(1.0), out_dtype=torch.float32)
    assert out[1].isnan().all()
    assert math.isinf(out[0, 2].item()) or math.isnan(out[0, 2].item())
    mask = torch.ones_like(out, dtype=torch.bool)
    mask[1, :] = False
    mask[:, 2] = False
    assert torch.isfinite(out[mask]).all()


@pytest.mark.parametrize("out_dtype,log2_scale", [(torch.bfloat16, -136), (torch.float16, -30), (torch.float32, -140)])
def test_subnormal_outputs_round_like_torch(out_dtype, log2_scale):
    """Sums of small integers scaled into out_dtype's subnormal range: the exact fp32 value (integer sums and a
    power-of-two scale are exact) rounded once, as torch's conversion rounds it, on whatever CPU path runs."""
    gen = torch.Generator().manual_seed(5)
    a = torch.randint(-4, 5, (70, 64), generator=gen).float().to(E4M3)
    b = torch.randint(-4, 5, (45, 64), generator=gen).float().to(E4M3)
    out = fp8mp.fp8_gemm(a, scalar(2.0**log2_scale), b, scalar(1.0), out_dtype=out_dtype)
    exact = (a.double() @ b.double().t()) * 2.0**log2_scale
    expected = exact.float().to(out_dtype)
    assert (expected != 0).float().mean() > 0.5  # the case is in the subnormal range, not flushed to nothing
    view = torch.int32 if out_dtype == torch.float32 else torch.int16
    assert torch.equal(out.view(view), expected.view(view))


def test_row_blocks_of_large_m():
    """M * K above the CPU emulation's decode block (2**22 values): several row blocks, same result."""
    M, K, N = 2100, 4096, 8
    a = fp8_randn((M, K), E4M3, 2.0, seed=1)
    b = fp8_randn((N, K), E4M3, 0.1, seed=2)
    bias = torch.randn(N)
    out = run_and_check(a, b, 0.5, 1.25, bias, torch.float32)
    assert torch.equal(out[-5:], fp8mp.fp8_gemm(a[-5:], scalar(0.5), b, scalar(1.25), bias, torch.float32))


def test_non_contiguous_inputs_equal_contiguous():
    base_a = fp8_randn((40, 64), E4M3, seed=3)
    base_b = fp8_randn((64, 30), E5M2, seed=4)
    a, b = base_a[:, ::2], base_b.t()  # [40, 32] strided, [30, 64]->needs K=32: slice
    b = b[:, :32]
    assert not a.is_contiguous() and not b.is_contiguous()
    for out_dtype in OUT_DTYPES:
        got = fp8mp.fp8_gemm(a, scalar(2.0), b, scalar(0.25), out_dtype=out_dtype)
        want = fp8mp.fp8_gemm(a.contiguous(), scalar(2.0), b.contiguous(), scalar(0.25), out_dtype=out_dtype)
        assert torch.equal(got, want)


def test_linear_layout_and_defaults():
    """a = input, b = weight, as nn.Linear; default out_dtype is bfloat16; scales may be 0-d."""
    x = fp8_randn((6, 48), E4M3, seed=5)
    w = fp8_randn((20, 48), E4M3, seed=6)
    out = fp8mp.fp8_gemm(x, torch.tensor(1.0), w, torch.tensor(1.0))
    assert out.dtype == torch.bfloat16 and out.shape == (6, 20)
    linear = torch.nn.functional.linear(x.to(torch.float32).double(), w.to(torch.float32).double())
    assert_close_to_reference(out, linear, linear.abs() + 1, torch.bfloat16)


def test_use_fast_accum_is_ignored_on_cpu():
    a, b = fp8_randn((9, 40), E4M3, seed=7), fp8_randn((11, 40), E4M3, seed=8)
    args = (a, scalar(1.5), b, scalar(0.5), None, torch.float32)
    assert torch.equal(torch.ops.fp8mp.fp8_gemm(*args, True), torch.ops.fp8mp.fp8_gemm(*args, False))


# ---------------------------------------------------------------- CPU against torch._scaled_mm


@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 16, 16), (4, 7, 3), (33, 100, 17), (64, 128, 96)], ids=lambda s: "x".join(map(str, s)))
def test_matches_torch_scaled_mm_cpu(a_dtype, b_dtype, out_dtype, with_bias, shape):
    M, K, N = shape
    a = fp8_randn((M, K), a_dtype, 4.0, seed=K)
    b = fp8_randn((N, K), b_dtype, 0.5, seed=N)
    bias = (torch.randn(N) * 3).to(out_dtype) if with_bias else None
    sa, sb = scalar(0.37), scalar(2.5)
    try:
        expected = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=out_dtype)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch._scaled_mm on CPU rejects this combination: {e}")
    out = fp8mp.fp8_gemm(a, sa, b, sb, bias=bias, out_dtype=out_dtype)
    # Both round (fp32 result) once to out_dtype: allow the fp32 accumulation error and one ulp of out_dtype.
    _, abs_sum = reference_f64(a, 0.37, b, 2.5, bias)
    assert_close_to_reference(out, expected.double(), abs_sum, out_dtype)


# ---------------------------------------------------------------- opcheck


OPCHECK_CASES = [
    lambda: (fp8_randn((16, 32), E4M3), scalar(0.5), fp8_randn((24, 32), E4M3, seed=1), scalar(2.0), None, torch.bfloat16, False),
    lambda: (fp8_randn((5, 7), E4M3), scalar(1.0), fp8_randn((3, 7), E5M2, seed=1), scalar(0.25), torch.randn(3), torch.float32, False),
    lambda: (fp8_randn((8, 20), E5M2), scalar(3.0), fp8_randn((9, 20), E4M3, seed=2), scalar(1.0), torch.randn(9).half(), torch.float16, True),
    lambda: (fp8_randn((4, 0), E4M3), scalar(1.0), fp8_randn((6, 0), E4M3), scalar(1.0), torch.randn(6).bfloat16(), torch.bfloat16, False),
]


@pytest.mark.parametrize("make_args", OPCHECK_CASES, ids=[f"case{i}" for i in range(len(OPCHECK_CASES))])
def test_opcheck(make_args):
    opcheck_fp8_aware(torch.ops.fp8mp.fp8_gemm.default, make_args())


def test_torch_compile_fullgraph():
    a, b = fp8_randn((12, 32), E4M3), fp8_randn((10, 32), E4M3, seed=1)
    sa, sb, bias = scalar(0.5), scalar(2.0), torch.randn(10, dtype=torch.bfloat16)
    compiled = torch.compile(lambda *t: fp8mp.fp8_gemm(*t, bias=bias), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(a, sa, b, sb), fp8mp.fp8_gemm(a, sa, b, sb, bias=bias))


# ---------------------------------------------------------------- bad input


def good_args():
    return dict(a=fp8_randn((4, 32), E4M3), a_scale_inv=scalar(1.0), b=fp8_randn((8, 32), E4M3, seed=1),
                b_scale_inv=scalar(1.0), bias=None, out_dtype=torch.bfloat16)


def call(**overrides):
    args = good_args()
    args.update(overrides)
    return fp8mp.fp8_gemm(**args)


@pytest.mark.parametrize("arg", ["a", "b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_non_fp8_operands_name_the_argument(arg, dtype):
    bad = good_args()[arg].to(torch.float32).to(dtype)
    with pytest.raises(RuntimeError, match=f"'{arg}' must be float8_e4m3fn or float8_e5m2"):
        call(**{arg: bad})


def test_e5m2_times_e5m2_is_rejected():
    with pytest.raises(RuntimeError, match="cannot both be float8_e5m2"):
        call(a=fp8_randn((4, 32), E5M2), b=fp8_randn((8, 32), E5M2))


def test_mismatched_k_names_b():
    with pytest.raises(ValueError, match="'b' must be \\[N, K\\] with K = a.size\\(1\\) = 32"):
        call(b=fp8_randn((8, 31), E4M3))


@pytest.mark.parametrize("arg,shape", [("a", (2, 4, 32)), ("a", (32,)), ("b", (2, 8, 32)), ("b", (32,))])
def test_non_2d_operands_name_the_argument(arg, shape):
    with pytest.raises(ValueError, match=f"'{arg}' must be 2-D"):
        call(**{arg: fp8_randn(shape, E4M3)})


@pytest.mark.parametrize("bias,error,message", [
    (torch.randn(7).bfloat16(), ValueError, "'bias' must have shape \\[N\\] = \\[8\\]"),
    (torch.randn(1, 8).bfloat16(), ValueError, "'bias' must have shape"),
    (torch.randn(8), RuntimeError, "'bias' must have dtype out_dtype"),
    (torch.randn(8).half(), RuntimeError, "'bias' must have dtype out_dtype"),
])
def test_bad_bias(bias, error, message):
    with pytest.raises(error, match=message):
        call(bias=bias)


@pytest.mark.parametrize("arg", ["a_scale_inv", "b_scale_inv"])
@pytest.mark.parametrize("bad,error", [
    (torch.ones(1, dtype=torch.float64), RuntimeError),
    (torch.ones(1, dtype=torch.bfloat16), RuntimeError),
    (torch.ones(2), ValueError),
    (torch.ones(0), ValueError),
])
def test_bad_scale_tensors_name_the_argument(arg, bad, error):
    with pytest.raises(error, match=f"'{arg}' must be a 1-element float32 tensor"):
        call(**{arg: bad})


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.int32, E4M3])
def test_bad_out_dtype(out_dtype):
    with pytest.raises(RuntimeError, match="'out_dtype' must be float32, bfloat16 or float16"):
        call(out_dtype=out_dtype)
