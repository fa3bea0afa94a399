"""fp8mp.integrations.hf.use_fp8_saved_activations on tiny Llama / Mistral / Qwen2 / Qwen3 models: the model's own
forward bit for bit, gradients near its own, the bytes each MLP and attention layer saves (FP8 gate, up, q, k, v and
nothing else), training parity of the memory-lean recipe on a tiny Llama, restore, and what it refuses."""
from __future__ import annotations

import copy

import pytest
import torch

from fp8mp.memory.saved_tensors import saved_tensor_bytes

transformers = pytest.importorskip("transformers")

import fp8mp  # noqa: E402
import fp8mp.integrations.hf as fp8_hf  # noqa: E402
from hf_models import RandomWalks  # noqa: E402

FP8_BYTES_PER_ELEMENT = 1 + 4 / 128
BATCH, SEQ = 2, 32
SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
             vocab_size=256, max_position_embeddings=SEQ, attn_implementation="sdpa")
FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}


def tiny(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    config = getattr(transformers, FAMILIES[family])(**{**SHAPE, **overrides})
    return transformers.AutoModelForCausalLM.from_config(config)


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(SHAPE["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def loss_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_forward_bits_gradients_near_and_restore(family):
    model = tiny(family)
    x = ids()
    plain_loss, plain_grads = loss_and_grads(model, x)
    fp8_hf.use_fp8_saved_activations(model)
    assert fp8_hf.uses_fp8_saved_activations(model) and model.config._attn_implementation == "fp8mp_sdpa"
    assert all("forward" in vars(layer.mlp) for layer in model.model.layers)
    loss, grads = loss_and_grads(model, x)
    assert torch.equal(loss, plain_loss)  # the forward is the model's own, bit for bit
    for name, grad in grads.items():
        # Each saved element is within 2^-4 of itself (a relative error of rms 2^-4 / sqrt(3) = 3.6% where it is
        # uniform); a gradient passes a few such roundings (the per-op bounds are in tests/memory/test_fp8_recompute.py).
        error = (grad - plain_grads[name]).norm() / plain_grads[name].norm()
        assert error <= 2 * 2.0**-4, (name, error.item())
    assert any((grad != plain_grads[name]).any() for name, grad in grads.items())  # FP8 was used
    fp8_hf.restore_saved_activations(model)
    assert model.config._attn_implementation == "sdpa" and not fp8_hf.uses_fp8_saved_activations(model)
    again_loss, again_grads = loss_and_grads(model, x)
    assert torch.equal(again_loss, plain_loss)
    assert all(torch.equal(again_grads[name], g) for name, g in plain_grads.items())


def test_each_layer_saves_fp8_gate_up_and_q_k_v_and_nothing_else():
    model = tiny("llama")
    names = {id(m): name for name, m in model.named_modules()}
    x = ids()

    def by_module():
        return saved_tensor_bytes(lambda: model(input_ids=x, labels=x).loss, model, lambda m: names.get(id(m)))

    before = by_module()
    fp8_hf.use_fp8_saved_activations(model)
    after = by_module()
    tokens, inter, head_dim = BATCH * SEQ, SHAPE["intermediate_size"], SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    q_numel, kv_numel = tokens * SHAPE["num_attention_heads"] * head_dim, tokens * SHAPE["num_key_value_heads"] * head_dim
    for layer in ("model.layers.1",):  # layer 0's attention also first saves the rotary cos and sin that all share
        # the MLP: gate and up in FP8 (fp32 before: the activation's input, act(gate) and up)
        assert before[f"{layer}.mlp"] == 2 * tokens * inter * 4
        assert before[f"{layer}.mlp.act_fn"] == tokens * inter * 4
        assert after[f"{layer}.mlp"] == 2 * tokens * inter * FP8_BYTES_PER_ELEMENT
        assert after.get(f"{layer}.mlp.act_fn", 0) == 0
        # attention: q, k and v (before the key-value heads are repeated) in FP8, no output or log-sum-exp
        assert after[f"{layer}.self_attn"] == (q_numel + 2 * kv_numel) * FP8_BYTES_PER_ELEMENT
        assert before[f"{layer}.self_attn"] > (q_numel * 2 + kv_numel * 2) * 4
    # the Linear layers save what they saved (the norms now save bf16: enable_fp8_saved_activations); k_proj's and
    # up_proj's input is q_proj's and gate_proj's, counted there, and o_proj's was SDPA's output, counted in self_attn
    projections = [name for name in before if name.startswith("model.layers.1") and name.endswith("_proj")]
    assert len(projections) == 3 and all(after[name] == before[name] for name in projections)


def test_memory_lean_training_parity_on_a_tiny_llama():
    """bf16 parameters, FP8 Linears, FP8 AdamW states, FP8-saved activations and bf16-saved norms, with and without the
    FP8-saved MLP multiply and attention: the same batches give losses within half a percent at every step."""
    data = torch.utils.data.DataLoader(RandomWalks(12 * 8, seed=3), batch_size=8)
    curves = []
    for lever in (False, True):
        torch.manual_seed(0)
        model = tiny("llama", intermediate_size=128)
        model = fp8mp.convert(model, module_filter=lambda n, m: m is not model.lm_head, fp8_saved_activations=True)
        model = model.to(torch.bfloat16)
        if lever:
            fp8_hf.use_fp8_saved_activations(model)
        optimizer = fp8mp.optim.AdamW(model.parameters(), lr=3e-3, state_dtype=torch.float8_e4m3fn)
        losses = []
        for batch in data:
            with fp8mp.fp8_autocast():
                loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        curves.append(torch.tensor(losses))
    plain, lean = curves
    assert plain[-1] < 0.9 * plain[0]  # it learns
    assert ((lean - plain).abs() / plain).max() <= 0.005
    assert abs(lean[-5:].mean() / plain[-5:].mean() - 1) <= 0.003


def test_refusals_name_what_is_wrong():
    with pytest.raises(TypeError, match="argument 'model'"):
        fp8_hf.use_fp8_saved_activations("model")
    with pytest.raises(ValueError, match="'sdpa' attention"):
        fp8_hf.use_fp8_saved_activations(tiny("llama", attn_implementation="eager"))
    model = fp8_hf.use_fp8_saved_activations(tiny("llama", attention_dropout=0.1))
    with pytest.raises(RuntimeError, match="already"):
        fp8_hf.use_fp8_saved_activations(model)
    model.train()
    with pytest.raises(ValueError, match="attention dropout"):
        model(input_ids=ids(), labels=ids())
    model.eval()  # no dropout in evaluation
    assert torch.isfinite(model(input_ids=ids(), labels=ids()).loss)
    with pytest.raises(RuntimeError, match="does not store"):
        fp8_hf.restore_saved_activations(copy.deepcopy(fp8_hf.restore_saved_activations(model)))


def test_save_pretrained_writes_a_config_that_plain_transformers_loads(tmp_path):
    model = fp8_hf.use_fp8_saved_activations(tiny("llama"))
    model.save_pretrained(tmp_path)
    assert "fp8mp" not in (tmp_path / "config.json").read_text()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == "sdpa"
    x = ids()
    assert torch.equal(loaded(input_ids=x).logits, model(input_ids=x).logits)
