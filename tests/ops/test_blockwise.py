"""fp8mp.ops.block_quantize / block_scaled_gemm against independent references.

MXFP8 against torchao's to_mx (FLOOR and RCEIL), rowwise against torchao's Float8 rowwise scaling
(tensor_to_scale, with and without power-of-two rounding), DeepSeek-V3 tiles against a plain
PyTorch reference (tests/blockwise_reference.py), the GEMM against the chunked fp32 arithmetic.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp8mp  # noqa: F401
from fp8mp.ops import block_quantize, block_quantize_transpose, block_scaled_gemm
from opcheck_util import error_of, opcheck_fp8_aware
from blockwise_reference import FP8_MAX, block_gemm_reference, deepseek_quantize
import torchao_reference

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FMT = {E4M3: "e4m3", E5M2: "e5m2"}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def wide_range(shape, dtype, seed, spread=8.0):
    """Gaussian values times 2^U(-spread, spread) per element: many exponents, some tiles tiny."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2((torch.rand(shape, generator=g) * 2 - 1) * spread)
    return x.to(dtype)


def with_special_rows(x: torch.Tensor) -> torch.Tensor:
    """Row 0 all zeros, row 1 tiny (subnormal fp32 after scaling), row 2 huge."""
    x = x.clone()
    x[0] = 0
    x[1] = x[1].float().mul(1e-38).to(x.dtype)
    x[2] = x[2].float().mul(1e30).to(x.dtype)
    return x


# ---------------------------------------------------------------- MXFP8 vs torchao to_mx
@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_mxfp8_matches_torchao_to_mx(mode, elem, x_dtype):
    x = with_special_rows(wide_range((64, 256), x_dtype, seed=3))
    ref_scale, ref_data = torchao_reference.to_mx(x, elem, 32, mode)
    data, scale = block_quantize(x, 1, 32, FMT[elem], "e8m0_" + mode)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (64, 8)
    assert torch.equal(bits(scale), bits(ref_scale).reshape(64, 8))
    assert torch.equal(bits(data), bits(ref_data))


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_mxfp8_nan_and_inf_blocks_match_torchao(mode):
    x = torch.randn(4, 64)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    x[2, 5] = -float("inf")
    ref_scale, ref_data = torchao_reference.to_mx(x, E4M3, 32, mode)
    data, scale = block_quantize(x, 1, 32, "e4m3", "e8m0_" + mode)
    assert torch.equal(bits(scale), bits(ref_scale).reshape(4, 2))
    # NaN codes: torch writes 0x7F or 0xFF by the NaN's sign; compare NaN-ness, then the rest bit for bit.
    nan = data.float().isnan()
    assert torch.equal(nan, ref_data.float().isnan())
    assert torch.equal(bits(data)[~nan], bits(ref_data)[~nan])


