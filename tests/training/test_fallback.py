"""fp8mp.fallback.FallbackPolicy: repeated FP8 overflow sends a layer to high precision for cooldown_steps."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.training.fallback import FallbackPolicy
from fp8mp.optim.master_weights import MasterWeightOptimizer
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling


class Probe:
    """Forward hooks on a layer: poison its input with Inf on chosen steps, record its precision."""

    def __init__(self, layer: fp8mp.nn.Linear):
        self.layer, self.poison, self.ran_high_precision = layer, False, []
        layer.register_forward_pre_hook(self._pre)
        layer.register_forward_hook(self._post)

    def _pre(self, module, args):
        if not self.poison:
            return None
        x = args[0].clone()
        x[0, 0] = float("inf")
        return (x,)

    def _post(self, module, args, out):
        x = args[0]
        weight = module.weight if module.weight is not None else fp8mp.cast_from_fp8(module.weight_fp8, module.weight_scale_inv)
        high = F.linear(x, weight.to(x.dtype), module.bias.to(x.dtype))
        self.ran_high_precision.append(bool(torch.equal(out, high)))


def make_model(fp8_weight: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        fp8mp.nn.Linear(16, 32, fp8_weight=fp8_weight), torch.nn.GELU(), fp8mp.nn.Linear(32, 8, fp8_weight=fp8_weight)
    )


def train(model, policy, probe, poison_steps, steps, recipe, fp8_weight=False):
    if fp8_weight:
        optimizer = MasterWeightOptimizer(lambda p: torch.optim.SGD(p, lr=1e-3), model)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for step in range(steps):
        probe.poison = step in poison_steps
        optimizer.zero_grad()
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = model(torch.randn(4, 16, generator=gen)).square().mean()
        loss.backward()
        optimizer.step()
        policy.step(model)


@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=8), CurrentScaling()], ids=["delayed", "current"])
@pytest.mark.parametrize("fp8_weight", [False, True], ids=["fp32-weight", "fp8-weight"])
def test_layer_runs_high_precision_for_exactly_cooldown_steps(recipe, fp8_weight, caplog):
    model = make_model(fp8_weight)
    probe = Probe(model[2])
    first = Probe(model[0])
    policy = FallbackPolicy(max_bad_steps=2, cooldown_steps=3)
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        train(model, policy, probe, poison_steps={0, 1}, steps=8, recipe=recipe, fp8_weight=fp8_weight)
    # steps 0, 1 overflow in FP8; 2, 3, 4 run in high precision; 5, 6, 7 are back in FP8
    assert probe.ran_high_precision == [False, False, True, True, True, False, False, False]
    assert first.ran_high_precision == [False] * 8  # the healthy layer never left FP8
    assert policy.layers_in_fallback(model) == []
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "fp8mp"]
    assert len(messages) == 2
    assert messages[0][0] == logging.WARNING and "'2'" in messages[0][1] and "3 steps" in messages[0][1]
    assert messages[1][0] == logging.INFO and "'2'" in messages[1][1] and "returns to FP8" in messages[1][1]
    assert torch.isfinite(model[2].fp8_meta.amax_history).all()  # the retry started from clean scaling state


def test_bad_steps_must_be_in_a_row():
    model = make_model()
    probe = Probe(model[2])
    policy = FallbackPolicy(max_bad_steps=2, cooldown_steps=5)
    train(model, policy, probe, poison_steps={0, 2, 4}, steps=6, recipe=CurrentScaling())
    assert probe.ran_high_precision == [False] * 6 and policy.layers_in_fallback(model) == []
    train(model, policy, probe, poison_steps={0, 1}, steps=2, recipe=CurrentScaling())
    assert policy.layers_in_fallback(model) == ["2"]


def test_fallback_computes_in_the_input_dtype():
    layer = fp8mp.nn.Linear(16, 8)
    layer.fp8_fallback = True
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with fp8mp.fp8_autocast():
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.linear(x, layer.weight.bfloat16(), layer.bias.bfloat16()))
    assert layer.fp8_meta.amax.eq(0).all()  # no FP8 cast ran
    policy = FallbackPolicy()
    policy.step(layer)
    assert layer.fp8_fallback  # a flag set by hand is not the policy's to clear


@pytest.mark.parametrize("kwargs,name", [
    (dict(max_bad_steps=0), "max_bad_steps"), (dict(max_bad_steps=True), "max_bad_steps"),
    (dict(cooldown_steps=0), "cooldown_steps"), (dict(cooldown_steps=1.5), "cooldown_steps"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"'{name}'"):
        FallbackPolicy(**kwargs)
    with pytest.raises(TypeError, match="'model'"):
        FallbackPolicy().step([fp8mp.nn.Linear(4, 4)])


def test_policy_state_round_trips_with_the_layers_flags():
    model = make_model()
    probe = Probe(model[2])
    policy = FallbackPolicy(max_bad_steps=1, cooldown_steps=4)
    train(model, policy, probe, poison_steps={0}, steps=2, recipe=CurrentScaling())  # falls back, 3 steps left
    saved = policy.state_dict()
    assert saved["2"] == {"bad_steps": 0, "cooldown_left": 3, "total_bad_steps": 1}

    resumed_model, resumed_policy = make_model(), FallbackPolicy(max_bad_steps=1, cooldown_steps=4)
    resumed_model.load_state_dict(model.state_dict())
    resumed_policy.load_state_dict(saved, resumed_model)
    assert resumed_policy.layers_in_fallback(resumed_model) == ["2"]
    resumed_probe = Probe(resumed_model[2])
    train(resumed_model, resumed_policy, resumed_probe, poison_steps=set(), steps=4, recipe=CurrentScaling())
    assert resumed_probe.ran_high_precision == [True, True, True, False]  # the rest of the cooldown, then FP8
    with pytest.raises(TypeError, match="'state_dict'"):
        resumed_policy.load_state_dict([1], resumed_model)
