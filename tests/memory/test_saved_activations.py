"""FP8-saved activations (fp8mp/memory/saved_activations.py): what backward reads, its gradients against fp64
formulas within E4M3's spacing, the bytes stored, and what is never quantized."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers.activations import GELUActivation
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import fp8mp
from fp8mp.memory.saved_activations import (dequantize_saved, disable_fp8_saved_activations, enable_fp8_saved_activations,
                                        fp8_saved_bytes_per_element, quantize_saved)
from fp8mp.memory.saved_tensors import saved_tensor_bytes
from saved_fp8_reference import FP32_SLACK, GROUP, HALF_SPACING, fp8_error_bound, grouped_input, reference_fake_quant


# ---------------------------------------------------------------- what backward reads


@pytest.mark.parametrize("cols", [256, 320, 1024])
def test_stored_values_are_per_group_e4m3(cols):
    x = grouped_input(48, cols, seed=cols)
    data, scale_inv = quantize_saved(x)
    assert data.dtype == torch.float8_e4m3fn and tuple(data.shape) == (48, cols)
    assert scale_inv.dtype == torch.float32 and tuple(scale_inv.shape) == (48, math.ceil(cols / GROUP))
    back = dequantize_saved(data, scale_inv, x.shape, x.dtype)
    torch.testing.assert_close(back, reference_fake_quant(x), rtol=2.0 ** -23, atol=0)
    assert ((back.double() - x.double()).abs() <= fp8_error_bound(x.double())).all()


def test_stored_values_keep_shape_dtype_and_short_last_dims():
    x = torch.randn(4, 6, 40, dtype=torch.bfloat16)  # last dim under 128: groups run along the flattened tensor
    data, scale_inv = quantize_saved(x)
    assert tuple(data.shape) == (1, x.numel()) and tuple(scale_inv.shape) == (1, math.ceil(x.numel() / GROUP))
    back = dequantize_saved(data, scale_inv, x.shape, x.dtype)
    assert back.shape == x.shape and back.dtype == torch.bfloat16
    flat = x.float().reshape(-1)
    bound = fp8_error_bound(torch.nn.functional.pad(flat, (0, -flat.numel() % GROUP)).double().view(-1, GROUP)).view(-1)
    assert ((back.double().reshape(-1) - flat.double()).abs() <= bound[:flat.numel()] + 2.0 ** -9 * flat.abs()).all()


# ---------------------------------------------------------------- gradients against fp64


def sup_abs(fn, lo=-12.0, hi=12.0) -> float:
    grid = torch.linspace(lo, hi, 200_001, dtype=torch.float64)
    return fn(grid).abs().max().item() * 1.001


def gelu_grad(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def silu_grad(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def second_derivative(grad):
    h = 1e-5
    return lambda x: (grad(x + h) - grad(x - h)) / (2 * h)


ACTIVATIONS = {"GELU": (torch.nn.GELU, gelu_grad), "SiLU": (torch.nn.SiLU, silu_grad)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradient_within_e4m3_spacing_of_fp64(name, dtype):
    """dx = dy * f'(x'): |dx - dy f'(x)| <= |dy| sup|f''| |x' - x| with |x' - x| E4M3's half spacing."""
    make, derivative = ACTIVATIONS[name]
    module = enable_fp8_saved_activations(make())
    x64 = grouped_input(64, 384, seed=1).double() / 100  # most groups within GELU/SiLU's curved part
    dy = torch.randn(64, 384, dtype=torch.float64).to(dtype).double()
    leaf = x64.to(dtype).requires_grad_()
    # Not the leaf itself: a leaf that requires grad stays referenced anyway, so it is kept as it is.
    (grad,) = torch.autograd.grad(module(leaf * 1), leaf, dy.to(dtype))
    x_exact = leaf.detach().double()
    reference = dy * derivative(x_exact)
    lipschitz = sup_abs(second_derivative(derivative))
    error = fp8_error_bound(x_exact)
    if dtype == torch.bfloat16:  # the stored values come back rounded to bf16, and so does the gradient
        error = error + 2.0 ** -9 * x_exact.abs() * (1 + HALF_SPACING)
    bound = lipschitz * dy.abs() * error + FP32_SLACK * reference.abs()
    if dtype == torch.bfloat16:
        bound = bound + 2.0 ** -8 * (reference.abs() + bound)
    diff = (grad.double() - reference).abs()
    assert (diff <= bound).all(), f"worst excess {(diff - bound).max().item():.3g}"
    plain = torch.autograd.grad(make()(leaf * 1), leaf, dy.to(dtype))[0]
    assert not torch.equal(grad, plain), "the gradient should come from FP8-stored values"
    disable_fp8_saved_activations(module)
    assert torch.equal(torch.autograd.grad(module(leaf * 1), leaf, dy.to(dtype))[0], plain)


def layer_norm_reference(x, dy, weight, eps, centered):
    """fp64 LayerNorm / RMSNorm backward over the last dim: (dx, dweight, xhat, rstd, a = weight * dy)."""
    mean = x.mean(-1, keepdim=True) if centered else torch.zeros_like(x[..., :1])
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(var + eps)
    xhat = (x - mean) * rstd
    a = weight * dy
    dx = rstd * (a - (a.mean(-1, keepdim=True) if centered else 0) - xhat * (a * xhat).mean(-1, keepdim=True))
    return dx, (dy * xhat).sum(0), xhat, rstd, a


NORMS = {
    "torch.nn.LayerNorm": (lambda h: torch.nn.LayerNorm(h, eps=1e-5), True),
    "fp8mp.nn.LayerNorm": (lambda h: fp8mp.nn.LayerNorm(h, eps=1e-5), True),
    "torch.nn.RMSNorm": (lambda h: torch.nn.RMSNorm(h, eps=1e-5), False),
    "fp8mp.nn.RMSNorm": (lambda h: fp8mp.nn.RMSNorm(h, eps=1e-5), False),
    "transformers LlamaRMSNorm": (lambda h: LlamaRMSNorm(h, eps=1e-5), False),
}


def bf16_error_bound(x64: torch.Tensor) -> torch.Tensor:
    """Per element, the most that rounding x to bf16 (8 significant bits) can move it: half a spacing."""
    return 2.0 ** -8 * x64.abs()


@pytest.mark.parametrize("norm_format", ["e4m3", "bf16"])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_gradients_within_the_stored_formats_spacing_of_fp64(name, norm_format):
    """With xhat' = xhat + d (|d| <= rstd |x' - x|, or xhat's own spacing where xhat itself is stored):
    |dx' - dx| <= rstd (|d_i| mean(|a| (|xhat| + |d|)) + |xhat_i| mean(|a| |d|)), |dw' - dw| <= sum |dy| |d|;
    |x' - x| E4M3's half spacing in its group, or bf16's."""
    make, centered = NORMS[name]
    hidden = 384
    module = enable_fp8_saved_activations(make(hidden), norm_format=norm_format)
    error_bound = fp8_error_bound if norm_format == "e4m3" else bf16_error_bound
    torch.manual_seed(2)
    with torch.no_grad():
        module.weight.copy_(torch.randn(hidden) + 1)
        if getattr(module, "bias", None) is not None:
            module.bias.copy_(torch.randn(hidden))
    x = grouped_input(32, hidden, seed=3, offset=0.5 if centered else 0.0)  # LayerNorm: an offset its mean removes
    leaf = x.clone().requires_grad_()
    dy = torch.randn(32, hidden, dtype=torch.float64)
    out = module(leaf * 1)
    dx, dw = torch.autograd.grad(out, [leaf, module.weight], dy.float())
    ref_dx, ref_dw, xhat, rstd, a = layer_norm_reference(x.double(), dy, module.weight.detach().double(), 1e-5, centered)
    d = torch.maximum(rstd * error_bound(x.double()), error_bound(xhat))
    dx_bound = rstd * (d * (a.abs() * (xhat.abs() + d)).mean(-1, keepdim=True) + xhat.abs() * (a.abs() * d).mean(-1, keepdim=True))
    noise = 2.0 ** -16 * rstd * (a.abs() + a.abs().mean(-1, keepdim=True) + xhat.abs() * (a * xhat).abs().mean(-1, keepdim=True))
    assert ((dx.double() - ref_dx).abs() <= dx_bound + noise).all(), f"worst excess {((dx.double() - ref_dx).abs() - dx_bound - noise).max():.3g}"
    dw_bound = (dy.abs() * d).sum(0) + 2.0 ** -16 * (dy * xhat).abs().sum(0)
    assert ((dw.double() - ref_dw).abs() <= dw_bound).all()
    disable_fp8_saved_activations(module)
    exact_dx = torch.autograd.grad(module(leaf * 1), leaf, dy.float())[0]
    assert not torch.equal(dx, exact_dx), "the gradient should come from the stored values"
    assert ((exact_dx.double() - ref_dx).abs() <= noise).all()  # the bound's noise term covers the fp32 norm itself


