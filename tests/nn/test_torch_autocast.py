"""FP8 layers under torch.autocast return autocast's dtype, as torch.nn.Linear does, with the same numbers.

Under torch.autocast(dtype=D) the output of an FP8 layer is D (so the ops after it run in D, as
after an nn.Linear), and it is the single rounding to D of the fp32 output the same layer gives
outside autocast; the input is quantized from its own dtype, so every FP8 code, scale and gradient
is the same as outside autocast when the arriving gradient has the same values.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format, MXFP8Scaling, RowwiseScaling

RECIPES = {
    "delayed": DelayedScaling(fp8_format=Format.HYBRID),
    "current": CurrentScaling(fp8_format=Format.HYBRID),
    "rowwise": RowwiseScaling(),
    "block": BlockScaling(),
    "mxfp8": MXFP8Scaling(),
}
IN_F, OUT_F = 256, 128


def make_module(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    """A module whose parameters are exact in `dtype`, so autocast's copy of the bias is exact."""
    torch.manual_seed(0)
    if kind == "Linear":
        module = fp8mp.nn.Linear(IN_F, OUT_F)
    elif kind == "Conv1D":
        module = fp8mp.nn.Conv1D(OUT_F, IN_F)
    else:
        module = fp8mp.nn.LayerNormLinear(IN_F, OUT_F, normalization=kind.removeprefix("Norm+"))
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(dtype).float())
    return module


def step(module, x, grad, recipe, autocast_dtype=None):
    """One forward + backward in FP8 (under torch.autocast(autocast_dtype) unless None): out, x.grad, param grads."""
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast_dtype is not None):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = module(x)
    out.backward(grad.to(out.dtype))
    return out, x.grad, {name: p.grad for name, p in module.named_parameters()}


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("recipe", list(RECIPES), ids=list(RECIPES))
@pytest.mark.parametrize("kind", ["Linear", "Conv1D", "Norm+LayerNorm", "Norm+RMSNorm"])
def test_output_has_autocast_dtype_and_the_same_numbers(kind, recipe, autocast_dtype):
    recipe = RECIPES[recipe]
    outside = make_module(kind, autocast_dtype)
    inside = copy.deepcopy(outside)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, IN_F, generator=gen)
    # A gradient whose values autocast's dtype holds exactly, so both runs see the same gradient.
    grad = torch.randn(4, 16, OUT_F, generator=gen).to(autocast_dtype).float()
    for _ in range(2):  # the second step: delayed scaling from the first step's amaxes
        for module in (outside, inside):
            module.zero_grad()
        out_ref, dx_ref, grads_ref = step(outside, x, grad, recipe)
        out, dx, grads = step(inside, x, grad, recipe, autocast_dtype)
        assert out.dtype == autocast_dtype and out_ref.dtype == torch.float32
        assert torch.equal(out, out_ref.to(autocast_dtype))
        assert dx.dtype == torch.float32 and torch.equal(dx, dx_ref)
        for name, g in grads.items():
            assert g.dtype == torch.float32 and torch.equal(g, grads_ref[name]), name


def test_activations_after_an_fp8_linear_run_in_autocast_dtype():
    """What the speed is for: a GELU after the layer runs in bf16, as after an nn.Linear under autocast."""
    fc = fp8mp.nn.Linear(64, 64)
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16), fp8mp.fp8_autocast():
        reference = F.gelu(torch.nn.Linear(64, 64)(x))
        h = F.gelu(fc(x))
    assert h.dtype == reference.dtype == torch.bfloat16


def test_autocast_disabled_or_for_another_device_keeps_input_dtype():
    fc = fp8mp.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False), fp8mp.fp8_autocast():
        assert fc(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16), fp8mp.fp8_autocast():
        assert fc(x.to(torch.bfloat16)).dtype == torch.bfloat16
        with torch.autocast("cpu", enabled=False):  # a region that opts out, as torch.autocast allows
            assert fc(x).dtype == torch.float32


def test_compiled_layer_under_autocast_matches_eager():
    eager = fp8mp.nn.Linear(64, 32)
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True)
    x = torch.randn(8, 64)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16), fp8mp.fp8_autocast():
            expected, got = eager(x), compiled(x)
        assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
