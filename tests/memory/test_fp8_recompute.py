"""fp8mp.nn.fp8_recompute: the forward's bits, gradients against fp64 (exactly those at the FP8-stored inputs, and
within a bound from E4M3's spacing at the true inputs), the bytes saved, and what it refuses."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fp8mp.nn import fp8_recompute
from fp8mp.memory.saved_tensors import saved_tensor_bytes
from saved_fp8_reference import FP32_SLACK, fp8_error_bound, grouped_input, reference_fake_quant

FP8_BYTES_PER_ELEMENT = 1 + 4 / 128  # E4M3 plus one fp32 scale per 128 elements
# The error of a gradient from inputs moved by delta is H(xi) delta for some xi between x and the stored x + delta
# (mean value theorem, per gradient element); |H(xi)| is taken as the larger of |H| at the two ends, with this
# allowance for the curvature between them (a relative step of at most 2^-4).
CURVATURE_ALLOWANCE = 1.25


def gated(act):
    return lambda gate, up: act(gate) * up


def attention64(q, k, v):
    """Causal softmax attention written out in fp64 (no SDPA kernel)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, -math.inf).softmax(-1) @ v


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


CASES = {  # name: (function under test, its fp64 formula, input shapes)
    "silu gate * up": (gated(F.silu), gated(lambda g: g * torch.sigmoid(g)), [(3, 256), (3, 256)]),
    "gelu_tanh gate * up": (gated(lambda g: F.gelu(g, approximate="tanh")),
                            gated(lambda g: 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))),
                            [(4, 128), (4, 128)]),
    "causal attention": (sdpa_causal, attention64, [(1, 1, 4, 128)] * 3),
}


def inputs(shapes, seed, spread=True):
    """fp32 inputs; `spread`: 128-element groups of magnitudes 1e-4..1e3 (grouped_input) for the element-wise cases."""
    out = []
    for i, shape in enumerate(shapes):
        rows = math.prod(shape[:-1])
        x = grouped_input(rows, shape[-1], seed=seed + i) if spread else \
            torch.randn(rows, shape[-1], generator=torch.Generator().manual_seed(seed + i))
        out.append(x.view(shape))
    return out


def grads_of(function, xs, weight):
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    out = function(*xs)
    return out, torch.autograd.grad((out * weight).sum(), xs)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_bits_and_gradients_at_the_stored_inputs(name):
    function, formula, shapes = CASES[name]
    xs = inputs(shapes, seed=1, spread="attention" not in name)
    weight = torch.randn(function(*xs).shape, generator=torch.Generator().manual_seed(7))
    plain, _ = grads_of(function, xs, weight)
    ours, grads = grads_of(lambda *a: fp8_recompute(function, *a), xs, weight)
    assert torch.equal(ours, plain)  # the forward is the function's own, bit for bit
    # Backward is the exact gradient at the inputs as E4M3 in 1 x 128 groups (torch's float8 cast as reference).
    stored = [reference_fake_quant(x.reshape(-1, x.shape[-1])).view(x.shape).double() for x in xs]
    _, expected = grads_of(formula, stored, weight.double())
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.double(), want, rtol=2.0 ** -16, atol=2.0 ** -16 * want.abs().max().item())


def abs_hessian(formula, xs, weight) -> torch.Tensor:
    """|H| of sum(weight * formula(*xs)) in fp64, over the inputs' elements flattened and concatenated."""
    xs64 = tuple(x.double() for x in xs)
    sizes = [x.numel() for x in xs64]

    def loss(flat):
        return (formula(*(p.view(x.shape) for p, x in zip(flat.split(sizes), xs64))) * weight.double()).sum()

    return torch.autograd.functional.hessian(loss, torch.cat([x.reshape(-1) for x in xs64]), vectorize=True).abs()


