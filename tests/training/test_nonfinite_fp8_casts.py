"""A step whose FP8 casts met an Inf or NaN is skipped by LossScaler like a non-finite gradient.

E4M3 saturates ±Inf to ±448, so an Inf in an input, a weight or a gradient of an FP8 layer can leave
the loss and every gradient finite: only the casts' amaxes know. Checked for NaN, +Inf and -Inf in
each of the three tensors a Linear casts, under delayed and current scaling, in E4M3 and HYBRID.
"""
from __future__ import annotations

import copy
import logging
import math
import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode

import fp8mp
from fp8mp.scaling import autocast
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Format

POISON_STEP = 2


class SyncCounter(TorchFunctionMode):
    """Counts the tensor -> Python value conversions (each a device->host sync on a GPU)."""

    SYNCS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
             torch.Tensor.__int__, torch.Tensor.cpu, torch.Tensor.numpy}

    def __init__(self):
        super().__init__()
        self.count = 0
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func in self.SYNCS and not self.paused
        return func(*args, **(kwargs or {}))


class UncountedStep:
    """`optimizer` for LossScaler, whose own step (AdamW reads its step counts) is not counted."""

    def __init__(self, optimizer, counter: SyncCounter):
        self.optimizer, self.counter = optimizer, counter
        self.param_groups = optimizer.param_groups

    def step(self):
        self.counter.paused = True
        try:
            return self.optimizer.step()
        finally:
            self.counter.paused = False


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    # No bias on the last layer: a poisoned grad_output would otherwise reach its bias gradient unquantized.
    return fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16, bias=False)))


def batch(step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(step))


def poison_grad_output(value: float):
    def hook(module, args, out):
        out.register_hook(lambda grad: grad.index_put((torch.tensor([1]), torch.tensor([5])), torch.tensor(value)))
        return out
    return hook


def run_step(model, optimizer, scaler, x, recipe) -> tuple[float, int]:
    """One iteration; returns the loss and the number of syncs that scaler.step + update made."""
    optimizer.zero_grad()
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        loss = model(x).square().mean()
    scaler.scale(loss).backward()
    with SyncCounter() as syncs:
        scaler.step(UncountedStep(optimizer, syncs))
        scaler.update()
    return loss.item(), syncs.count


RECIPES = {
    "delayed-e4m3": DelayedScaling(amax_history_len=4, fp8_format=Format.E4M3),
    "current-e4m3": CurrentScaling(fp8_format=Format.E4M3),
    "delayed-hybrid": DelayedScaling(amax_history_len=4),
    "current-hybrid": CurrentScaling(),
}
WHERE = {"input": ("0", "input"), "weight": ("2", "weight"), "grad_output": ("2", "grad_output")}


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", list(WHERE))
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_non_finite_fp8_cast_skips_the_step_and_names_the_layer(recipe, where, value):
    recipe = RECIPES[recipe]
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = fp8mp.LossScaler(init_scale=1024.0)
    for step in range(POISON_STEP):
        run_step(model, optimizer, scaler, batch(step), recipe)
    x = batch(POISON_STEP)
    if where == "input":
        x[3, 7] = value
    elif where == "weight":
        saved_weight = model[2].weight.detach().clone()
        with torch.no_grad():
            model[2].weight[4, 9] = value
    handle = model[2].register_forward_hook(poison_grad_output(value)) if where == "grad_output" else None
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer_state = copy.deepcopy(optimizer.state_dict())

    loss, syncs = run_step(model, optimizer, scaler, x, recipe)

    print(f"{where}={value}: loss {loss}, found {[(c.tensors) for c in scaler.nonfinite_fp8_casts]}")
    assert syncs == 1  # the FP8 flags ride on the gradient check's one sync
    for key, tensor in model.named_parameters():  # no weight moved (NaN where poisoned stays NaN)
        assert torch.equal(tensor.nan_to_num(7.0), weights[key].nan_to_num(7.0)), key
    assert optimizer.state_dict()["state"][0]["step"] == optimizer_state["state"][0]["step"]
    assert scaler.num_skipped_steps == scaler.num_fp8_skipped_steps == 1 and scaler.get_scale() == 512.0
    layer, tensor = WHERE[where]
    found = {(name, t) for cast in scaler.nonfinite_fp8_casts for name, m in model.named_modules()
             if m is cast.module for t in cast.tensors}
    assert (layer, tensor) in found, found

    if handle is not None:
        handle.remove()
    if where == "weight":
        with torch.no_grad():
            model[2].weight.copy_(saved_weight)
    _, syncs = run_step(model, optimizer, scaler, batch(POISON_STEP + 1), recipe)  # a clean step steps again
    assert scaler.num_skipped_steps == 1 and scaler.nonfinite_fp8_casts == [] and syncs == 1
    assert optimizer.state_dict()["state"][0]["step"] == optimizer_state["state"][0]["step"] + 1


