"""fp8mp.Trainer and TrainerConfig: config checks, FP8 vs FP32 training, overrides, loss-scaler skips, resume."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.scaling.recipe import Format

QUIET = {"progress_bar": False}


def teacher_batches(count: int, batch: int = 64, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable regression task: targets from a fixed random tanh MLP."""
    gen = torch.Generator().manual_seed(seed)
    w1, w2 = torch.randn(64, 32, generator=gen) / 32 ** 0.5, torch.randn(16, 64, generator=gen) / 8
    xs = [torch.randn(batch, 32, generator=gen) for _ in range(count)]
    return [(x, torch.tanh(x @ w1.T) @ w2.T) for x in xs]


class EncDec(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
        self.dec = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(64, 64))
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.head(self.dec(self.enc(x)))


def make_model(seed: int = 1) -> EncDec:
    torch.manual_seed(seed)
    return EncDec()


def mse(model, batch):
    x, y = batch
    return F.mse_loss(model(x).float(), y)


# ----------------------------------------------------------------------------- config
def test_unknown_key_names_it_and_suggests_the_closest():
    with pytest.raises(ValueError, match=r"unknown key 'precison' \(did you mean 'precision'\?\).*Valid keys: .*grad_clip"):
        fp8mp.TrainerConfig.from_dict({"precison": "bf16"})
    with pytest.raises(ValueError, match=r"unknown key 'rnk' \(did you mean 'rank'\?\)"):
        fp8mp.TrainerConfig.from_dict({"lora": {"rnk": 4, "alpha": 8, "targets": ["enc"]}})


@pytest.mark.parametrize("key, value, match", [
    ("precision", "fp16", r"'precision' must be one of \['fp8_mixed', 'bf16', 'fp32'\]"),
    ("scaling", "instant", r"'scaling' must be one of"),
    ("amax_history_len", 0, r"'amax_history_len' must be an int >= 1"),
    ("margin", True, r"'margin' must be an int >= 0"),
    ("lr", -1e-3, r"'lr' must be a finite number > 0"),
    ("grad_clip", float("nan"), r"'grad_clip' must be a finite number"),
    ("activation_dtype", "fp16", r"'activation_dtype' must be one of \['bf16', 'fp32'\]"),
    ("keep_high_precision", "head", r"'keep_high_precision' must be a list"),
    ("format_overrides", {"enc": "E3M4"}, r"format_overrides\['enc'\]' must be one of \['E4M3', 'HYBRID'\]"),
    ("lora", {"rank": 0, "alpha": 1.0, "targets": ["enc"]}, r"'lora.rank' must be an int >= 1"),
])
def test_bad_values_name_the_key_and_the_allowed_values(key, value, match):
    with pytest.raises(ValueError, match=match):
        fp8mp.TrainerConfig.from_dict({key: value})


@pytest.mark.parametrize("d", [{"fp8_format": "E5M2"}, {"format_overrides": {"enc": "E5M2"}}])
def test_e5m2_is_refused_with_the_reason_and_hybrid_suggested(d):
    with pytest.raises(ValueError, match=r"E5M2.*weight-gradient GEMM would multiply two E5M2 operands.*'HYBRID'"):
        fp8mp.TrainerConfig.from_dict(d)


def test_config_is_frozen_with_defaults_and_builds_its_recipe():
    config = fp8mp.TrainerConfig.from_dict({"keep_high_precision": ["head"], "format_overrides": {"enc": "E4M3"}})
    assert config.keep_high_precision == ("head",) and config.format_overrides == (("enc", "E4M3"),)
    assert config.precision == "fp8_mixed" and config.fp8_format == "HYBRID" and config.grad_clip == 1.0
    with pytest.raises(AttributeError):
        config.lr = 1.0
    assert config.fp8_recipe().fp8_format is Format.HYBRID and config.fp8_recipe("E4M3").fp8_format is Format.E4M3
    assert config.fp8_recipe().amax_history_len == 1024


@pytest.mark.parametrize("key", ["format_overrides", "keep_high_precision"])
def test_prefix_matching_no_module_is_refused(key):
    value = {"encoder": "E4M3"} if key == "format_overrides" else ["encoder"]  # "enc" exists, "encoder" does not
    with pytest.raises(ValueError, match=rf"'{key}' prefix 'encoder' matches no"):
        fp8mp.Trainer(make_model(), {key: value, **QUIET})


def test_override_on_a_module_kept_in_high_precision_matches_nothing_converted():
    with pytest.raises(ValueError, match=r"prefix 'head' matches no converted module"):
        fp8mp.Trainer(make_model(), {"keep_high_precision": ["head"], "format_overrides": {"head": "E4M3"}, **QUIET})


