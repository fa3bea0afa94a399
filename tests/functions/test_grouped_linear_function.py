"""fp8mp.functions.grouped_linear's fp8_grouped_linear: the FP8 grouped linear's forward and three gradients
against float64 per expert, within a bound derived from the FP8 formats (below), and its per-expert cast
(fp8mp.scaling.per_tensor_grouped) against cast_to_fp8."""
from __future__ import annotations

import pytest
import torch

from fp8mp.functions.grouped_linear import fp8_grouped_linear
from fp8mp.ops import cast_to_fp8
from fp8mp.scaling.current_scale import current_scale
from fp8mp.scaling.per_tensor_grouped import cast_per_expert

# Round-to-nearest in a format with m mantissa bits moves a normal value by at most 2^-(m+1) of itself, and a
# subnormal one by at most half the smallest subnormal; in the scaled domain, so that is times scale_inv.
QUANT = {"e4m3": (2.0 ** -4, 2.0 ** -10), "e5m2": (2.0 ** -3, 2.0 ** -17)}


def quant_error(t64: torch.Tensor, fmt: str, scale_inv: torch.Tensor) -> torch.Tensor:
    """Bound on |dec(cast(t)) - t| per element (scale_inv broadcast against t)."""
    rel, sub = QUANT[fmt]
    return rel * t64.abs() + sub * scale_inv + 1e-6 * t64.abs()  # 1e-6: the fp32 product t * scale and 1 / scale


def product_bound(a64, ea, b64, eb):
    """Bound on |sum_k a'_mk b'_nk - sum_k a_mk b_nk| for |a' - a| <= ea, |b' - b| <= eb (elementwise)."""
    return ea @ b64.abs().t() + a64.abs() @ eb.t() + ea @ eb.t()


def amax_scale_inv(t, fmt, dims=None):
    amax = t.detach().abs().amax() if dims is None else t.detach().abs().amax(dim=dims)
    return current_scale(amax.float().reshape(-1), fmt).reciprocal().double()


def ranges(counts):
    start = 0
    for c in counts:
        yield start, start + c
        start += c


@pytest.mark.parametrize("counts", [[5, 0, 12, 3], [0, 20, 0], [1] * 16, [7]], ids=str)
@pytest.mark.parametrize("weight_in_out", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_and_gradients_within_the_fp8_bound_of_float64(counts, weight_in_out, with_bias):
    torch.manual_seed(sum(counts) + 3 * weight_in_out)
    E, K, N, T = len(counts), 32, 48, sum(counts)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    x = torch.randn(T, K, requires_grad=True)
    w_nk = torch.randn(E, N, K) * torch.logspace(-2, 1, E).view(E, 1, 1)  # experts of very different ranges
    weight = (w_nk.transpose(1, 2).contiguous() if weight_in_out else w_nk).requires_grad_()
    bias = torch.randn(E, N, requires_grad=True) if with_bias else None
    grad_out = torch.randn(T, N) * 1e-3
    y = fp8_grouped_linear(x, weight, offs, bias, weight_in_out=weight_in_out)
    y.backward(grad_out)

    x64, w64, g64 = x.detach().double(), w_nk.double(), grad_out.double()
    sx, sg = amax_scale_inv(x, "e4m3"), amax_scale_inv(grad_out, "e5m2")
    sw = amax_scale_inv(w_nk, "e4m3", dims=(1, 2))
    ex, eg = quant_error(x64, "e4m3", sx), quant_error(g64, "e5m2", sg)
    for e, (s, t) in enumerate(ranges(counts)):
        ew = quant_error(w64[e], "e4m3", sw[e])
        checks = [
            # (name, got, float64 reference, bound from the operands' quantization, the fp32 sums' magnitude)
            ("y", y[s:t], x64[s:t] @ w64[e].t() + (bias[e].double() if with_bias else 0),
             product_bound(x64[s:t], ex[s:t], w64[e], ew), x64[s:t].abs() @ w64[e].abs().t()),
            ("dx", x.grad[s:t], g64[s:t] @ w64[e], product_bound(g64[s:t], eg[s:t], w64[e].t(), ew.t()),
             g64[s:t].abs() @ w64[e].abs()),
            ("dW", weight.grad[e].t() if weight_in_out else weight.grad[e], g64[s:t].t() @ x64[s:t],
             product_bound(g64[s:t].t(), eg[s:t].t(), x64[s:t].t(), ex[s:t].t()), g64[s:t].abs().t() @ x64[s:t].abs()),
        ]
        for name, got, ref, bound, abs_sum in checks:
            tol = bound + 1e-5 * abs_sum + torch.finfo(torch.float32).eps * ref.abs() + 1e-30
            err = (got.double() - ref).abs()
            assert (err <= tol).all(), f"{name} of expert {e}: error {(err - tol).max().item()} over the bound"
        if t == s:
            assert torch.equal(weight.grad[e], torch.zeros_like(weight.grad[e]))
        if with_bias:
            assert torch.allclose(bias.grad[e].double(), g64[s:t].sum(0), rtol=1e-6, atol=1e-9)


def test_bfloat16_model_dtypes_and_finite():
    counts = [3, 9, 0, 4]
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    x = torch.randn(16, 64, dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(4, 32, 64) * 0.1).to(torch.bfloat16).requires_grad_()
    y = fp8_grouped_linear(x, weight, offs)
    y.float().square().sum().backward()
    assert y.dtype == x.grad.dtype == weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(x.grad).all() and torch.isfinite(weight.grad).all()
    ref = torch.cat([x[s:t].float() @ weight[e].float().t() for e, (s, t) in enumerate(ranges(counts))])
    # Two E4M3 roundings (2^-4 each) bound the relative error of each product; bf16 rounds the output once more.
    assert ((y.float() - ref).abs() <= (0.13 + 2 ** -8) * (x.float().abs() @ weight.float().abs().flatten(0, 1).t())
            .view(16, 4, 32)[torch.arange(16), torch.repeat_interleave(torch.arange(4), torch.tensor(counts))] + 1e-6).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_per_expert_is_cast_to_fp8_of_each_expert(fmt):
    w = torch.randn(5, 16, 24, dtype=torch.bfloat16) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 1e4]).view(5, 1, 1).bfloat16()
    w[1, 2, 3] = float("nan")
    data, data_t, scale_inv, amax = cast_per_expert(w, fmt)
    for e in range(5):
        scale = scale_inv[e:e + 1].reciprocal()
        expert_amax = torch.zeros(1)
        expected = cast_to_fp8(w[e], scale, expert_amax, fmt)
        assert torch.equal(data[e].view(torch.uint8), expected.view(torch.uint8)), f"expert {e}"
        assert torch.equal(data_t[e].view(torch.uint8), expected.t().view(torch.uint8)), f"expert {e} transposed"
        assert torch.equal(amax[e:e + 1].nan_to_num(-1.0), expert_amax.nan_to_num(-1.0)), f"expert {e} amax"
    assert scale_inv[3] == 1.0  # an all-zero expert keeps scale 1