def test_inf_input_under_e4m3_has_a_finite_loss_and_gradients_yet_is_skipped():
    # E4M3 saturates the Inf to 448, so only the cast's amax shows it: the step must still be skipped.
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = fp8mp.LossScaler()
    x = batch(0)
    x[0, 0] = math.inf
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E4M3)):
        loss = model(x).square().mean()
    scaler.scale(loss).backward()
    assert math.isfinite(loss.item()) and all(bool(p.grad.isfinite().all()) for p in model.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert scaler.step(optimizer) is None
    scaler.update()
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_a_layer_called_twice_is_skipped_when_only_its_first_call_met_an_inf():
    layer = fp8mp.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = fp8mp.LossScaler()
    poisoned = batch(0)
    poisoned[2, 2] = math.inf
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E4M3)):
        loss = layer(poisoned).square().mean() + layer(batch(1)).square().mean()  # the second cast overwrites amax
    scaler.scale(loss).backward()
    assert bool(layer.fp8_meta.amax.isfinite().all())
    assert scaler.step(optimizer) is None


def test_evaluation_forwards_do_not_count_for_the_next_step():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = fp8mp.LossScaler()
    recipe = DelayedScaling(fp8_format=Format.E4M3)
    poisoned = batch(0)
    poisoned[0, 0] = math.inf
    with torch.no_grad(), fp8mp.fp8_autocast(fp8_recipe=recipe):
        model(poisoned)  # an evaluation batch with an Inf: its casts record no gradient
    run_step(model, optimizer, scaler, batch(1), recipe)
    assert scaler.num_skipped_steps == 0


def test_casts_before_the_scaler_existed_do_not_count():
    model = make_model()
    poisoned = batch(0)
    poisoned[0, 0] = math.inf
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E4M3)):
        model(poisoned).sum().backward()  # a warm-up step without a scaler
    scaler = fp8mp.LossScaler()
    run_step(model, torch.optim.SGD(model.parameters(), lr=0.1), scaler, batch(1), DelayedScaling(fp8_format=Format.E4M3))
    assert scaler.num_skipped_steps == 0


def test_a_new_layer_is_checked_even_where_a_dead_one_had_its_id():
    """The modules a step must check are listed by id(), which a new module can reuse from one that died while
    still listed (no LossScaler step between): the new one must still be listed and its step amaxes reset."""
    layer = fp8mp.nn.Linear(16, 16)
    stand_in = fp8mp.nn.Linear(16, 16)  # the dead module's entry, as far as the list can tell
    autocast.take_unchecked_modules()
    autocast._CONTEXTS.unchecked[id(layer)] = (weakref.ref(stand_in), None)
    layer.fp8_meta.step_amax.fill_(math.inf)  # a cast of an earlier step that this step must not count
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E4M3)):
        layer(batch(0))
    assert [module for module, _ in autocast.take_unchecked_modules()] == [layer]
    assert bool(layer.fp8_meta.step_amax.isfinite().all())


def test_trainer_logs_the_layer_and_the_fallback_policy_counts_it(caplog):
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("enc", torch.nn.Linear(16, 32))
    model.add_module("act", torch.nn.GELU())
    model.add_module("head", torch.nn.Linear(32, 16))
    trainer = fp8mp.Trainer(model, {"fp8_format": "E4M3", "activation_dtype": "fp32", "progress_bar": False})
    poisoned = batch(5)
    poisoned[1, 1] = math.inf
    batches = [(batch(i), torch.zeros(8, 16)) for i in range(3)] + [(poisoned, torch.zeros(8, 16))]
    with caplog.at_level(logging.WARNING, logger="fp8mp"):
        losses = trainer.fit(batches, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    assert math.isfinite(losses[-1])
    assert "fp8mp.Trainer: step 3 skipped: FP8 casts met Inf/NaN in 'enc' (input)" in caplog.text
    assert trainer.scaler.num_fp8_skipped_steps == 1
    assert trainer.fallback.bad_step_counts() == {"enc": 1, "head": 0}
    assert trainer.state_dict()["scaler"]["num_fp8_skipped_steps"] == 1
