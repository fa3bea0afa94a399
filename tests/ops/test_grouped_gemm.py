"""fp8mp.ops.fp8_grouped_gemm / fp8_grouped_gemm_wgrad against fp8_gemm on each group alone (bit for bit on CPU)
and against the float64 reference of tests/gemm_reference.py with its fp32-accumulation bound."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8mp.ops import fp8_gemm, fp8_grouped_gemm, fp8_grouped_gemm_wgrad
from gemm_reference import E4M3, E5M2, FORMAT_PAIRS, OUT_DTYPES, assert_close_to_reference, fp8_randn, reference_f64, scalar
from opcheck_util import error_of, opcheck_fp8_aware


def routed_counts(tokens: int, experts: int, top_k: int, seed: int) -> list[int]:
    """Tokens per expert of a random top-k routing (each token picks top_k distinct experts)."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.rand(tokens, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
    return torch.bincount(picks, minlength=experts).tolist()


def offsets(counts) -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)


# name -> tokens per group: empty groups, one group holding every token, top-k 1 and 8, E = 256.
GROUPINGS = {
    "with_empty_groups": [5, 0, 0, 17, 1, 0, 9],
    "one_group_all": [0, 0, 40, 0],
    "single_group": [23],
    "all_empty_but_last": [0] * 7 + [3],
    "top1_e8": routed_counts(48, 8, 1, seed=1),
    "top8_e64": routed_counts(24, 64, 8, seed=2),
    "top8_e256": routed_counts(40, 256, 8, seed=3),
}


def group_ranges(counts):
    start = 0
    for c in counts:
        yield start, start + c
        start += c


def grouped_operands(counts, N, K, a_dtype, b_dtype, seed):
    M, G = sum(counts), len(counts)
    a = fp8_randn((M, K), a_dtype, 3.0, seed=seed)
    b = fp8_randn((G, N, K), b_dtype, 0.5, seed=seed + 1)
    b_scale_inv = torch.rand(G, generator=torch.Generator().manual_seed(seed + 2)) + 0.25
    return a, b, b_scale_inv


@pytest.mark.parametrize("grouping", list(GROUPINGS), ids=str)
@pytest.mark.parametrize("a_dtype,b_dtype", FORMAT_PAIRS, ids=lambda d: str(d).split("_")[-1])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_group_is_fp8_gemm_on_that_group_and_within_the_fp64_bound(grouping, a_dtype, b_dtype, out_dtype, with_bias):
    counts = GROUPINGS[grouping]
    N, K = 32, 48
    a, b, b_scale_inv = grouped_operands(counts, N, K, a_dtype, b_dtype, seed=len(counts))
    bias = (torch.randn(len(counts), N) * 2).to(out_dtype) if with_bias else None
    a_scale_inv = scalar(0.37)
    out = fp8_grouped_gemm(a, a_scale_inv, b, b_scale_inv, offsets(counts), bias, out_dtype)
    assert out.shape == (sum(counts), N) and out.dtype == out_dtype
    for g, (s, e) in enumerate(group_ranges(counts)):
        group_bias = bias[g] if with_bias else None
        alone = fp8_gemm(a[s:e], a_scale_inv, b[g], b_scale_inv[g:g + 1], group_bias, out_dtype)
        assert torch.equal(out[s:e].view(torch.uint8), alone.view(torch.uint8)), f"group {g} differs from fp8_gemm"
        ref64, abs_sum = reference_f64(a[s:e], 0.37, b[g], float(b_scale_inv[g]), group_bias)
        assert_close_to_reference(out[s:e], ref64, abs_sum, out_dtype)


@pytest.mark.parametrize("grouping", list(GROUPINGS), ids=str)
@pytest.mark.parametrize("a_dtype,b_dtype", [(E5M2, E4M3), (E4M3, E4M3)], ids=lambda d: str(d).split("_")[-1])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_wgrad_each_group_is_fp8_gemm_on_its_columns_and_within_the_fp64_bound(grouping, a_dtype, b_dtype, out_dtype):
    counts = GROUPINGS[grouping]
    N, K, T = 48, 32, sum(counts)
    a = fp8_randn((N, T), a_dtype, 2.0, seed=T)
    b = fp8_randn((K, T), b_dtype, 1.0, seed=T + 1)
    out = fp8_grouped_gemm_wgrad(a, scalar(0.5), b, scalar(1.75), offsets(counts), out_dtype)
    assert out.shape == (len(counts), N, K) and out.dtype == out_dtype
    for g, (s, e) in enumerate(group_ranges(counts)):
        a_g, b_g = a[:, s:e].contiguous(), b[:, s:e].contiguous()
        alone = fp8_gemm(a_g, scalar(0.5), b_g, scalar(1.75), None, out_dtype)
        assert torch.equal(out[g].view(torch.uint8), alone.view(torch.uint8)), f"group {g} differs from fp8_gemm"
        ref64, abs_sum = reference_f64(a_g, 0.5, b_g, 1.75, None)
        assert_close_to_reference(out[g], ref64, abs_sum, out_dtype)
        if e == s:
            assert torch.equal(out[g], torch.zeros(N, K, dtype=out_dtype))


