"""fp8mp.nn.LayerNormLinear: the fused norm->FP8 path gives exactly the unfused FP8 numbers."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

NORMS = ["LayerNorm", "RMSNorm"]


def make(normalization, dtype=torch.float32, in_f=64, out_f=48, seed=0):
    torch.manual_seed(seed)
    fused = fp8mp.nn.LayerNormLinear(in_f, out_f, normalization=normalization, dtype=dtype)
    with torch.no_grad():
        fused.norm.weight.uniform_(0.5, 1.5)
        if getattr(fused.norm, "bias", None) is not None:
            fused.norm.bias.uniform_(-0.1, 0.1)
    # The same parameters as two separate modules: the unfused FP8 path.
    separate = torch.nn.Sequential(copy.deepcopy(fused.norm), copy.deepcopy(fused.linear))
    return fused, separate


def step(module, x, grad, recipe):
    module.zero_grad()
    x = x.clone().requires_grad_(True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = module(x)
    out.backward(grad)
    return out, x.grad


@pytest.mark.parametrize("normalization", NORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_equals_unfused_bit_for_bit(normalization, dtype):
    fused, separate = make(normalization, dtype)
    recipe = DelayedScaling(amax_history_len=8)
    for i in range(4):  # step 0 runs unfused (current-scaling start), steps 1..3 fused
        x = (torch.randn(3, 10, 64) * (i + 1) + 2).to(dtype)
        grad = torch.randn(3, 10, 48).to(dtype)
        out_f, dx_f = step(fused, x, grad, recipe)
        out_s, dx_s = step(separate, x, grad, recipe)
        assert torch.equal(out_f, out_s), i
        assert torch.equal(dx_f, dx_s), i
        for (name, a), b in zip(fused.named_parameters(), separate.parameters()):
            assert torch.equal(a.grad, b.grad), (i, name)
        for name in ("amax", "amax_history", "scale", "scale_inv"):
            assert torch.equal(getattr(fused.linear.fp8_meta, name), getattr(separate[1].fp8_meta, name)), (i, name)


@pytest.mark.parametrize("normalization", NORMS)
def test_fused_path_is_taken_and_accurate(normalization, monkeypatch):
    fused, _ = make(normalization)
    calls = []
    import fp8mp.nn.layernorm_linear as module

    original = module.norm_fp8_linear
    monkeypatch.setattr(module, "norm_fp8_linear", lambda *a, **k: calls.append(1) or original(*a, **k))
    torch.manual_seed(1)
    x = torch.randn(32, 64) * 3
    for _ in range(3):
        out, _ = step(fused, x, torch.randn(32, 48), DelayedScaling())
    assert len(calls) == 2  # steps 1 and 2
    with torch.no_grad():
        reference = fused.linear.to_torch()(fused.norm(x))
    sqnr = 20 * math.log10(reference.norm() / (reference - out.detach()).norm())
    assert sqnr >= 25


def test_outside_autocast_and_current_scaling_run_unfused():
    fused, separate = make("LayerNorm")
    x = torch.randn(8, 64)
    assert torch.equal(fused(x), separate(x))
    out_f, _ = step(fused, x, torch.randn(8, 48), CurrentScaling())
    out_s, _ = step(separate, x, torch.randn(8, 48), CurrentScaling())
    assert torch.equal(out_f, out_s)


def test_state_dict_keys_and_bad_arguments():
    module = fp8mp.nn.LayerNormLinear(32, 16)
    assert set(module.state_dict()) == {"norm.weight", "norm.bias", "linear.weight", "linear.bias",
                                     *(f"linear.fp8_meta.{n}" for n in ("amax", "amax_history", "scale", "scale_inv", "initialized"))}
    with pytest.raises(ValueError, match="'normalization'"):
        fp8mp.nn.LayerNormLinear(32, 16, normalization="BatchNorm")
    with pytest.raises(ValueError, match="'eps'"):
        fp8mp.nn.LayerNormLinear(32, 16, eps=0)
    with fp8mp.fp8_autocast():
        with pytest.raises(ValueError, match="'input'"):
            module(torch.randn(4, 31))


@pytest.mark.parametrize("normalization", NORMS)
def test_a_frozen_fp8_weight_gives_the_fused_path_the_unfused_numbers(normalization, monkeypatch):
    """The fused norm path asks the weight for its operands as the Linear does (one weight interface): a weight
    frozen in FP8 goes to the GEMMs as its stored codes on both paths, so the fused steps equal the unfused ones
    bit for bit (a fused path that cast the decoded weight with the delayed WEIGHT scale would not)."""
    fused, _ = make(normalization)
    fused.linear.weight.requires_grad_(False)
    fp8mp.nn.store_frozen_weights_in_fp8(fused)
    assert isinstance(fused.linear.weight, fp8mp.nn.Fp8FrozenWeight)
    separate = torch.nn.Sequential(copy.deepcopy(fused.norm), copy.deepcopy(fused.linear))
    import fp8mp.nn.layernorm_linear as module

    calls = []
    original = module.norm_fp8_linear
    monkeypatch.setattr(module, "norm_fp8_linear", lambda *a, **k: calls.append(1) or original(*a, **k))
    recipe = DelayedScaling(amax_history_len=4)
    torch.manual_seed(3)
    for i in range(3):  # step 0 unfused (scales from the data), steps 1 and 2 fused
        x, grad = torch.randn(4, 9, 64) * (i + 1) + 1, torch.randn(4, 9, 48)
        out_f, dx_f = step(fused, x, grad, recipe)
        out_s, dx_s = step(separate, x, grad, recipe)
        assert torch.equal(out_f, out_s), i
        assert torch.equal(dx_f, dx_s), i
        assert torch.equal(fused.norm.weight.grad, separate[0].weight.grad), i
    assert len(calls) == 2