def hessian_bound(formula, xs, weight) -> list[torch.Tensor]:
    """Per input element: CURVATURE_ALLOWANCE * sum_j max(|H(x)|, |H(x')|)_ij b_j, with x' the inputs as stored
    (torch's float8 cast, reference_fake_quant) and b_j the most that FP8 storage moves input element j."""
    stored = [reference_fake_quant(x.reshape(-1, x.shape[-1])).view(x.shape) for x in xs]
    hessian = torch.maximum(abs_hessian(formula, xs, weight), abs_hessian(formula, stored, weight))
    moved = torch.cat([fp8_error_bound(x.double().reshape(-1, x.shape[-1])).reshape(-1) for x in xs])
    bound = CURVATURE_ALLOWANCE * hessian @ moved
    return [b.view(x.shape) for b, x in zip(bound.split([x.numel() for x in xs]), xs)]


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_against_fp64_within_the_e4m3_bound(name):
    function, formula, shapes = CASES[name]
    xs = inputs(shapes, seed=3, spread="attention" not in name)
    weight = torch.randn(function(*xs).shape, generator=torch.Generator().manual_seed(5))
    _, grads = grads_of(lambda *a: fp8_recompute(function, *a), xs, weight)
    _, exact = grads_of(formula, [x.double() for x in xs], weight.double())
    bounds = hessian_bound(formula, xs, weight)
    for got, want, bound in zip(grads, exact, bounds):
        error = (got.double() - want).abs()
        allowed = bound + FP32_SLACK * (want.abs() + bound) + 2.0 ** -40
        assert (error <= allowed).all(), f"{name}: worst excess {(error - allowed).max().item():.3g}"
        assert error.max() > 0  # the inputs were stored in FP8: not the fp32 gradient


def test_bytes_saved_are_the_differentiable_inputs_in_fp8_and_other_tensors_as_they_are():
    gate, up = (torch.randn(8, 512, requires_grad=True) for _ in range(2))
    plain = saved_tensor_bytes(lambda: gated(F.silu)(gate * 1, up * 1))["total"]
    ours = saved_tensor_bytes(lambda: fp8_recompute(gated(F.silu), gate * 1, up * 1))["total"]
    assert plain == 3 * 8 * 512 * 4  # silu's input, and the product's two operands, in fp32
    assert ours == 2 * 8 * 512 * FP8_BYTES_PER_ELEMENT
    q, k, v = (torch.randn(1, 2, 8, 128, requires_grad=True) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    saved = saved_tensor_bytes(lambda: fp8_recompute(F.scaled_dot_product_attention, q * 1, k * 1, v * 1, mask))
    assert saved["total"] == 3 * q.numel() * FP8_BYTES_PER_ELEMENT + mask.numel()


def test_under_autocast_the_recomputation_runs_in_the_forwards_dtype():
    a, b = torch.randn(4, 128, requires_grad=True), torch.randn(128, 256, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fp8_recompute(torch.matmul, a, b)
    assert out.dtype == torch.bfloat16
    grad_a, grad_b = torch.autograd.grad(out.float().sum(), (a, b))
    qa, qb = (reference_fake_quant(t.detach()) for t in (a, b))
    ones = torch.ones(4, 256, dtype=torch.bfloat16)
    torch.testing.assert_close(grad_a, (ones @ qb.bfloat16().t()).float(), rtol=0, atol=0)
    torch.testing.assert_close(grad_b, (qa.bfloat16().t() @ ones).float(), rtol=0, atol=0)


def test_without_grad_or_differentiable_inputs_the_function_runs_as_it_is():
    calls = []

    def function(x):
        calls.append(torch.is_grad_enabled())
        return x * 2

    x = torch.randn(4, 128)
    assert torch.equal(fp8_recompute(function, x), x * 2)
    with torch.no_grad():
        fp8_recompute(function, x.requires_grad_(True))
    assert calls == [True, False]


def test_refusals_name_the_argument():
    x = torch.randn(4, 128, requires_grad=True)
    with pytest.raises(TypeError, match="argument 'function' must be callable"):
        fp8_recompute(None, x)
    with pytest.raises(TypeError, match="argument 'function' must return one tensor"):
        fp8_recompute(lambda t: (t * 2, None), x)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        fp8_recompute(lambda t: t * 2, torch.randn(4, 128, dtype=torch.float64, requires_grad=True))
