"""A model trained the memory-lean way (bf16 nn.Parameters, fp8mp.nn layers under fp8_autocast, fp8mp.optim.AdamW with
FP8 states) keeps ordinary parameters: init functions, weight tying, code that reads `.weight`, Hugging Face
post_init / save_pretrained / from_pretrained and state_dict sizes work as on any bf16 model, and the training state
stays within 6.2 bytes a parameter."""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import fp8mp  # noqa: E402
from gpt_model import GPT, GPTConfig, _init_weights  # noqa: E402

TINY_GPT = GPTConfig(n_layers=2, d_model=64, n_heads=2, context=32)


def lean_gpt(config: GPTConfig = TINY_GPT) -> GPT:
    torch.manual_seed(0)
    return GPT(config).to(torch.bfloat16)


def train_steps(model, loss_of, optimizer, steps: int = 3, batch: tuple[int, int] = (2, 32), vocab: int = 256) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(vocab, batch, generator=gen)
        with fp8mp.fp8_autocast():
            loss = loss_of(model, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def gpt_loss(model, ids):
    return model(ids, ids)[1]


def fp8_adamw(model) -> fp8mp.optim.AdamW:
    return fp8mp.optim.AdamW(model.parameters(), lr=1e-2, state_dtype=torch.float8_e4m3fn)


def test_weights_stay_bf16_parameters_updated_in_place_and_readable():
    model = lean_gpt()
    linear = model.blocks[0].mlp.fc
    weight, before = linear.weight, linear.weight.detach().clone()
    train_steps(model, gpt_loss, fp8_adamw(model))
    assert all(type(p) is torch.nn.Parameter and p.dtype == torch.bfloat16 for p in model.parameters())
    assert linear.weight is weight and not torch.equal(weight, before)  # the same Parameter, updated in place
    # code that reads .weight sees a plain bf16 tensor of the layer's shape, usable in torch ops
    assert linear.weight.shape == (4 * TINY_GPT.d_model, TINY_GPT.d_model) and linear.in_features == TINY_GPT.d_model
    x = torch.randn(3, TINY_GPT.d_model, dtype=torch.bfloat16)
    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))


def test_init_functions_and_the_demo_gpts_init_work_on_the_bf16_weights():
    model = lean_gpt()
    train_steps(model, gpt_loss, fp8_adamw(model), steps=1)
    linear = model.blocks[0].attn.qkv
    torch.nn.init.zeros_(linear.bias)
    torch.nn.init.xavier_uniform_(linear.weight)
    bound = math.sqrt(6 / (linear.in_features + linear.out_features))
    assert linear.weight.abs().max() <= bound and linear.weight.std() > bound / 4
    torch.nn.init.kaiming_normal_(model.blocks[1].mlp.proj.weight)
    model.apply(_init_weights)  # GPT-2's N(0, 0.02), on every Linear and Embedding
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            assert module.weight.dtype == torch.bfloat16 and abs(module.weight.float().std().item() - 0.02) < 0.004
    assert float(linear.bias.detach().abs().max()) == 0.0
    train_steps(model, gpt_loss, fp8_adamw(model), steps=1)  # and it trains on from there


def test_the_tied_lm_head_is_the_embedding_one_parameter_with_one_state():
    model = lean_gpt()
    optimizer = fp8_adamw(model)
    train_steps(model, gpt_loss, optimizer)
    embedding = model.tok_emb.weight
    assert sum(p is embedding for p in model.parameters()) == 1 and embedding in optimizer.state
    # the LM head reads the trained embedding: the logits are F.linear of the final norm by tok_emb.weight
    ids = torch.randint(256, (1, 8))
    with torch.no_grad():
        logits, _ = model(ids)
        x = model.tok_emb(ids) + model.pos_emb(torch.arange(8))
        for block in model.blocks:
            x = block(x)
        torch.testing.assert_close(logits, torch.nn.functional.linear(model.norm_f(x), embedding))


def state_bytes_per_parameter(model, optimizer) -> float:
    numel = sum(p.numel() for p in model.parameters())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    return (params + grads + optimizer.state_bytes()) / numel


def test_training_state_is_within_6_2_bytes_a_parameter_and_the_state_dict_holds_two_bytes_a_weight():
    model = lean_gpt(GPTConfig())  # the demo's default GPT: 4 layers, d_model 256
    optimizer = fp8_adamw(model)
    train_steps(model, gpt_loss, optimizer, steps=1, batch=(2, 16))
    ids = torch.randint(256, (2, 16))
    with fp8mp.fp8_autocast():
        gpt_loss(model, ids).backward()  # gradients present, as during a step
    per_param = state_bytes_per_parameter(model, optimizer)
    # 2 (bf16 parameter) + 2 (bf16 gradient) + 2 x (1 + 4/128) (two E4M3 states and their scales) = 6.06, plus the
    # per-tensor step and seed counters and the small tensors' partial scale blocks
    assert 6.06 <= per_param <= 6.2, per_param
    state = model.state_dict()
    weights = {k: v for k, v in state.items() if "fp8_meta" not in k}
    assert all(v.dtype == torch.bfloat16 for v in weights.values())
    assert sum(v.numel() * v.element_size() for v in weights.values()) == 2 * sum(p.numel() for p in model.parameters())


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=128, vocab_size=256, tie_word_embeddings=True,
                                      max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers, transformers.LlamaForCausalLM(config)


def test_hugging_face_llama_post_init_save_pretrained_and_from_pretrained_round_trip(tmp_path):
    import fp8mp.integrations.hf as fp8_hf

    transformers, model = tiny_llama()
    fp8_hf.prepare(model)
    model.to(torch.bfloat16)
    model.post_init()  # transformers' own init over the converted, bf16 model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, after conversion and the cast
    assert isinstance(model.model.layers[0].mlp.up_proj, fp8mp.nn.Linear)
    optimizer = fp8_adamw(model)
    train_steps(model, lambda m, ids: m(input_ids=ids, labels=ids).loss, optimizer)
    assert all(type(p) is torch.nn.Parameter and p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)

    expected = {k: v for k, v in model.state_dict().items() if "fp8_meta" not in k}
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    loaded = plain.state_dict()
    for name, value in expected.items():
        assert loaded[name].dtype == torch.bfloat16 and torch.equal(loaded[name], value), name
    restored = fp8_hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path)
    for name, value in model.state_dict().items():  # FP8 scaling state included
        assert torch.equal(restored.state_dict()[name], value), name
    # Non-persistent buffers are no checkpoint's: transformers computes the rotary embedding's inv_freq afresh at
    # load (fp32 under some torch versions), where model.to(bfloat16) cast the trained model's. The comparison is
    # about what the checkpoint holds, so the restored model takes the trained one's.
    persistent = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name not in persistent:
            owner, _, attr = name.rpartition(".")
            restored.get_submodule(owner).register_buffer(attr, buffer.clone(), persistent=False)
    ids = torch.randint(256, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(restored(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
