"""fp8mp.replan on a converted demo GPT: planned clean, trained, then outliers planted into one layer's input
(tests/planning/planted_models.py); replan moves that layer off per-tensor FP8, reports it, swaps or re-pins
only what changed, and training goes on with the optimizer built before. Layer times are pinned (a GPU's order)."""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
import planted_models as pm
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.planning import plan_changes
from fp8mp.planning.plan import HIGH_PRECISION, PrecisionPlan

PLANTED, FEEDER = "blocks.1.mlp.proj", "blocks.1.mlp.fc"


def train_steps(model, optimizer, batches, steps: int) -> float:
    loss = torch.tensor(math.nan)
    for step in range(steps):
        with fp8mp.fp8_autocast():
            loss = pm.gpt_loss(model, batches[step % len(batches)])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return float(loss.detach())


@pytest.fixture
def planned(tmp_path):
    """A clean GPT planned, converted under its plan, and trained a few steps with an Adam built after convert."""
    model, batches = pm.gpt(planted=False), pm.gpt_batches()
    cache = pm.pinned_times(model, batches[0].numel(), tmp_path / "times.json")
    plan = fp8mp.plan_precision(model, batches, loss_fn=pm.gpt_loss, speed_cache=cache, progress=False)
    assert {layer.choice for layer in plan.layers} <= set(pm.PER_TENSOR), plan
    fp8mp.convert(model, plan=plan)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    assert math.isfinite(train_steps(model, optimizer, batches, 3))
    return model, batches, plan, optimizer, cache


def replan(model, batches, plan, cache):
    return fp8mp.replan(model, batches, plan, loss_fn=pm.gpt_loss, speed_cache=cache, progress=False)


def test_planted_outliers_move_their_layer_off_per_tensor_and_training_goes_on(planned):
    model, batches, plan, optimizer, cache = planned
    modules_before = dict(model.named_modules())
    params_before = {name: p for name, p in model.named_parameters()}
    pm.plant(model.get_submodule(FEEDER), model.get_submodule(PLANTED))
    new_plan, changes = replan(model, batches, plan, cache)

    moved = {change.name: change for change in changes}
    assert PLANTED in moved, changes
    assert moved[PLANTED].old in pm.PER_TENSOR and moved[PLANTED].new in (*pm.FINE_GRAINED, HIGH_PRECISION)
    assert new_plan.layers[[layer.name for layer in new_plan.layers].index(PLANTED)].choice == moved[PLANTED].new
    assert "range" in moved[PLANTED].why and "sensitivity" in moved[PLANTED].why, moved[PLANTED].why
    assert moved[PLANTED].after["range_binades"] > moved[PLANTED].before["range_binades"] + 10
    assert PLANTED in str(changes) and "->" in str(changes)

    # Applied in place: the planted layer under its new choice, every other layer's module object untouched.
    module = model.get_submodule(PLANTED)
    if moved[PLANTED].new == HIGH_PRECISION:
        assert type(module) is torch.nn.Linear
    else:
        assert isinstance(module, Fp8Module) and module.fp8_recipe is new_plan.choice(PLANTED)
    for name, before in modules_before.items():
        if name not in moved and name != "":
            assert model.get_submodule(name) is before or any(name.startswith(m + ".") for m in moved), name
    assert fp8mp.nn.converted_layers(model).keys() == {layer.name for layer in new_plan.layers
                                                        if layer.choice != HIGH_PRECISION}

    # The optimizer built before replan still holds the model's parameters, and a step trains them.
    assert {name: p for name, p in model.named_parameters()} == params_before
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters()}
    weight = model.get_submodule(PLANTED).weight
    before = weight.detach().clone()
    assert math.isfinite(train_steps(model, optimizer, batches, 2))
    assert not torch.equal(weight.detach(), before)


def test_an_unchanged_model_replans_to_the_same_plan_and_reports_no_change(planned):
    model, batches, plan, optimizer, cache = planned
    modules_before = dict(model.named_modules())
    pins = fp8mp.nn.converted_layers(model)
    # Measured after training steps: the weights moved, yet not so far that a choice changes.
    new_plan, changes = replan(model, batches, plan, cache)
    assert changes == [] and str(changes) == "no layer changed its choice"
    assert [layer.choice for layer in new_plan.layers] == [layer.choice for layer in plan.layers]
    assert new_plan.budget == plan.budget and new_plan.candidates == plan.candidates
    assert dict(model.named_modules()) == modules_before  # the same module objects, put back after measuring
    assert fp8mp.nn.converted_layers(model) == pins
    assert math.isfinite(train_steps(model, optimizer, batches, 1))


