"""fp8mp.convert / unconvert, and checkpoints carrying the FP8 scaling state."""
from __future__ import annotations

import copy
import io
import logging

import pytest
import torch

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()),
        torch.nn.Linear(64, 10),  # 10 is not a multiple of 16: stays high precision
    )


def test_convert_swaps_in_place_shares_parameters_and_skips_unaligned(caplog):
    model = mlp()
    params_before = [p for p in model.parameters()]
    reference = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        out = fp8mp.convert(model)
    assert out is model
    assert type(model[0]) is fp8mp.nn.Linear and type(model[2][0]) is fp8mp.nn.Linear
    assert type(model[3]) is torch.nn.Linear
    assert "3" in caplog.text and "multiples of 16" in caplog.text
    assert all(a is b for a, b in zip(model.parameters(), params_before))
    x = torch.randn(8, 32)
    assert torch.equal(model(x), reference(x))  # outside fp8_autocast: identical
    with fp8mp.fp8_autocast() as ctx:
        model(x)
    assert len(ctx.modules) == 2


def test_module_filter_and_recipe_and_idempotence():
    model = mlp()
    recipe = CurrentScaling()
    fp8mp.convert(model, recipe=recipe, module_filter=lambda name, m: name != "0")
    assert type(model[0]) is torch.nn.Linear and type(model[2][0]) is fp8mp.nn.Linear
    assert model[2][0].fp8_recipe is recipe
    converted = model[2][0]
    fp8mp.convert(model)
    assert model[2][0] is converted  # already converted modules are left alone


def test_unconvert_round_trip():
    model = mlp()
    reference = copy.deepcopy(model)
    fp8mp.unconvert(fp8mp.convert(model))
    assert all(type(m) in (torch.nn.Linear, torch.nn.ReLU, torch.nn.Sequential) for m in model.modules())
    assert model.state_dict().keys() == reference.state_dict().keys()
    x = torch.randn(4, 32)
    assert torch.equal(model(x), reference(x))


def test_bare_linear_is_returned_converted():
    linear = torch.nn.Linear(32, 32)
    new = fp8mp.convert(linear)
    assert type(new) is fp8mp.nn.Linear and new.weight is linear.weight


def test_bad_arguments():
    with pytest.raises(TypeError, match="'model'"):
        fp8mp.convert("not a model")
    with pytest.raises(TypeError, match="'module_filter'"):
        fp8mp.convert(mlp(), module_filter=3)
    with pytest.raises(TypeError, match="fp8_recipe"):
        fp8mp.convert(mlp(), recipe="delayed")


def test_llama_from_config_converts_and_trains():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    reference = copy.deepcopy(model)
    fp8mp.convert(model, module_filter=lambda name, m: name != "lm_head")
    converted = [n for n, m in model.named_modules() if isinstance(m, fp8mp.nn.Linear)]
    assert len(converted) == 2 * 7  # q, k, v, o, gate, up, down per layer
    ids = torch.randint(0, 128, (2, 16))
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
        loss = model(input_ids=ids, labels=ids).loss
    ref_loss = reference(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss) and abs(loss.item() - ref_loss.item()) / ref_loss.item() < 0.02
    loss.backward()
    assert all(m.weight.grad is not None for m in model.modules() if isinstance(m, fp8mp.nn.Linear))


# ---------------------------------------------------------------- checkpoints


def test_state_dict_carries_fp8_state_and_loads_torch_checkpoints():
    layer = fp8mp.nn.Linear(32, 16)
    keys = set(layer.state_dict().keys())
    assert keys == set(torch.nn.Linear(32, 16).state_dict().keys()) | {
        "fp8_meta.amax", "fp8_meta.amax_history", "fp8_meta.scale", "fp8_meta.scale_inv", "fp8_meta.initialized"}
    layer.load_state_dict(torch.nn.Linear(32, 16).state_dict(), strict=True)  # a plain torch checkpoint
    with pytest.raises(RuntimeError, match="size mismatch"):
        layer.load_state_dict(torch.nn.Linear(16, 16).state_dict())


def train_steps(model, opt, steps, seed, recipe):
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 32, generator=gen)
        y = torch.randn(32, 10, generator=gen)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_resume_from_checkpoint_is_bit_identical():
    recipe = DelayedScaling(amax_history_len=8)
    model = fp8mp.convert(mlp())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_steps(model, opt, 5, seed=1, recipe=recipe)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    continued = train_steps(model, opt, 6, seed=2, recipe=recipe)

    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    torch.manual_seed(123)  # different init: everything must come from the checkpoint
    resumed_model = fp8mp.convert(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()),
        torch.nn.Linear(64, 10)))
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_opt = torch.optim.AdamW(resumed_model.parameters(), lr=1e-3)
    resumed_opt.load_state_dict(checkpoint["opt"])
    resumed = train_steps(resumed_model, resumed_opt, 6, seed=2, recipe=recipe)
    assert resumed == continued
    for a, b in zip(model.state_dict().values(), resumed_model.state_dict().values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_fp8_state_restores_history_and_initialized_flag():
    recipe = DelayedScaling(amax_history_len=4)
    layer = fp8mp.nn.Linear(32, 16)
    for i in range(3):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            layer(torch.randn(4, 32) * (i + 1)).sum().backward()
    fresh = fp8mp.nn.Linear(32, 16)
    assert not fresh.fp8_meta.is_initialized() and fresh.fp8_meta.amax_history.shape == (1024, 3)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.fp8_meta.is_initialized() and fresh.fp8_meta.amax_history.shape == (4, 3)
    for name in ("amax", "amax_history", "scale", "scale_inv", "initialized"):
        assert torch.equal(getattr(fresh.fp8_meta, name), getattr(layer.fp8_meta, name))
    partial = {k: v for k, v in layer.state_dict().items() if k != "fp8_meta.scale"}
    with pytest.raises(RuntimeError, match="fp8_meta.scale"):
        fresh.load_state_dict(partial)  # half an FP8 state is a broken checkpoint, not a plain torch one


def test_convert_norms_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 32), torch.nn.RMSNorm(32, eps=1e-6),
                                torch.nn.LayerNorm((4, 8)))
    reference = copy.deepcopy(model)
    fp8mp.convert(model, convert_norms=True)
    assert [type(m) for m in model] == [fp8mp.nn.LayerNorm, fp8mp.nn.Linear, fp8mp.nn.RMSNorm, torch.nn.LayerNorm]
    x = torch.randn(5, 32)
    torch.testing.assert_close(model[:3](x), reference[:3](x), rtol=1e-5, atol=1e-5)
    fp8mp.unconvert(model)
    assert [type(m) for m in model] == [torch.nn.LayerNorm, torch.nn.Linear, torch.nn.RMSNorm, torch.nn.LayerNorm]
    assert torch.equal(model[:3](x), reference[:3](x))