def test_nan_stays_in_its_group():
    counts = [4, 4]
    a, b, b_scale_inv = grouped_operands(counts, 16, 16, E4M3, E4M3, seed=5)
    a.view(torch.uint8)[1, 3] = 0x7F  # E4M3 NaN in group 0
    out = fp8_grouped_gemm(a, scalar(1.0), b, b_scale_inv, offsets(counts), None, torch.float32)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2, 3]]).any() and not torch.isnan(out[4:]).any()


def test_opcheck():
    counts = [3, 0, 6, 1]
    a, b, b_scale_inv = grouped_operands(counts, 16, 32, E4M3, E4M3, seed=7)
    bias = torch.randn(4, 16).to(torch.bfloat16)
    opcheck_fp8_aware(torch.ops.fp8mp.fp8_grouped_gemm.default,
                      (a, scalar(0.5), b, b_scale_inv, offsets(counts), bias, torch.bfloat16, False))
    at = fp8_randn((16, 10), E5M2, seed=8)
    bt = fp8_randn((32, 10), E4M3, seed=9)
    opcheck_fp8_aware(torch.ops.fp8mp.fp8_grouped_gemm_wgrad.default,
                      (at, scalar(0.5), bt, scalar(2.0), offsets(counts), torch.float32, False))


def _fprop_call(**overrides):
    """A call of fp8_grouped_gemm with valid arguments but `overrides` (name -> function making the value), every
    tensor made inside the call (so that under FakeTensorMode they are fake)."""
    def call(device):
        counts = [2, 3]
        a, b, b_scale_inv = grouped_operands(counts, 16, 32, E4M3, E4M3, seed=11)
        args = dict(a=a, a_scale_inv=scalar(1.0), b=b, b_scale_inv=b_scale_inv, offs=offsets(counts), bias=None,
                    out_dtype=torch.bfloat16)
        args.update({name: make() for name, make in overrides.items()})
        return fp8_grouped_gemm(**args)
    return call


@pytest.mark.parametrize("overrides,error,words", [
    (dict(offs=lambda: torch.tensor([3, 2], dtype=torch.int32)), ValueError, ["'offs'", "non-decreasing"]),
    (dict(offs=lambda: torch.tensor([2, 4], dtype=torch.int32)), ValueError, ["'offs'", "end at a.size(0) = 5"]),
    (dict(offs=lambda: torch.tensor([-1, 5], dtype=torch.int32)), ValueError, ["'offs'", ">= 0"]),
])
def test_bad_offsets_values_name_offs(overrides, error, words):
    with pytest.raises(error) as info:
        _fprop_call(**overrides)("cpu")
    assert all(w in str(info.value) for w in words), str(info.value)


@pytest.mark.parametrize("overrides,error,words", [
    (dict(offs=lambda: torch.tensor([2, 3, 5], dtype=torch.int32)), ValueError, ["'b'", "one matrix per group"]),
    (dict(offs=lambda: torch.tensor([2, 5], dtype=torch.int64)), RuntimeError, ["'offs'", "int32"]),
    (dict(offs=lambda: torch.tensor([[2, 5]], dtype=torch.int32)), ValueError, ["'offs'", "1-D"]),
    (dict(a=lambda: fp8_randn((5, 24), E4M3), b=lambda: fp8_randn((2, 16, 24), E4M3)), ValueError, ["K = a.size(1)", "multiple of 16"]),
    (dict(b=lambda: fp8_randn((2, 24, 32), E4M3)), ValueError, ["N = b.size(1)", "multiple of 16"]),
    (dict(b=lambda: fp8_randn((2, 16, 48), E4M3)), ValueError, ["'b'", "K = a.size(1) = 32"]),
    (dict(b_scale_inv=lambda: scalar(1.0)), ValueError, ["'b_scale_inv'", "[G] = [2]"]),
    (dict(b_scale_inv=lambda: torch.ones(2, dtype=torch.float64)), RuntimeError, ["'b_scale_inv'", "float32"]),
    (dict(a_scale_inv=lambda: torch.ones(2)), ValueError, ["'a_scale_inv'", "1-element"]),
    (dict(bias=lambda: torch.zeros(16, dtype=torch.bfloat16)), ValueError, ["'bias'", "[G, N] = [2, 16]"]),
    (dict(bias=lambda: torch.zeros(2, 16)), RuntimeError, ["'bias'", "out_dtype"]),
    (dict(a=lambda: fp8_randn((5, 32), E5M2), b=lambda: fp8_randn((2, 16, 32), E5M2)), RuntimeError, ["both be float8_e5m2"]),
    (dict(a=lambda: torch.zeros(5, 32)), RuntimeError, ["'a'", "float8"]),
])
@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_bad_arguments_same_error_from_kernel_and_fake(overrides, error, words, device):
    kind, message = error_of(_fprop_call(**overrides), device)
    assert kind is error and all(w in message for w in words), (kind, message)


