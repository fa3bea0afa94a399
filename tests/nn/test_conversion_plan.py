"""fp8mp.convert(model, plan=...): each planned layer pinned to its recipe, the refusals, and what convert reports."""
from __future__ import annotations

import logging

import pytest
import torch

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, RowwiseScaling
from hand_plans import hand_plan, mlp

CHOICES = {"0": "rowwise", "2": "delayed", "4": "bf16"}


def train(model: torch.nn.Module, steps: int = 3) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(64, 32, generator=gen), torch.randn(64, 10, generator=gen)
        with fp8mp.fp8_autocast():  # DelayedScaling for what the plan does not pin
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_plan_trains_bit_identically_to_converting_each_layer_by_hand():
    planned = fp8mp.convert(mlp(), plan=hand_plan(CHOICES))
    by_hand = mlp()
    fp8mp.convert(by_hand, recipe=RowwiseScaling(), module_filter=lambda name, m: name == "0")
    fp8mp.convert(by_hand, recipe=DelayedScaling(), module_filter=lambda name, m: name == "2")
    assert [type(m) for m in planned] == [type(m) for m in by_hand]
    assert type(planned[4]) is torch.nn.Linear and type(planned[6]) is torch.nn.Linear  # "bf16", and too small
    assert planned[0].fp8_recipe == RowwiseScaling() and planned[2].fp8_recipe == DelayedScaling()
    assert fp8mp.nn.converted_layers(planned) == {"0": RowwiseScaling(), "2": DelayedScaling()}
    assert train(planned) == train(by_hand)
    for (name, a), (_, b) in zip(planned.state_dict().items(), by_hand.state_dict().items()):
        assert torch.equal(a, b), name  # every parameter and FP8 scaling buffer after 3 steps


def test_a_plain_dict_is_a_plan_without_architecture():
    model = fp8mp.convert(mlp(), plan={"2": CurrentScaling(), "4": None})
    assert type(model[0]) is torch.nn.Linear  # not named: kept
    assert model[2].fp8_recipe == CurrentScaling() and type(model[4]) is torch.nn.Linear


def test_the_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"'fc9'.*match no layer.*'0', '2', '4'"):
        fp8mp.convert(mlp(), plan={"fc9": RowwiseScaling()})
    with pytest.raises(ValueError, match=r"'6'.*match no layer"):  # exists, but too small for FP8 GEMMs
        fp8mp.convert(mlp(), plan={"6": RowwiseScaling()})
    other = hand_plan({"0": "rowwise"}, architecture=["0", "2", "4", "8"])
    with pytest.raises(ValueError, match=r"another model: layers of the planned model this one lacks: '8'"):
        fp8mp.convert(mlp(), plan=other)
    wider = torch.nn.Sequential(*mlp(), torch.nn.Linear(10, 16), torch.nn.Linear(16, 16))
    with pytest.raises(ValueError, match=r"layers of this model the plan never saw: '8'"):
        fp8mp.convert(wider, plan=hand_plan(CHOICES))
    with pytest.raises(ValueError, match=r"'plan'.*without 'recipe' and 'module_filter'"):
        fp8mp.convert(mlp(), plan=hand_plan(CHOICES), recipe=DelayedScaling())
    with pytest.raises(ValueError, match=r"'plan'.*without 'recipe' and 'module_filter'"):
        fp8mp.convert(mlp(), plan=hand_plan(CHOICES), module_filter=lambda name, m: True)
    with pytest.raises(TypeError, match=r"argument 'plan': layer '0'"):
        fp8mp.convert(mlp(), plan={"0": "rowwise"})
    with pytest.raises(TypeError, match=r"argument 'plan' must be an fp8mp.PrecisionPlan"):
        fp8mp.convert(mlp(), plan=["0"])
    with pytest.raises(ValueError, match=r"fp8_all_gather.*layer '0''s recipe RowwiseScaling"):
        fp8mp.convert(mlp(), plan=hand_plan(CHOICES), fp8_all_gather=True)


def test_a_converted_model_is_no_plan_target_and_says_why():
    model = fp8mp.convert(mlp())
    with pytest.raises(ValueError, match=r"'0'.*fp8mp modules already"):
        fp8mp.convert(model, plan={"0": RowwiseScaling()})


def test_convert_logs_each_layer_and_a_summary(caplog):
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        fp8mp.convert(mlp(), plan=hand_plan(CHOICES))
    lines = [r.getMessage() for r in caplog.records]
    assert "fp8mp.convert: 0: Linear(32 -> 64) -> fp8mp.nn.Linear, recipe RowwiseScaling" in lines
    assert "fp8mp.convert: 2: Linear(64 -> 64) -> fp8mp.nn.Linear, recipe DelayedScaling" in lines
    assert any(line.startswith("fp8mp.convert: converted 2 modules; kept 2 (plan: 1") for line in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        fp8mp.convert(mlp())
    assert "fp8mp.convert: 4: Linear(64 -> 32) -> fp8mp.nn.Linear, recipe fp8_autocast's" in caplog.text


def test_converting_nothing_warns_naming_the_filter(caplog):
    def keep_the_head(name, module):
        return name == "lm_head"  # a misspelt or absent name: nothing matches

    with caplog.at_level(logging.WARNING, logger="fp8mp"):
        fp8mp.convert(mlp(), module_filter=keep_the_head)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "converted no module: module_filter" in record.getMessage() and "keep_the_head" in record.getMessage()
    assert "test_conversion_plan.py" in record.getMessage() and "0, 2, 4, 6" in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fp8mp"):
        fp8mp.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3)))
    assert "holds no torch.nn.Linear" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fp8mp"):
        fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(10, 10)))
    assert "none of the model's 1 candidates" in caplog.text


def test_converting_nothing_on_purpose_is_no_warning(caplog):
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        fp8mp.convert(mlp(), plan=hand_plan({"0": "bf16", "2": "bf16", "4": "bf16"}))
        fp8mp.convert(fp8mp.convert(mlp()))  # the second finds fp8mp modules only
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "the plan keeps every layer in high precision" in caplog.text
    assert "fp8mp modules already" in caplog.text


def test_the_other_options_follow_the_plan():
    model = mlp()
    model.requires_grad_(False)
    fp8mp.convert(model, plan=hand_plan(CHOICES), frozen_weights="fp8")
    assert isinstance(model[0].weight, fp8mp.nn.Fp8FrozenWeight)
    assert not isinstance(model[4].weight, fp8mp.nn.Fp8FrozenWeight)  # "bf16": its weight is kept as it is
