"""fp8mp.Trainer with a precision plan: {"plan": a PrecisionPlan or the path of its JSON}."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, RowwiseScaling
from hand_plans import hand_plan
from test_trainer import QUIET, make_model, mse, teacher_batches

CHOICES = {"enc.0": "rowwise", "enc.2": "current", "dec.1": "bf16", "head": "delayed"}


def test_the_trainer_applies_a_plan_from_its_path(tmp_path):
    hand_plan(CHOICES, model=make_model()).save(tmp_path / "plan.json")
    trainer = fp8mp.Trainer(make_model(), {"plan": str(tmp_path / "plan.json"), **QUIET})
    model = trainer.model
    assert model.enc[0].fp8_recipe == RowwiseScaling() and model.enc[2].fp8_recipe == CurrentScaling()
    assert type(model.dec[1]) is torch.nn.Linear and model.head.fp8_recipe == DelayedScaling()
    losses = trainer.fit(teacher_batches(3), mse)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_a_plan_object_trains_as_converting_by_hand():
    planned = fp8mp.Trainer(make_model(), {"plan": hand_plan(CHOICES, model=make_model()), **QUIET})
    by_hand = make_model()
    for name, recipe in (("enc.0", RowwiseScaling()), ("enc.2", CurrentScaling()), ("head", DelayedScaling())):
        fp8mp.convert(by_hand, recipe=recipe, module_filter=lambda n, m, name=name: n == name)
    by_hand = fp8mp.Trainer(by_hand, {"keep_high_precision": ["dec.1"], **QUIET})
    batches = teacher_batches(3)
    assert planned.fit(batches, mse) == by_hand.fit(batches, mse)
    for (name, a), (_, b) in zip(planned.model.state_dict().items(), by_hand.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_config_refuses_what_conflicts_with_a_plan(tmp_path):
    plan = hand_plan(CHOICES, model=make_model())
    with pytest.raises(ValueError, match=r"key 'plan' decides each layer's precision; drop key 'keep_high_precision'"):
        fp8mp.TrainerConfig.from_dict({"plan": plan, "keep_high_precision": ["head"]})
    with pytest.raises(ValueError, match=r"key 'plan' .* drop key 'format_overrides'"):
        fp8mp.TrainerConfig.from_dict({"plan": plan, "format_overrides": {"head": "E4M3"}})
    with pytest.raises(TypeError, match=r"TrainerConfig: key 'plan' must be an fp8mp.PrecisionPlan or the path"):
        fp8mp.TrainerConfig.from_dict({"plan": 3})
    with pytest.raises(FileNotFoundError, match=r"TrainerConfig: key 'plan': no plan at"):
        fp8mp.TrainerConfig.from_dict({"plan": str(tmp_path / "absent.json")})
    other = torch.nn.Sequential(torch.nn.Linear(32, 64))
    with pytest.raises(ValueError, match=r"match no layer convert would touch"):
        fp8mp.Trainer(other, {"plan": plan, **QUIET})