@pytest.mark.parametrize("case,error,words", [
    ("offs_end", ValueError, ["'offs'", "end at a.size(1) = 10"]),
    ("n_align", ValueError, ["N = a.size(0)", "multiple of 16"]),
    ("k_align", ValueError, ["K = b.size(0)", "multiple of 16"]),
    ("t_mismatch", ValueError, ["'b'", "T = a.size(1) = 10"]),
    ("b_scale", ValueError, ["'b_scale_inv'", "1-element"]),
])
def test_wgrad_bad_arguments_name_the_argument(case, error, words):
    a, b, offs, b_scale_inv = fp8_randn((16, 10), E5M2), fp8_randn((32, 10), E4M3), offsets([4, 6]), scalar(1.0)
    if case == "offs_end":
        offs = offsets([4, 5])
    elif case == "n_align":
        a = fp8_randn((20, 10), E5M2)
    elif case == "k_align":
        b = fp8_randn((40, 10), E4M3)
    elif case == "t_mismatch":
        b = fp8_randn((32, 11), E4M3)
    else:
        b_scale_inv = torch.ones(2)
    with pytest.raises(error) as info:
        fp8_grouped_gemm_wgrad(a, scalar(1.0), b, b_scale_inv, offs, torch.float32)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_exported_from_fp8mp_ops():
    assert fp8mp.ops.fp8_grouped_gemm is fp8_grouped_gemm and fp8mp.ops.fp8_grouped_gemm_wgrad is fp8_grouped_gemm_wgrad


# ---------------------------------------------------------------- fine-grained recipes

# name -> (b_block_rows, block_k, scale_mode): rowwise, DeepSeek-V3 (1 x 128 activations, 128 x 128 weights), MXFP8.
RECIPES = {"rowwise": (1, None, "pow2"), "deepseek_v3": (128, 128, "fp32"), "mxfp8": (1, 32, "e8m0_rceil")}


def block_dequantized(data, scale_inv, block_rows, block_k):
    """float64 values of a block-quantized [R, K] operand (its scales expanded over their blocks)."""
    from blockwise_reference import decode_scale
    rows, cols = data.shape
    s = decode_scale(scale_inv).double().repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_k, 1)[:, :cols]
    return data.float().double() * s