@pytest.mark.parametrize("name", ["transformers LlamaRMSNorm", "fp8mp.nn.LayerNorm", "fp8mp.nn.RMSNorm"])
def test_bf16_norms_of_a_bf16_model_store_exactly(name):
    """These bf16 norms save bf16 values only (HF's RMSNorm upcasts its bf16 input to fp32 and saves that; torch's
    RMSNorm, not here, also saves its normalized input in fp32, which bf16 storage rounds): stored in bf16 they come
    back exact, so every gradient is the plain module's, bit for bit, in half the bytes of an fp32 copy."""
    make, _ = NORMS[name]
    plain = make(256).to(torch.bfloat16)
    with torch.no_grad():
        plain.weight.copy_(torch.randn(256) + 1)
    hooked = enable_fp8_saved_activations(copy.deepcopy(plain))
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 256, dtype=torch.bfloat16)
    grads = [torch.autograd.grad(m(x * 1), [x, m.weight], dy) for m in (plain, hooked)]
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    fp32_copies = [numel for numel, size in saved_storages(plain, x * 1) if size == 4 and numel == x.numel()]
    assert bytes_of(plain, x * 1) - bytes_of(hooked, x * 1) == 2 * x.numel() * len(fp32_copies)
    assert len(fp32_copies) == (name == "transformers LlamaRMSNorm")