def test_replan_to_another_recipe_repins_the_module_and_resets_its_scaling(planned):
    model, batches, plan, optimizer, cache = planned
    module = model.get_submodule(PLANTED)
    assert bool(module.fp8_meta.initialized.any())  # trained: scales set from the data
    pm.plant(model.get_submodule(FEEDER), model.get_submodule(PLANTED))
    # bf16 is the slowest choice under the pinned times: the plan takes a fine-grained recipe where one fits.
    new_plan, changes = replan(model, batches, plan, cache)
    assert {c.name: c for c in changes}[PLANTED].new in pm.FINE_GRAINED
    assert model.get_submodule(PLANTED) is module  # the same object, re-pinned
    assert module.fp8_recipe is new_plan.choice(PLANTED) and module.fp8_meta.recipe is module.fp8_recipe
    assert not bool(module.fp8_meta.initialized.any()) and not bool(module.fp8_meta.amax_history.any())


def test_changes_from_names_the_layer_the_old_and_new_choice_and_the_evidence(planned):
    _, _, plan, _, _ = planned
    data = plan.to_dict()
    data["layers"][0]["choice"] = "block"
    edited = PrecisionPlan.from_dict(data)
    changes = edited.changes_from(plan)
    assert [(c.name, c.old, c.new) for c in changes] == [(plan.layers[0].name, plan.layers[0].choice, "block")]
    assert "sensitivity" in changes[0].why and "SQNR" in changes[0].why
    assert plan.changes_from(plan) == []
    assert plan_changes.HIGH_PRECISION == HIGH_PRECISION


def test_replan_refuses_a_plan_for_another_model(planned):
    model, batches, plan, _, cache = planned
    data = plan.to_dict()
    data["architecture"] = data["architecture"] + ["blocks.9.mlp.fc"]
    with pytest.raises(ValueError, match="blocks.9.mlp.fc"):
        replan(model, batches, PrecisionPlan.from_dict(data), cache)
    assert fp8mp.nn.converted_layers(model) == {layer.name: plan.choice(layer.name) for layer in plan.layers}


def test_the_trainer_replans_every_n_steps_on_its_recent_batches(tmp_path, caplog):
    model, batches = pm.gpt(planted=False), pm.gpt_batches()
    cache = pm.pinned_times(model, batches[0].numel(), tmp_path / "times.json")  # the process cache keeps them
    plan = fp8mp.plan_precision(model, batches, loss_fn=pm.gpt_loss, speed_cache=cache, progress=False)
    # A tiny lr: Adam's first steps move every weight by about lr, which at 1e-4 would soon outgrow the planted
    # reader columns (1/30000 of the rest) and let the outliers dominate the output, where per-tensor FP8 does well.
    trainer = fp8mp.Trainer(model, {"plan": plan, "replan_every_steps": 2, "replan_batches": 2, "lr": 1e-8,
                                    "activation_dtype": "fp32", "progress_bar": False})
    optimizer, params = trainer.optimizer, list(trainer.model.parameters())
    assert all(math.isfinite(loss) for loss in trainer.fit(batches, pm.gpt_loss, steps=2))
    assert [step for step, _ in trainer.replans] == [2] and trainer.replans[0][1] == []
    pm.plant(trainer.model.get_submodule(FEEDER), trainer.model.get_submodule(PLANTED))
    with caplog.at_level("INFO", logger="fp8mp"):
        losses = trainer.fit(batches, pm.gpt_loss, steps=2)
    assert all(math.isfinite(loss) for loss in losses)
    step, changes = trainer.replans[-1]
    assert step == 4 and PLANTED in [change.name for change in changes], changes
    assert trainer.plan.choice(PLANTED) is not plan.choice(PLANTED)
    assert "step 4: replanned" in caplog.text and PLANTED in caplog.text
    assert trainer.optimizer is optimizer and list(trainer.model.parameters()) == params


def test_the_trainer_config_refuses_replanning_without_a_plan():
    with pytest.raises(ValueError, match="replan_every_steps"):
        fp8mp.TrainerConfig.from_dict({"replan_every_steps": 10})
    with pytest.raises(ValueError, match="replan_every_steps"):
        fp8mp.TrainerConfig.from_dict({"replan_every_steps": 0})