# ----------------------------------------------------------------------------- training
def test_fp8_mixed_training_lands_within_a_few_percent_of_fp32():
    batches = teacher_batches(100)
    results = {}
    for precision in ("fp8_mixed", "fp32"):
        trainer = fp8mp.Trainer(make_model(), {"precision": precision, "lr": 3e-3, **QUIET})
        losses = trainer.fit(batches, mse)
        results[precision] = (losses[0], sum(losses[-10:]) / 10)
    (first8, last8), (first32, last32) = results["fp8_mixed"], results["fp32"]
    print(f"fp8_mixed {first8:.4f} -> {last8:.4f}; fp32 {first32:.4f} -> {last32:.4f}; gap {last8 / last32 - 1:+.2%}")
    assert last32 < 0.2 * first32 and last8 < 0.2 * first8  # the task is learned
    assert abs(last8 / last32 - 1) < 0.05


def test_format_overrides_set_the_recipes_on_the_right_modules():
    trainer = fp8mp.Trainer(make_model(), {"fp8_format": "HYBRID", "format_overrides": {"enc": "E4M3", "enc.2": "HYBRID"},
                                           **QUIET})
    trainer.train_step(teacher_batches(1)[0], mse)
    model = trainer.model
    grad_format = {name: m.fp8_meta.format_of(fp8mp.scaling.fp8_meta.LinearTensor.GRAD_OUTPUT)
                   for name, m in model.named_modules() if isinstance(m, fp8mp.nn.Linear)}
    assert grad_format == {"enc.0": "e4m3", "enc.2": "e5m2", "dec.1": "e5m2", "head": "e5m2"}
    assert model.enc[0].fp8_meta.fp8_max.tolist() == [448.0, 448.0, 448.0]
    assert model.dec[1].fp8_meta.fp8_max.tolist() == [448.0, 448.0, 57344.0]
    assert bool((model.enc[0].fp8_meta.amax > 0).all())  # it really ran in FP8


def test_keep_high_precision_keeps_torch_linear():
    trainer = fp8mp.Trainer(make_model(), {"keep_high_precision": ["head", "enc.0"], **QUIET})
    model = trainer.model
    assert type(model.head) is torch.nn.Linear and type(model.enc[0]) is torch.nn.Linear
    assert type(model.enc[2]) is fp8mp.nn.Linear and type(model.dec[1]) is fp8mp.nn.Linear
    trainer.train_step(teacher_batches(1)[0], mse)


def test_injected_inf_gradient_is_skipped_and_leaves_weights_untouched():
    batches = teacher_batches(3)
    trainer = fp8mp.Trainer(make_model(), {"initial_scale": 1024.0, **QUIET})
    trainer.fit(batches[:2], mse)
    before = copy.deepcopy(trainer.model.state_dict())
    optimizer_before = copy.deepcopy(trainer.optimizer.state_dict())
    handle = trainer.model.dec[1].weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    loss = trainer.train_step(batches[2], mse)
    handle.remove()
    assert loss == loss and abs(loss) != float("inf")  # the loss itself was finite
    for key, value in trainer.model.state_dict().items():
        if ".fp8_meta." not in key:  # the step's amaxes were recorded; the weights must not move
            assert torch.equal(value, before[key]), key
    assert trainer.optimizer.state_dict()["state"][0]["step"] == optimizer_before["state"][0]["step"]
    assert trainer.scaler.get_scale() == 512.0 and trainer.scaler.num_skipped_steps == 1


def test_state_dict_resume_gives_identical_next_losses():
    batches = teacher_batches(8)
    config = {"lr": 3e-3, **QUIET}
    first = fp8mp.Trainer(make_model(), config)
    first.fit(batches[:5], mse)
    checkpoint = copy.deepcopy(first.state_dict())
    expected = first.fit(batches[5:], mse)
    resumed = fp8mp.Trainer(make_model(seed=99), config)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(checkpoint)
    assert resumed.step == 5
    assert resumed.fit(batches[5:], mse) == expected


def test_evaluate_is_gradient_free_and_restores_train_mode():
    trainer = fp8mp.Trainer(make_model(), {"monitor": True, "log_every": 1, **QUIET})
    batches = teacher_batches(2)
    trainer.train_step(batches[0], mse)
    rows = len(trainer.monitor.records)
    trainer.optimizer.zero_grad(set_to_none=True)
    value = trainer.evaluate(batches, mse)
    assert trainer.model.training and all(p.grad is None for p in trainer.model.parameters())
    assert value == pytest.approx(sum(mse(trainer.model, b).item() for b in batches) / 2, rel=0.1)
    assert len(trainer.monitor.records) == rows > 0  # evaluation is not recorded


def test_loss_fn_must_return_a_scalar():
    trainer = fp8mp.Trainer(make_model(), QUIET)
    with pytest.raises(ValueError, match=r"'loss_fn' must return a scalar loss tensor, got a tensor of shape \(64, 16\)"):
        trainer.train_step(teacher_batches(1)[0], lambda model, batch: model(batch[0]))