# ---------------------------------------------------------------- bytes


def bytes_of(module, x) -> int:
    return saved_tensor_bytes(lambda: module(x))["total"]


ACTIVATION_MODULES = {"GELU": torch.nn.GELU, "SiLU": torch.nn.SiLU, "ReLU": torch.nn.ReLU, "Tanh": torch.nn.Tanh,
                      "transformers GELUActivation": GELUActivation}
MODULES = {**{name: (lambda make=make: make(256)) for name, (make, _) in NORMS.items()}, **ACTIVATION_MODULES}


def saved_storages(module, x) -> list[tuple[int, int]]:
    """(numel, element size) of each storage that `module(x)` saves for backward, once each, parameters left out."""
    seen = {}

    def record(t):
        seen.setdefault(t.untyped_storage().data_ptr(), (t.numel(), t.element_size()))
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        module(x)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return [value for ptr, value in seen.items() if ptr not in params]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_saved_bytes_drop_by_the_formula(name, dtype):
    """Each full-size saved tensor costs 1 + 4/128 bytes an element instead of its dtype's size; the per-row
    statistics stay as they are; a tensor saved twice in one call (torch's RMSNorm: x for pow and mul) once."""
    module = MODULES[name]().to(dtype)
    x = (torch.randn(64, 256, dtype=dtype).requires_grad_() * 1)
    saved = saved_storages(module, x)  # whatever this torch saves: full-size tensors, small statistics
    plain = bytes_of(module, x)
    assert plain == sum(numel * size for numel, size in saved)
    full = [numel for numel, _ in saved if numel >= x.numel() // 8]
    assert full and all(numel == x.numel() for numel in full)
    statistics = sum(numel * size for numel, size in saved if numel < x.numel() // 8)
    enable_fp8_saved_activations(module, norm_format="e4m3")
    assert bytes_of(module, x) == len(full) * x.numel() * (1 + 4 / 128) + statistics
    disable_fp8_saved_activations(module)
    enable_fp8_saved_activations(module)  # norms in bf16 (an fp32 tensor rounded, a bf16 one kept), the rest in E4M3
    full_bytes = x.numel() * (1 + 4 / 128) if name in ACTIVATION_MODULES else x.numel() * 2
    assert bytes_of(module, x) == len(full) * full_bytes + statistics
    assert fp8_saved_bytes_per_element(256) == 1 + 4 / 128
    disable_fp8_saved_activations(module)
    assert bytes_of(module, x) == plain


def test_bytes_formula_of_ragged_and_short_rows():
    assert fp8_saved_bytes_per_element(320) == 1 + 4 * 3 / 320
    assert fp8_saved_bytes_per_element(64) == 1 + 4 / 128
    module = enable_fp8_saved_activations(torch.nn.GELU())
    for shape in [(64, 320), (16, 64)]:
        x = torch.randn(*shape).requires_grad_() * 1
        assert bytes_of(module, x) == x.numel() + 4 * quantize_saved(x)[1].numel()


# ---------------------------------------------------------------- what is never quantized


class WeightedLayerNorm(torch.nn.Module):
    """A toy "norm" (by its name) whose ops save full-size parameters: a trainable one, a frozen one, a view."""

    def __init__(self, rows, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(rows, cols))
        self.frozen = torch.nn.Parameter(torch.randn(rows, cols), requires_grad=False)
        self.square = torch.nn.Parameter(torch.randn(cols, cols))

    def forward(self, x, other):
        return x * self.weight + x * self.frozen + x @ self.square.t() + x * other


def test_parameters_and_leaves_requiring_grad_are_never_quantized():
    module = enable_fp8_saved_activations(WeightedLayerNorm(32, 128), norm_format="e4m3")
    leaf_x = torch.randn(32, 128, requires_grad=True)
    other = torch.randn(32, 128, requires_grad=True)  # a leaf that requires grad, passed as it is
    x = leaf_x * 1
    seen = []

    def record(t):
        seen.append(t)
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        out = module(x, other)
    fp8 = [t for t in seen if t.dtype == torch.float8_e4m3fn]
    assert [tuple(t.shape) for t in fp8] == [(32, 128)], "only x (saved by three ops, stored once) goes to FP8"
    params = {p.data_ptr() for p in module.parameters()}
    assert params <= {t.data_ptr() for t in seen if t.dtype == torch.float32}
    assert other.data_ptr() in {t.data_ptr() for t in seen}
    dy = torch.randn(32, 128)
    dx, dweight, dother = torch.autograd.grad(out, [leaf_x, module.weight, other], dy)
    # Through the kept parameters and `other`, gradients are exact; through x's FP8 copy they are not.
    torch.testing.assert_close(dx, dy * module.weight + dy * module.frozen + dy @ module.square + dy * other, rtol=1e-6, atol=1e-5)
    assert torch.equal(dweight, dother) and not torch.equal(dweight, dy * x)
    assert ((dweight.double() - (dy * x).double()).abs() <= dy.abs().double() * fp8_error_bound(x.detach().double())).all()
