"""A precision plan through the framework integrations: hf.prepare / from_pretrained, accelerate's prepare and
Lightning's FP8Precision take `plan=` (a PrecisionPlan or the path of its JSON) and refuse it beside a filter."""
from __future__ import annotations

import pytest
import torch

import framework_helpers as fh
import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, RowwiseScaling
from hand_plans import hand_plan

MLP_CHOICES = {"0": "rowwise", "2": "bf16"}


def test_hf_prepare_applies_a_plan_and_from_pretrained_restores_it(tmp_path):
    pytest.importorskip("transformers")
    import hf_models
    hf = pytest.importorskip("fp8mp.integrations.hf")
    model = hf_models.build("llama")
    layers = fp8mp.nn.convertible_layers(model)
    choices = {name: "rowwise" if "self_attn" in name else "current" if "mlp" in name else "bf16" for name in layers}
    assert choices["lm_head"] == "bf16"
    hand_plan(choices, model=model).save(tmp_path / "plan.json")
    hf.prepare(model, plan=tmp_path / "plan.json", recipe=DelayedScaling(amax_history_len=4))
    assert type(model.lm_head) is torch.nn.Linear
    assert fp8mp.nn.converted_layers(model) == {name: RowwiseScaling() if choice == "rowwise" else CurrentScaling()
                                                for name, choice in choices.items() if choice != "bf16"}
    ids = torch.randint(0, hf_models.VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    model.save_pretrained(tmp_path / "saved")
    reloaded = hf.from_pretrained(type(model), tmp_path / "saved", plan=tmp_path / "plan.json")
    assert fp8mp.nn.converted_layers(reloaded) == fp8mp.nn.converted_layers(model)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ValueError, match=r"hf.prepare: argument 'plan' .* without 'keep_high_precision'"):
        hf.prepare(hf_models.build("llama"), plan=tmp_path / "plan.json", keep_high_precision=["lm_head"])
    with pytest.raises(TypeError, match=r"hf.prepare: argument 'plan' must be an fp8mp.PrecisionPlan"):
        hf.prepare(hf_models.build("llama"), plan=5)


def test_accelerate_prepare_applies_a_plan(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    import fp8mp.integrations.accelerate as fp8_accelerate

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
        net = fh.mlp()
        hand_plan(MLP_CHOICES, model=net).save(tmp_path / "plan.json")
        optimizer = torch.optim.AdamW(net.parameters())
        model, optimizer = fp8_accelerate.prepare(accelerator, net, optimizer, plan=str(tmp_path / "plan.json"))
        assert fp8mp.nn.converted_layers(net) == {"0": RowwiseScaling()} and type(net[2]) is torch.nn.Linear
        with pytest.raises(ValueError, match=r"accelerate.prepare: argument 'plan' .* without 'recipe' and "
                                             r"'module_filter'"):
            fp8_accelerate.prepare(accelerator, fh.mlp(), plan=str(tmp_path / "plan.json"),
                                   module_filter=lambda name, m: True)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_lightning_plugin_applies_a_plan(tmp_path):
    pytest.importorskip("lightning")
    from fp8mp.integrations.lightning import FP8Precision

    plan = hand_plan(MLP_CHOICES, model=fh.mlp())
    recipe = CurrentScaling()
    plugin = FP8Precision(plan=plan, recipe=recipe)
    model = plugin.convert_module(fh.mlp())
    assert fp8mp.nn.converted_layers(model) == {"0": RowwiseScaling()} and type(model[2]) is torch.nn.Linear
    with plugin.forward_context():
        assert fp8mp.get_fp8_recipe() is recipe  # fp8_autocast's, for modules the plan does not pin
        model(torch.randn(4, fh.IN)).float().sum().backward()
    plan.save(tmp_path / "plan.json")
    assert FP8Precision(plan=tmp_path / "plan.json").plan.layer_recipes() == plan.layer_recipes()
    with pytest.raises(ValueError, match=r"FP8Precision: argument 'plan' .* without 'module_filter'"):
        FP8Precision(plan=plan, module_filter=lambda name, m: True)
    with pytest.raises(TypeError, match=r"FP8Precision: argument 'plan' must be"):
        FP8Precision(plan=["0"])
