"""fp8mp.nn.LoRALinear / apply_lora: frozen (FP8-stored) bases, trainable adapters, LoRA fine-tuning in the Trainer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.nn.lora import LoRALinear, apply_lora


def make_model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every non-adapter tensor, FP8 ones viewed as bytes so that equality is bit for bit."""
    return {k: (v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v).clone()
            for k, v in model.state_dict().items() if isinstance(v, torch.Tensor) and "lora_" not in k}


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("fp8_base_weight", [False, True])
def test_output_at_init_equals_the_base_output(fp8, fp8_base_weight):
    base = fp8mp.nn.Linear(32, 64, fp8_weight=fp8_base_weight)
    x = torch.randn(8, 32)
    with fp8mp.fp8_autocast(enabled=fp8), torch.no_grad():
        expected = base(x)
        base.fp8_meta.reset_scaling()  # the second forward must see the same scales as the first
        lora = LoRALinear(base, rank=4, alpha=8.0, fp8_base_weight=fp8_base_weight)
        assert torch.equal(lora(x), expected)
    assert lora.lora_A.shape == (4, 32) and lora.lora_B.shape == (64, 4) and not bool(lora.lora_B.any())
    assert bool(lora.lora_A.abs().max() > 0) and lora.scaling == 2.0


@pytest.mark.parametrize("fp8_base_weight", [False, True])
def test_only_adapters_get_grads_and_change_bases_stay_bit_identical(fp8_base_weight):
    model = fp8mp.convert(make_model())
    apply_lora(model, rank=4, alpha=8.0, targets=["0", "2"], fp8_base_weight=fp8_base_weight)
    assert model[0].base.stores_fp8_weight == fp8_base_weight
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"}
    before, adapters_before = base_state(model), {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):  # training mode, grad enabled, FP8 base without any master weight
        optimizer.zero_grad()
        with fp8mp.fp8_autocast():
            loss = model(torch.randn(8, 32)).square().mean()
        loss.backward()
        assert all((p.grad is not None) == p.requires_grad for p in model.parameters())
        optimizer.step()
    after = base_state(model)
    assert all(torch.equal(after[k], before[k]) for k in before if "fp8_meta" not in k)
    assert all(not torch.equal(p, adapters_before[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_fp8_stored_base_without_freeze_still_demands_a_master():
    layer = fp8mp.nn.Linear(32, 64, fp8_weight=True)
    with pytest.raises(RuntimeError, match="no master weight"):
        with fp8mp.fp8_autocast():
            layer(torch.randn(4, 32))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="'fp8_base_weight'=True needs an fp8mp.nn.Linear base"):
        LoRALinear(torch.nn.Linear(32, 64), 4, 8.0, fp8_base_weight=True)
    with pytest.raises(ValueError, match="'rank' must be an int >= 1"):
        LoRALinear(torch.nn.Linear(32, 64), 0, 8.0)
    model = make_model()
    with pytest.raises(ValueError, match=r"'targets' \['attn'\] matches no Linear layer; .* are \['0', '2'\]"):
        apply_lora(model, 4, 8.0, ["attn"])
    assert all(p.requires_grad for p in model.parameters())  # nothing was frozen by the failed call
    with pytest.raises(ValueError, match=r"needs fp8mp.nn.Linear targets, but \['0'\] are torch.nn.Linear"):
        apply_lora(model, 4, 8.0, ["0"], fp8_base_weight=True)


@pytest.mark.parametrize("fp8_base_weight", [False, True])
def test_lora_fine_tune_in_the_trainer_reduces_the_loss(fp8_base_weight):
    gen = torch.Generator().manual_seed(1)
    shift = torch.randn(16, 32, generator=gen) / 32 ** 0.5  # the new task: the old model plus a low-rank change
    reference = make_model()
    xs = [torch.randn(64, 32, generator=gen) for _ in range(60)]
    with torch.no_grad():
        batches = [(x, reference(x) + x @ shift.T) for x in xs]
    config = {"lr": 1e-2, "progress_bar": False,
              "lora": {"rank": 4, "alpha": 8.0, "targets": ["0", "2"], "fp8_base_weight": fp8_base_weight}}
    trainer = fp8mp.Trainer(make_model(), config)
    frozen = base_state(trainer.model)
    loss_fn = lambda model, batch: F.mse_loss(model(batch[0]).float(), batch[1])  # noqa: E731
    start = trainer.evaluate(batches[:5], loss_fn)
    trainer.fit(batches, loss_fn)
    end = trainer.evaluate(batches[:5], loss_fn)
    print(f"LoRA fine-tune (fp8_base_weight={fp8_base_weight}): eval loss {start:.4f} -> {end:.4f}")
    assert end < 0.5 * start
    after = base_state(trainer.model)
    assert all(torch.equal(after[k], frozen[k]) for k in frozen if "fp8_meta" not in k)
