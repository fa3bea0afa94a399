"""fp8mp with transformers models built from configs (CPU, no downloads): convert, save_pretrained, prepare."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import fp8mp
import hf_models

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
hf = pytest.importorskip("fp8mp.integrations.hf")

FAMILIES = ["gpt2", "llama"]
# What converts (per layer) and what stays: the output embedding is kept by prepare's default.
FP8_MODULES = {"gpt2": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
               "llama": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
LAYERS = {"gpt2": "transformer.h", "llama": "model.layers"}


def fp8_steps(model, steps: int = 3) -> None:
    ids = torch.randint(0, hf_models.VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))
    for _ in range(steps):
        with fp8mp.fp8_autocast():
            model(input_ids=ids, labels=ids).loss.backward()


def fp8_module_names(model) -> list[str]:
    return sorted(n for n, m in model.named_modules() if isinstance(m, (fp8mp.nn.Linear, fp8mp.nn.Conv1D)))


def assert_same_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_of_a_converted_model_round_trips(tmp_path, family):
    # convert, a few FP8 steps, save_pretrained (safetensors): the FP8 state must survive the round trip.
    model = fp8mp.convert(hf_models.build(family))
    fp8_steps(model)
    model.save_pretrained(tmp_path)
    saved = safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert any(".fp8_meta.amax_history" in key for key in saved)
    fresh = fp8mp.convert(hf_models.build(family, seed=9))
    fresh.load_state_dict(saved, strict=False)  # tied lm_head.weight is not saved twice
    assert_same_state(fresh, model)


@pytest.mark.parametrize("family", FAMILIES)
def test_prepare_converts_the_transformer_keeps_the_head_and_runs_every_forward_in_fp8(family):
    model = hf.prepare(hf_models.build(family))
    expected = sorted(f"{LAYERS[family]}.{i}.{m}" for i in range(2) for m in FP8_MODULES[family])
    assert fp8_module_names(model) == expected
    assert type(model.lm_head) is torch.nn.Linear  # the output embedding stays in high precision
    seen = []
    handle = model.get_submodule(expected[0]).register_forward_pre_hook(lambda m, a: seen.append(fp8mp.is_fp8_enabled()))
    ids = torch.randint(0, hf_models.VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()  # no fp8_autocast here: prepare's hooks enter it
    handle.remove()
    assert seen == [True] and not fp8mp.is_fp8_enabled()
    assert all(model.get_submodule(n).fp8_meta.is_initialized() for n in expected)
    with pytest.raises(ValueError, match="already prepared"):
        hf.prepare(model)


def test_prepare_leaves_fp8_autocast_when_the_forward_raises():
    model = hf.prepare(hf_models.build("llama"))
    with pytest.raises(Exception):
        model(input_ids=torch.full((1, 4), hf_models.VOCAB + 5))  # out-of-vocabulary id: the embedding raises
    assert not fp8mp.is_fp8_enabled()


def test_prepare_arguments():
    model = hf.prepare(hf_models.build("gpt2"), keep_high_precision=["transformer.h.1"])  # replaces the default
    assert fp8_module_names(model) == sorted(["lm_head", *(f"transformer.h.0.{m}" for m in FP8_MODULES["gpt2"])])
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    with pytest.raises(TypeError, match="'keep_high_precision'"):
        hf.prepare(hf_models.build("gpt2"), keep_high_precision="lm_head")
    with pytest.raises(TypeError, match="'keep_high_precision'"):
        hf.prepare(hf_models.build("gpt2"), keep_high_precision=5)
    with pytest.raises(TypeError, match="'model'"):
        hf.prepare("gpt2")
    with pytest.raises(TypeError, match="fp8_recipe"):
        hf.prepare(hf_models.build("gpt2"), recipe="delayed")
    with pytest.raises(ValueError, match="'frozen_weights'"):
        hf.prepare(hf_models.build("gpt2"), frozen_weights="e4m3")


def test_prepare_stores_the_frozen_weights_of_the_converted_layers_in_fp8():
    model = hf_models.build("llama")
    model.requires_grad_(False)
    model.model.layers[1].mlp.requires_grad_(True)  # a trainable part stays as it is
    hf.prepare(model, frozen_weights="fp8")
    stored = sorted(name for name, p in model.named_parameters() if isinstance(p, fp8mp.nn.Fp8FrozenWeight))
    expected = sorted(f"model.layers.{i}.{m}.weight" for i in range(2) for m in FP8_MODULES["llama"]
                      if i == 0 or not m.startswith("mlp."))
    assert stored == expected  # not the LM head, which prepare keeps in high precision, nor the trainable MLP


@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_restores_a_prepared_model_bit_exactly(tmp_path, family, caplog):
    model = hf.prepare(hf_models.build(family))
    fp8_steps(model)
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    assert "UNEXPECTED" not in caplog.text  # transformers never sees the FP8 state
    assert hf.is_prepared(loaded) and fp8_module_names(loaded) == fp8_module_names(model)
    assert_same_state(loaded, model)
    model.eval(), loaded.eval()
    ids = torch.randint(0, hf_models.VOCAB, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_checkpoint_loads_into_a_plain_model_and_vice_versa(tmp_path, family, caplog):
    model = hf.prepare(hf_models.build(family))
    fp8_steps(model)
    model.save_pretrained(tmp_path / "fp8")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fp8")  # FP8 state unused
    assert fp8_module_names(plain) == []
    for key, value in plain.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key

    plain.save_pretrained(tmp_path / "plain")
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        fresh = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "plain")
    assert "start with fresh FP8 scaling state" in caplog.text
    metas = [m for m in fresh.modules() if isinstance(m, fp8mp.scaling.Fp8Meta)]
    assert metas and not any(m.is_initialized() for m in metas)
    for key, value in plain.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key]), key


def test_from_pretrained_bad_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="'directory'"):
        hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="holds no model.safetensors"):
        hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)


def write_bin_checkpoint(safetensors_dir, directory, shards: int) -> None:
    """The save_pretrained directory `safetensors_dir` rewritten as transformers' .bin layout (what
    `save_pretrained(safe_serialization=False)` wrote before transformers 5): pytorch_model.bin, or `shards`
    files pytorch_model-0000i-of-0000n.bin with pytorch_model.bin.index.json mapping each tensor to its file."""
    directory.mkdir()
    for name in ("config.json", "generation_config.json"):
        if (safetensors_dir / name).exists():
            (directory / name).write_bytes((safetensors_dir / name).read_bytes())
    state = safetensors_torch.load_file(safetensors_dir / "model.safetensors")
    if shards == 1:
        torch.save(state, directory / "pytorch_model.bin")
        return
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = keys[i::shards]
        torch.save({k: state[k] for k in part}, directory / name)
        weight_map.update(dict.fromkeys(part, name))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                        "weight_map": weight_map}))


def assert_loads_bit_exactly(model, directory, caplog) -> None:
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        loaded = hf.from_pretrained(transformers.AutoModelForCausalLM, directory)
    assert "UNEXPECTED" not in caplog.text and "MISSING" not in caplog.text
    assert hf.is_prepared(loaded) and fp8_module_names(loaded) == fp8_module_names(model)
    assert_same_state(loaded, model)
    model.eval(), loaded.eval()
    ids = torch.randint(0, hf_models.VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shards", [1, 3], ids=["one_file", "sharded"])
def test_from_pretrained_of_a_bin_checkpoint_restores_a_prepared_model_bit_exactly(tmp_path, family, shards, caplog):
    model = hf.prepare(hf_models.build(family))
    fp8_steps(model)
    model.save_pretrained(tmp_path / "safetensors")
    write_bin_checkpoint(tmp_path / "safetensors", tmp_path / "bin", shards)
    # transformers itself reads the layout (its weights, FP8 state unused): the files are a real .bin checkpoint.
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bin")
    for key, value in plain.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key
    assert_loads_bit_exactly(model, tmp_path / "bin", caplog)


@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_of_a_sharded_safetensors_checkpoint_restores_a_prepared_model_bit_exactly(tmp_path, family,
                                                                                                    caplog):
    model = hf.prepare(hf_models.build(family))
    fp8_steps(model)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (tmp_path / "model.safetensors").exists()
    assert any(".fp8_meta." in key for key in index["weight_map"])  # the FP8 state is in the shards
    assert_loads_bit_exactly(model, tmp_path, caplog)