# ---------------------------------------------------------------- rowwise vs torchao
@pytest.mark.parametrize("pow2", [True, False], ids=["pow2", "fp32"])
@pytest.mark.parametrize("elem", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rowwise_matches_torchao_axiswise_scaling(pow2, elem, x_dtype):
    x = wide_range((48, 96), x_dtype, seed=5, spread=4.0)
    x[0] = 0  # amax 0: torchao clamps to 1e-12
    ref_data, scale = torchao_reference.rowwise(x, elem, pow2)  # scale: [48, 1], the multiplier
    data, scale_inv = block_quantize(x, 1, x.shape[1], FMT[elem], "pow2" if pow2 else "fp32")
    assert scale_inv.shape == (48, 1) and scale_inv.dtype == torch.float32
    assert torch.equal(scale_inv, scale.reciprocal())
    assert torch.equal(bits(data), bits(ref_data))
    if pow2:  # exact powers of two
        assert torch.equal(torch.frexp(scale_inv).mantissa, torch.full_like(scale_inv, 0.5))


# ---------------------------------------------------------------- DeepSeek-V3 tiles vs the plain reference
@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 32), (3, 5)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("shape", [(256, 384), (130, 200), (1, 1), (0, 7)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("pow2", [False, True], ids=["fp32", "pow2"])
def test_tiles_match_the_deepseek_reference_including_partial_edge_tiles(block, shape, pow2):
    x = wide_range(shape, torch.bfloat16, seed=shape[0] + block[1], spread=6.0)
    ref_data, ref_scale_inv = deepseek_quantize(x, *block, E4M3, pow2)
    data, scale_inv = block_quantize(x, *block, "e4m3", "pow2" if pow2 else "fp32")
    assert torch.equal(scale_inv, ref_scale_inv)
    assert torch.equal(bits(data), bits(ref_data))


# ---------------------------------------------------------------- both layouts from one read
@pytest.mark.parametrize("mode", ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"])
@pytest.mark.parametrize("shape,blocks", [((256, 384), (128, 128)), ((130, 200), (32, 32)), ((96, 72), (72, 96)),
                                          ((1, 1), (32, 32)), ((37, 1000), (7, 5)), ((2000, 20), (32, 2000))],
                         ids=["block", "mx-partial", "rowwise", "1x1", "odd", "tall"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_transpose_is_the_two_quantizations_bit_for_bit(mode, shape, blocks, x_dtype):
    x = with_special_rows(wide_range(shape, x_dtype, seed=shape[0], spread=6.0)) if shape[0] > 2 else torch.randn(shape)
    if shape[0] > 4:
        x[3, 0], x[4, -1] = float("nan"), float("inf")  # NaN and Inf tiles, in both layouts
    x = x.to(x_dtype)
    row_block, col_block = blocks
    data, scale_inv, data_t, scale_inv_t = block_quantize_transpose(x, row_block, col_block, "e4m3", mode)
    ref, ref_scale = block_quantize(x, 1, row_block, "e4m3", mode)
    ref_t, ref_scale_t = block_quantize(x.t(), 1, col_block, "e4m3", mode)
    assert data.shape == x.shape and data_t.shape == x.t().shape
    for got, want in ((data, ref), (scale_inv, ref_scale), (data_t, ref_t), (scale_inv_t, ref_scale_t)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_quantize_transpose_matches_torchao_to_mx_in_both_layouts():
    x = wide_range((64, 96), torch.bfloat16, seed=11)
    data, scale, data_t, scale_t = block_quantize_transpose(x, 32, 32, "e4m3", "e8m0_rceil")
    for (d, s), t in (((data, scale), x), ((data_t, scale_t), x.t().contiguous())):
        ref_scale, ref_data = torchao_reference.to_mx(t, E4M3, 32, "rceil")
        assert torch.equal(bits(d), bits(ref_data)) and torch.equal(bits(s), bits(ref_scale).reshape(s.shape))


def test_a_partial_tile_is_scaled_as_if_zero_padded():
    x = torch.randn(5, 40)
    data, scale_inv = block_quantize(x, 1, 32, "e4m3", "e8m0_rceil")
    padded, padded_scale = block_quantize(torch.nn.functional.pad(x, (0, 24)), 1, 32, "e4m3", "e8m0_rceil")
    assert torch.equal(bits(scale_inv), bits(padded_scale))
    assert torch.equal(bits(data), bits(padded)[:, :40])


def test_non_contiguous_input_is_read_as_its_values():
    x = torch.randn(64, 48)
    assert all(torch.equal(bits(p), bits(q)) if p.dtype != torch.float32 else torch.equal(p, q)
               for p, q in zip(block_quantize(x.t(), 1, 32), block_quantize(x.t().contiguous(), 1, 32)))


# ---------------------------------------------------------------- GEMM
def small_integer_fp8(shape, dtype, seed):
    """FP8 codes of integers in [-12, 12]: every chunk sum is exact in fp32, so any order gives the same bits."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-12, 13, shape, generator=g).float().to(dtype)


def random_scales(shape, seed, e8m0=False):
    g = torch.Generator().manual_seed(seed)
    if e8m0:
        return torch.randint(100, 150, shape, generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return torch.rand(shape, generator=g) * 3 + 0.01


GEMM_CASES = [  # (M, N, K, a_block_rows, b_block_rows, block_k)
    (64, 48, 256, 1, 128, 128),   # DeepSeek: 1 x 128 activations, 128 x 128 weights
    (33, 17, 200, 1, 128, 128),   # partial chunk and partial weight block
    (16, 24, 96, 1, 1, 32),       # MXFP8
    (20, 12, 70, 1, 1, 70),       # rowwise: one chunk
    (8, 8, 64, 3, 5, 16),
]


@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("e8m0", [False, True], ids=["fp32", "e8m0"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gemm_is_bit_exact_where_chunk_sums_are_exact(case, e8m0, out_dtype):
    M, N, K, ar, br, bk = case
    a, b = small_integer_fp8((M, K), E4M3, 1), small_integer_fp8((N, K), E5M2, 2)
    sa = random_scales((-(-M // ar), -(-K // bk)), 3, e8m0)
    sb = random_scales((-(-N // br), -(-K // bk)), 4, e8m0)
    bias = torch.randn(N).to(out_dtype)
    out = block_scaled_gemm(a, sa, b, sb, ar, br, bk, bias, out_dtype)
    assert torch.equal(out, block_gemm_reference(a, sa, b, sb, ar, br, bk, bias, out_dtype))


def test_gemm_random_values_agree_to_fp32_accumulation_noise():
    M, N, K = 40, 24, 384
    a, sa = block_quantize(torch.randn(M, K), 1, 128)
    b, sb = block_quantize(torch.randn(N, K), 128, 128)
    out = block_scaled_gemm(a, sa, b, sb, 1, 128, 128, None, torch.float32)
    ref = block_gemm_reference(a, sa, b, sb, 1, 128, 128)
    magnitude = (a.float().abs() * torch.repeat_interleave(sa, 128, 1)) @ (b.float().abs() * 1.0).T * sb.max()
    assert ((out - ref).abs() <= 128 * 2**-24 * magnitude + 1e-30).all()


def test_blockwise_linear_is_close_to_fp32():
    x, w = torch.randn(64, 256), torch.randn(96, 256) * 0.05
    xq, sx = block_quantize(x, 1, 128)
    wq, sw = block_quantize(w, 128, 128)
    out = block_scaled_gemm(xq, sx, wq, sw, 1, 128, 128, None, torch.float32)
    ref = x @ w.T
    sqnr = 10 * torch.log10(ref.pow(2).sum() / (out - ref).pow(2).sum())
    assert sqnr > 25  # E4M3 has 3 mantissa bits: about 30 dB per operand


def test_gemm_k_zero_gives_the_bias():
    a, b = torch.empty(3, 0, dtype=E4M3), torch.empty(2, 0, dtype=E4M3)
    bias = torch.tensor([1.5, -2.0])
    out = block_scaled_gemm(a, torch.empty(3, 0), b, torch.empty(2, 0), 1, 1, 32, bias, torch.float32)
    assert torch.equal(out, bias.expand(3, 2))


# ---------------------------------------------------------------- opcheck and errors
@pytest.mark.parametrize("mode", ["fp32", "pow2", "e8m0_floor", "e8m0_rceil"])
def test_opcheck_block_quantize(mode):
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default, (torch.randn(33, 70), 1, 32, "e4m3", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize.default, (torch.randn(130, 70).bfloat16(), 128, 128, "e5m2", mode))


@pytest.mark.parametrize("mode", ["fp32", "e8m0_rceil"])
def test_opcheck_block_quantize_transpose(mode):
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize_transpose.default, (torch.randn(33, 70), 32, 32, "e4m3", mode))
    opcheck_fp8_aware(torch.ops.fp8mp.block_quantize_transpose.default, (torch.randn(40, 24).half(), 24, 40, "e5m2", mode))


@pytest.mark.parametrize("e8m0", [False, True])
def test_opcheck_block_scaled_gemm(e8m0):
    a, b = small_integer_fp8((33, 70), E4M3, 1), small_integer_fp8((9, 70), E4M3, 2)
    sa, sb = random_scales((33, 3), 3, e8m0), random_scales((1, 3), 4, e8m0)
    opcheck_fp8_aware(torch.ops.fp8mp.block_scaled_gemm.default, (a, sa, b, sb, 1, 128, 32, torch.randn(9), torch.float32))


ops = torch.ops.fp8mp


def _gemm(dev, a_shape=(4, 64), sa_shape=(4, 2), sa_dtype=torch.float32, b_dtype=E4M3, block_k=32, bias=None):
    a = torch.ones(a_shape, device=dev).to(E4M3)
    b = torch.ones(3, 64, device=dev).to(b_dtype)
    return ops.block_scaled_gemm(a, torch.ones(sa_shape, device=dev).to(sa_dtype), b, torch.ones(3, 2, device=dev), 1, 1,
                                 block_k, bias, torch.float32)


BAD_CALLS = {
    "quantize mode": lambda d: ops.block_quantize(torch.ones(2, 4, device=d), 1, 4, "e4m3", "e8m0"),
    "quantize fmt": lambda d: ops.block_quantize(torch.ones(2, 4, device=d), 1, 4, "e3m4", "fp32"),
    "quantize dtype": lambda d: ops.block_quantize(torch.ones(2, 4, device=d, dtype=torch.float64), 1, 4, "e4m3", "fp32"),
    "quantize 3-D": lambda d: ops.block_quantize(torch.ones(2, 4, 1, device=d), 1, 4, "e4m3", "fp32"),
    "quantize block": lambda d: ops.block_quantize(torch.ones(2, 4, device=d), 1, 0, "e4m3", "fp32"),
    "transpose mode": lambda d: ops.block_quantize_transpose(torch.ones(2, 4, device=d), 4, 2, "e4m3", "e8m0"),
    "transpose dtype": lambda d: ops.block_quantize_transpose(torch.ones(2, 4, device=d, dtype=torch.int32), 4, 2, "e4m3",
                                                              "fp32"),
    "transpose 1-D": lambda d: ops.block_quantize_transpose(torch.ones(4, device=d), 4, 2, "e4m3", "fp32"),
    "transpose block": lambda d: ops.block_quantize_transpose(torch.ones(2, 4, device=d), 4, 0, "e4m3", "fp32"),
    "gemm scale shape": lambda d: _gemm(d, sa_shape=(4, 3)),
    "gemm scale dtype": lambda d: _gemm(d, sa_dtype=torch.bfloat16),
    "gemm e5m2 pair": lambda d: ops.block_scaled_gemm(torch.ones(2, 4, device=d).to(E5M2), torch.ones(2, 1, device=d),
                                                      torch.ones(2, 4, device=d).to(E5M2), torch.ones(2, 1, device=d),
                                                      1, 1, 4, None, torch.float32),
    "gemm K": lambda d: _gemm(d, a_shape=(4, 32), sa_shape=(4, 1)),
    "gemm block_k": lambda d: _gemm(d, block_k=0),
    "gemm bias": lambda d: _gemm(d, bias=torch.ones(4, device=d)),
}


@pytest.mark.parametrize("name", list(BAD_CALLS))
def test_fake_kernels_refuse_what_the_cpu_kernels_refuse(name):
    eager = error_of(BAD_CALLS[name], "cpu")
    # Names the op and the argument (after the tag of fp8mp's ValueError contract, fp8mp/ops/errors.py).
    assert re.search(r"^(\[ValueError\] )?fp8mp::block_\w+: argument", eager[1]), eager
    assert error_of(BAD_CALLS[name], "meta") == eager
    assert error_of(BAD_CALLS[name], "fake") == eager


@pytest.mark.parametrize("blocks,e8m0,supported", [((1, 1, 300), False, True), ((1, 128, 128), False, True),
                                                     ((128, 1, 128), False, True), ((1, 1, 32), True, True),
                                                     ((128, 128, 128), False, False), ((1, 1, 64), False, False),
                                                     ((1, 1, 32), False, False), ((1, 128, 32), True, False)],
                         ids=["rowwise", "deepseek", "deepseek-a-blocks", "mxfp8", "both-128x128", "1x64", "mx-fp32",
                              "mx-blocks"])
def test_fake_refuses_on_cuda_the_blocks_no_cublaslt_recipe_takes(blocks, e8m0, supported):
    """No GPU needed: FakeTensorMode's CUDA tensors reach the fake, which applies the CUDA kernel's rule."""
    a_rows, b_rows, block_k = blocks
    dtype = torch.float8_e8m0fnu if e8m0 else torch.float32
    with FakeTensorMode():
        a, b = torch.ones(256, 300, device="cuda").to(E4M3), torch.ones(256, 300, device="cuda").to(E4M3)
        sa = torch.ones(-(-256 // a_rows), -(-300 // block_k), device="cuda").to(dtype)
        sb = torch.ones(-(-256 // b_rows), -(-300 // block_k), device="cuda").to(dtype)
        call = lambda: ops.block_scaled_gemm(a, sa, b, sb, a_rows, b_rows, block_k, None, torch.float32)
        if supported:
            assert call().shape == (256, 256)
        else:
            with pytest.raises(RuntimeError, match=r"^fp8mp::block_scaled_gemm: on CUDA the blocks must be those of a "
                                                   rf"recipe cuBLASLt runs: .*; got a_block_rows = {a_rows}, "):
                call()
        sa_cpu = torch.ones(-(-256 // a_rows), -(-300 // block_k)).to(dtype)  # the CPU takes every block size
        sb_cpu = torch.ones(-(-256 // b_rows), -(-300 // block_k)).to(dtype)
        a_cpu, b_cpu = torch.ones(256, 300).to(E4M3), torch.ones(256, 300).to(E4M3)
        assert ops.block_scaled_gemm(a_cpu, sa_cpu, b_cpu, sb_cpu, a_rows, b_rows, block_k, None, torch.float32).shape \
            == (256, 256)


def test_the_scale_shape_error_says_the_expected_shape():
    # The op itself raises RuntimeError tagged [ValueError] (the stable ABI's contract); the wrapper raises ValueError.
    a, b = torch.ones(4, 64).to(E4M3), torch.ones(3, 64).to(E4M3)
    with pytest.raises(ValueError, match=r"'a_scale_inv' must have shape \[4, 2\] \(one scale per 1 x 32 block\), got shape \[4, 3\]"):
        block_scaled_gemm(a, torch.ones(4, 3), b, torch.ones(3, 2), 1, 1, 32)


@pytest.mark.parametrize("op", ["block_quantize", "block_quantize_transpose", "block_scaled_gemm"])
def test_cuda_kernels_only_where_built_and_no_fallback_that_would_run_on_cuda(op):
    """A CPU kernel, a fake (Meta), a CUDA kernel exactly when fp8mp's CUDA library is loaded, and no composite."""
    from fp8mp.ops.native import cuda_library_loaded

    name = f"fp8mp::{op}"
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has(name, "CPU") and has(name, "Meta")
    assert has(name, "CUDA") == cuda_library_loaded()
    for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                "AutogradCUDA"):
        assert not has(name, key), key


def test_wrappers_and_fake_kernels_trace_cuda_tensors_with_the_cpu_shapes():
    """FakeTensorMode's CUDA tensors (what torch.compile traces, no GPU needed): no refusal, the CPU's shapes."""
    with FakeTensorMode():
        x = torch.randn(8, 64, device="cuda")
        data, scale_inv = block_quantize(x, 1, 32)
        assert data.is_cuda and data.shape == (8, 64) and scale_inv.shape == (8, 2)
        shapes = [t.shape for t in block_quantize_transpose(x, 32, 8, "e4m3", "e8m0_rceil")]
        assert shapes == [(8, 64), (8, 2), (64, 8), (64, 1)]
        a = torch.ones(4, 64, device="cuda").to(E4M3)
        out = block_scaled_gemm(a, torch.ones(4, 1, device="cuda"), a, torch.ones(4, 1, device="cuda"), 1, 1, 64)
        assert out.is_cuda and out.shape == (4, 4)
        with pytest.raises(NotImplementedError, match=r"^fp8mp.ops.norm_block_fp8 on CUDA tensors: fp8mp has no fused "
                                                      "CUDA kernel"):
            torch.ops.fp8mp.norm_fwd_block_fp8(x, None, None, 1e-5, True, False, 32, 32, "e4m3", "fp32")


# ---------------------------------------------------------------- the norm writing block-scaled FP8
@pytest.mark.parametrize("is_layernorm", [True, False], ids=["layernorm", "rmsnorm"])
@pytest.mark.parametrize("blocks,mode", [((128, 128), "fp32"), ((32, 32), "e8m0_rceil"), ((32, 32), "e8m0_floor"),
                                         ((128, 128), "pow2"), ((7, 5), "fp32")], ids=["block", "mx", "mx-floor",
                                                                                      "block-pow2", "odd"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(300, 160), (1, 48), (64, 33)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_norm_block_fp8_is_block_quantize_transpose_of_the_norm_output(is_layernorm, blocks, mode, x_dtype, shape):
    from fp8mp.ops import norm as norm_ops

    g = torch.Generator().manual_seed(shape[1])
    x = (torch.randn(shape, generator=g) * 3 + 1).to(x_dtype)
    weight = torch.randn(shape[1], generator=g).to(x_dtype)
    bias = torch.randn(shape[1], generator=g).to(x_dtype) if is_layernorm else None
    if is_layernorm:
        y = norm_ops.layer_norm(x, weight, bias, 1e-5)
        _, mean_ref, rstd_ref = torch.ops.fp8mp.layernorm_fwd(x, weight, bias, 1e-5, False)
    else:
        y = norm_ops.rms_norm(x, weight, 1e-5)
        _, rstd_ref = torch.ops.fp8mp.rmsnorm_fwd(x, weight, 1e-5, False)
    *fused, mean, rstd = norm_ops.norm_block_fp8(x, weight, bias, 1e-5, is_layernorm, *blocks, "e4m3", mode)
    for got, want in zip(fused, block_quantize_transpose(y, *blocks, "e4m3", mode)):
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(rstd, rstd_ref) and (torch.equal(mean, mean_ref) if is_layernorm else mean.shape == (0,))


def test_opcheck_and_bad_arguments_of_norm_block_fp8():
    from fp8mp.ops import norm as norm_ops

    x, w, b = torch.randn(70, 64), torch.randn(64), torch.randn(64)
    opcheck_fp8_aware(torch.ops.fp8mp.norm_fwd_block_fp8.default, (x, w, b, 1e-5, True, False, 32, 32, "e4m3", "e8m0_rceil"))
    opcheck_fp8_aware(torch.ops.fp8mp.norm_fwd_block_fp8.default, (x.bfloat16(), None, None, 1e-5, False, True, 128, 128,
                                                                   "e4m3", "fp32"))
    with pytest.raises(ValueError, match="norm_fwd_block_fp8: argument 'bias' must be None for RMSNorm"):
        norm_ops.norm_block_fp8(x, w, b, 1e-5, False, 32, 32)
    with pytest.raises(ValueError, match="norm_fwd_block_fp8: argument 'x' must be 2-D"):
        norm_ops.norm_block_fp8(x.reshape(2, 35, 64), w, b, 1e-5, True, 32, 32)
    with pytest.raises(ValueError, match="norm_fwd_block_fp8: argument 'col_block' must be >= 1"):
        norm_ops.norm_block_fp8(x, w, b, 1e-5, True, 32, 0)
    def bad_call(eps=1e-5, is_layernorm=True, mode="fp32", one_d=False):
        def call(device):
            x, w, b = torch.randn(70, 64, device=device), torch.randn(64, device=device), torch.randn(64, device=device)
            return torch.ops.fp8mp.norm_fwd_block_fp8(x[0] if one_d else x, w, b, eps, is_layernorm, False, 32, 32,
                                                      "e4m3", mode)
        return call

    for call in (bad_call(is_layernorm=False), bad_call(mode="e8m0"), bad_call(eps=0.0), bad_call(one_d=True)):
        eager = error_of(call, "cpu")  # the fake kernel refuses what the CPU kernel refuses, with the same error
        assert error_of(call, "fake") == eager and "fp8mp::norm_fwd_block_fp8: argument" in eager[1]
    with FakeTensorMode():
        with pytest.raises(NotImplementedError, match="norm_block_fp8 on CUDA tensors"):
            torch.ops.fp8mp.norm_fwd_block_fp8(torch.randn(4, 64, device="cuda"), None, None, 1e-5, True, False, 32, 32,
                                               "e4m3", "fp32")