@pytest.mark.parametrize("recipe", list(RECIPES), ids=str)
@pytest.mark.parametrize("grouping", ["with_empty_groups", "one_group_all", "top8_e64"], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_scaled_each_group_is_block_scaled_gemm_on_that_group_and_within_the_fp64_bound(recipe, grouping,
                                                                                              out_dtype, with_bias):
    from fp8mp.ops import block_quantize, block_scaled_gemm, block_scaled_grouped_gemm
    counts = GROUPINGS[grouping]
    b_block_rows, block_k, mode = RECIPES[recipe]
    G, M, N, K = len(counts), sum(counts), 144, 256
    block_k = block_k or K
    gen = torch.Generator().manual_seed(G)
    x = torch.randn(M, K, generator=gen) * torch.logspace(-3, 3, M).view(M, 1)  # rows of very different ranges
    w = torch.randn(G, N, K, generator=gen) * 0.02
    a, sa = block_quantize(x, 1, block_k, "e4m3", mode)
    quantized = [block_quantize(w[g], b_block_rows, block_k, "e4m3", mode) for g in range(G)]
    b, sb = torch.stack([q[0] for q in quantized]), torch.stack([q[1] for q in quantized])
    bias = (torch.randn(G, N, generator=gen)).to(out_dtype) if with_bias else None
    out = block_scaled_grouped_gemm(a, sa, b, sb, offsets(counts), b_block_rows, block_k, bias, out_dtype)
    for g, (s, e) in enumerate(group_ranges(counts)):
        group_bias = bias[g] if with_bias else None
        alone = block_scaled_gemm(a[s:e], sa[s:e], b[g], sb[g], 1, b_block_rows, block_k, group_bias, out_dtype)
        assert torch.equal(out[s:e].view(torch.uint8), alone.view(torch.uint8)), f"group {g} differs"
        a64, b64 = block_dequantized(a[s:e], sa[s:e], 1, block_k), block_dequantized(b[g], sb[g], b_block_rows, block_k)
        ref64, abs_sum = a64 @ b64.t(), a64.abs() @ b64.abs().t()
        if with_bias:
            ref64, abs_sum = ref64 + group_bias.double(), abs_sum + group_bias.double().abs()
        assert_close_to_reference(out[s:e], ref64, abs_sum, out_dtype)


def test_block_scaled_opcheck_and_errors():
    from fp8mp.ops import block_quantize, block_scaled_grouped_gemm
    counts = [3, 0, 5]
    a, sa = block_quantize(torch.randn(8, 64), 1, 32, "e4m3", "e8m0_rceil")
    b, sb = block_quantize(torch.randn(3 * 16, 64), 1, 32, "e4m3", "e8m0_rceil")
    b, sb = b.view(3, 16, 64), sb.view(3, 16, 2)
    opcheck_fp8_aware(torch.ops.fp8mp.block_scaled_grouped_gemm.default,
                      (a, sa, b, sb, offsets(counts), 1, 1, 32, None, torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"\[ValueError\] .*'a_block_rows' must be 1"):  # the raw op: tagged
        torch.ops.fp8mp.block_scaled_grouped_gemm(a, sa, b, sb, offsets(counts), 2, 1, 32, None, torch.bfloat16)
    with pytest.raises(ValueError, match=r"'b_scale_inv' must have shape \[3, 16, 2\]"):
        block_scaled_grouped_gemm(a, sa, b, sb[:, :8], offsets(counts), 1, 32)
    with pytest.raises(ValueError, match=r"'a_scale_inv' must have shape \[8, 2\]"):
        block_scaled_grouped_gemm(a, sa[:, :1], b, sb, offsets(counts), 1, 32)
    with pytest.raises(ValueError, match="'offs' must end at a.size"):
        block_scaled_grouped_gemm(a, sa, b, sb, offsets([3, 0, 4]), 1, 32)


# ---------------------------------------------------------------- fine-grained weight gradient (grouped along K)
def quantize_group_columns(t, counts, block_k, mode, fmt="e4m3"):
    """t [R, T] quantized along T in 1 x block_k blocks from each group's first column, group by group (the
    layout block_scaled_grouped_gemm_wgrad takes): (data [R, T], scale_inv [R, C], [(data_g, scale_inv_g)]).
    block_k None: rowwise, each group one block as long as the group."""
    from fp8mp.ops import block_quantize
    parts = [block_quantize(t[:, s:e].contiguous(), 1, block_k or max(e - s, 1), fmt, mode)
             for s, e in group_ranges(counts)]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1), parts


@pytest.mark.parametrize("recipe", list(RECIPES), ids=str)
@pytest.mark.parametrize("grouping", list(GROUPINGS), ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_block_wgrad_each_group_is_block_scaled_gemm_on_its_columns_and_within_the_fp64_bound(recipe, grouping,
                                                                                              out_dtype):
    from fp8mp.ops import block_scaled_gemm, block_scaled_grouped_gemm_wgrad
    counts = GROUPINGS[grouping]
    _, block_k, mode = RECIPES[recipe]
    N, K, T = 48, 32, sum(counts)
    gen = torch.Generator().manual_seed(T)
    dy_t = torch.randn(N, T, generator=gen) * torch.logspace(-3, 3, T).view(1, T)  # tokens of very different ranges
    x_t = torch.randn(K, T, generator=gen)
    wide = block_k or max(T, 1)  # rowwise: any block_k >= every group's length
    a, sa, a_parts = quantize_group_columns(dy_t, counts, block_k, mode)
    b, sb, b_parts = quantize_group_columns(x_t, counts, block_k, mode)
    out = block_scaled_grouped_gemm_wgrad(a, sa, b, sb, offsets(counts), wide, out_dtype)
    assert out.shape == (len(counts), N, K) and out.dtype == out_dtype
    for g, (s, e) in enumerate(group_ranges(counts)):
        (ag, sag), (bg, sbg) = a_parts[g], b_parts[g]
        group_block = block_k or max(e - s, 1)
        alone = block_scaled_gemm(ag, sag, bg, sbg, 1, 1, group_block, None, out_dtype)
        assert torch.equal(out[g].view(torch.uint8), alone.view(torch.uint8)), f"group {g} differs"
        a64, b64 = block_dequantized(ag, sag, 1, group_block), block_dequantized(bg, sbg, 1, group_block)
        assert_close_to_reference(out[g], a64 @ b64.t(), a64.abs() @ b64.abs().t(), out_dtype)


def test_block_wgrad_opcheck():
    counts = [3, 0, 40]
    a, sa, _ = quantize_group_columns(torch.randn(16, 43), counts, 32, "e8m0_rceil")
    b, sb, _ = quantize_group_columns(torch.randn(32, 43), counts, 32, "e8m0_rceil")
    assert sa.shape == (16, 3)  # 1 + 0 + 2 chunks
    opcheck_fp8_aware(torch.ops.fp8mp.block_scaled_grouped_gemm_wgrad.default,
                      (a, sa, b, sb, offsets(counts), 32, torch.bfloat16))


def _block_wgrad_call(**overrides):
    """A call of block_scaled_grouped_gemm_wgrad with valid arguments but `overrides`, every tensor made inside."""
    def call(device):
        from fp8mp.ops import block_scaled_grouped_gemm_wgrad
        counts = [3, 0, 40]
        a, sa, _ = quantize_group_columns(torch.randn(16, 43), counts, 32, "fp32")
        b, sb, _ = quantize_group_columns(torch.randn(32, 43), counts, 32, "fp32")
        args = dict(a=a, a_scale_inv=sa, b=b, b_scale_inv=sb, offs=offsets(counts), block_k=32,
                    out_dtype=torch.bfloat16)
        args.update({name: make() for name, make in overrides.items()})
        return block_scaled_grouped_gemm_wgrad(**args)
    return call


@pytest.mark.parametrize("overrides,error,words", [
    (dict(a=lambda: fp8_randn((24, 43), E4M3), a_scale_inv=lambda: torch.ones(24, 3)), ValueError,
     ["N = a.size(0)", "multiple of 16"]),
    (dict(b=lambda: fp8_randn((40, 43), E4M3), b_scale_inv=lambda: torch.ones(40, 3)), ValueError,
     ["K = b.size(0)", "multiple of 16"]),
    (dict(b=lambda: fp8_randn((32, 44), E4M3)), ValueError, ["'b'", "T = a.size(1) = 43"]),
    (dict(b_scale_inv=lambda: torch.ones(32, 2)), ValueError, ["'b_scale_inv'", "[32, 3]"]),
    (dict(a_scale_inv=lambda: torch.ones(16)), ValueError, ["'a_scale_inv'", "2-D [N, C]"]),
    (dict(a_scale_inv=lambda: torch.ones(16, 3, dtype=torch.float64)), RuntimeError, ["'a_scale_inv'", "float32"]),
    (dict(block_k=lambda: 0), ValueError, ["'block_k'", ">= 1"]),
    (dict(offs=lambda: torch.tensor([3, 3, 43], dtype=torch.int64)), RuntimeError, ["'offs'", "int32"]),
])
@pytest.mark.parametrize("device", ["cpu", "fake"])
def test_block_wgrad_bad_arguments_same_error_from_kernel_and_fake(overrides, error, words, device):
    kind, message = error_of(_block_wgrad_call(**overrides), device)
    assert kind is error and all(w in message for w in words), (kind, message)


@pytest.mark.parametrize("offs,words", [
    ([3, 2, 43], ["'offs'", "non-decreasing"]),
    ([3, 3, 42], ["'offs'", "end at a.size(1) = 43"]),
    ([20, 20, 43], ["'a_scale_inv'", "C = 2 columns"]),  # 1 + 0 + 1 chunks for these groups, not 3
])
def test_block_wgrad_bad_offsets_values_name_the_argument(offs, words):
    with pytest.raises(ValueError) as info:
        _block_wgrad_call(offs=lambda: offsets([offs[0], offs[1] - offs[0], offs[2] - offs[1]]))("cpu")
    assert all(w in str(info.value) for w in words), str(info.value)
