"""Hugging Face PEFT LoRA on a transformers Llama whose frozen base is stored in FP8 by
`fp8mp.convert(model, frozen_weights="fp8")`: one byte a base parameter, adapters train, checkpoints
hold the adapters only, merging needs the base decoded first."""
from __future__ import annotations

import peft  # pinned in requirements-test.txt
import pytest
import safetensors.torch
import torch
import transformers

import fp8mp
from fp8mp.nn import Fp8FrozenWeight, decode_frozen_weights, tensor_bytes

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
E4M3_HALF_ULP = 2.0 ** -4      # relative rounding error bound of a normal E4M3 value (3 mantissa bits)
E4M3_SUBNORMAL_HALF_STEP = 2.0 ** -10  # absolute bound, in units of the scale_inv, below E4M3's smallest normal


def tiny_llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def converted_peft_llama(seed: int = 0):
    """(peft model over a converted FP8-frozen Llama, an unconverted copy of the base)."""
    reference = tiny_llama(seed)
    model = tiny_llama(seed)
    model.requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    config = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS)
    return peft.get_peft_model(model, config), reference


def base_weights(model):
    return {name: p for name, p in model.named_parameters() if isinstance(p, Fp8FrozenWeight)}


def test_base_is_one_byte_a_parameter_and_adapters_are_float():
    model, reference = converted_peft_llama()
    frozen = base_weights(model)
    # every Linear of the decoder layers plus the LM head; embeddings and norms stay
    assert len(frozen) == 2 * len(TARGETS) + 1
    numel = sum(p.numel() for p in frozen.values())
    assert tensor_bytes(frozen.values()) / numel <= 1.01
    assert tensor_bytes(frozen.values()) == numel + 4 * len(frozen)
    adapters = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    assert all(p.dtype == torch.float32 for p in adapters.values())  # the base's reported dtype, not float8
    assert type(model.base_model.model.model.embed_tokens.weight) is torch.nn.Parameter


def test_every_base_layer_output_is_within_e4m3_rounding_of_the_unconverted_one():
    model, reference = converted_peft_llama()
    captured = {}
    hooks = [module.register_forward_hook(lambda m, args, out, name=name: captured.__setitem__(name, (args[0], out)))
             for name, module in model.base_model.model.named_modules()
             if isinstance(module._parameters.get("weight"), Fp8FrozenWeight)]  # the layers, not PEFT's wrappers
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    ref_modules = dict(reference.named_modules())
    assert len(captured) == 2 * len(TARGETS) + 1
    for name, (x, out) in captured.items():
        weight = ref_modules[name.replace(".base_layer", "")].weight.detach().double()
        stored = dict(model.base_model.model.named_modules())[name].weight
        x = x.double()
        exact = x @ weight.T
        # |W - decode(W)| <= |W| 2^-4 + scale_inv 2^-10 elementwise; the fp32 GEMM adds K eps |x| |W|
        weight_error = weight.abs() * E4M3_HALF_ULP + stored.scale_inv.double() * E4M3_SUBNORMAL_HALF_STEP
        assert bool(((stored.decode(torch.float64) - weight).abs() <= weight_error).all()), name
        gemm_slack = x.shape[-1] * torch.finfo(torch.float32).eps * (x.abs() @ weight.abs().T) * 2
        bound = x.abs() @ weight_error.T + gemm_slack
        assert bool(((out.double() - exact).abs() <= bound).all()), name
        assert bool((out.double() - exact).abs().max() > 0), name  # the base did run on the decoded FP8 weight


@pytest.mark.parametrize("fp8", [True, False])
def test_lora_trains_and_only_adapters_change(fp8):
    model, _ = converted_peft_llama()
    before = {k: (v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v).clone()
              for k, v in model.state_dict().items() if "lora_" not in k}
    adapters = [p for p in model.parameters() if p.requires_grad]
    adapters_before = [p.detach().clone() for p in adapters]
    optimizer = torch.optim.AdamW(adapters, lr=1e-2)
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(2))
    losses = []
    for _ in range(6):
        with fp8mp.fp8_autocast(enabled=fp8):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is None for p in base_weights(model).values())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses
    after = model.state_dict()
    for key, value in before.items():
        if ".fp8_meta." in key:  # the FP8 scaling state is updated by every FP8 forward
            continue
        now = after[key].view(torch.uint8) if after[key].dtype == torch.float8_e4m3fn else after[key]
        assert torch.equal(now, value), key
    assert all(not torch.equal(a, b) for a, b in zip(adapters, adapters_before) if a.abs().sum() > 0)


def test_save_pretrained_holds_the_adapters_only_and_loads_onto_a_converted_base(tmp_path):
    model, _ = converted_peft_llama()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)  # non-zero adapters, so that loading them changes the output
    model.save_pretrained(tmp_path)
    saved = safetensors.torch.load_file(tmp_path / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved)
    base = tiny_llama()
    base.requires_grad_(False)
    fp8mp.convert(base, frozen_weights="fp8")
    loaded = peft.PeftModel.from_pretrained(base, tmp_path)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert len(base_weights(loaded)) == 2 * len(TARGETS) + 1


def test_merge_needs_the_base_decoded_first():
    model, _ = converted_peft_llama()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    with pytest.raises(RuntimeError, match="decode_frozen_weights"):
        model.merge_and_unload()
    model, _ = converted_peft_llama()
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    decode_frozen_weights(model)
    merged = model.merge_and_unload()
    assert not any(isinstance(p, Fp8FrozenWeight) for p in merged.parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_bf16_base_stays_one_byte_a_parameter_through_to_dtype():
    model, _ = converted_peft_llama()
    model.to(torch.bfloat16)
    frozen = base_weights(model)
    assert all(p.dtype == torch.bfloat16 for p in frozen.values())
    assert tensor_bytes(frozen.values()) / sum(p.numel() for p in frozen.values()) <= 1.01
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    with fp8mp.fp8_autocast():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_mixture_of_experts_weights_are_stored_per_expert_and_the_model_runs():
    torch.manual_seed(6)
    config = transformers.Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=32)
    model = transformers.Qwen3MoeForCausalLM(config)
    reference = transformers.Qwen3MoeForCausalLM(config)
    reference.load_state_dict(model.state_dict())
    model.requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    experts = model.model.layers[0].mlp.experts
    ref_experts = reference.model.layers[0].mlp.experts
    for name in ("gate_up_proj", "down_proj"):
        stored, weight = getattr(experts, name), getattr(ref_experts, name).detach().double()
        assert type(stored) is Fp8FrozenWeight and stored.scale_inv.shape == (4,)
        per_expert = stored.scale_inv.double().reshape(-1, 1, 1)
        bound = weight.abs() * E4M3_HALF_ULP + per_expert * E4M3_SUBNORMAL_HALF_STEP
        assert bool(((stored.decode(torch.float64) - weight).abs() <= bound).all()), name
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
        for fp8 in (False, True):
            with fp8mp.fp8_autocast(enabled=fp8):
                logits = model(input_ids=ids).logits
            assert logits.shape == expected.shape and bool(torch.isfinite(logits).all())
            assert float((logits - expected).abs().max()) < 0.1 * float(expected.abs().max())
