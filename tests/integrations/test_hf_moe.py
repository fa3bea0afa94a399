"""transformers mixture-of-experts models in FP8 through the "fp8mp" experts implementation (tiny configs, CPU, no
downloads): selection by prepare, FP8 forward near the BF16 model's, backward, interchangeable checkpoints, the
share of linear parameters in FP8, and registration without importing transformers."""
from __future__ import annotations

import copy
import subprocess
import sys
from unittest import mock

import pytest
import torch

import fp8mp
import hf_models  # noqa: F401  (HF_HUB_OFFLINE)

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("fp8mp.integrations.hf")
from fp8mp.integrations import hf_moe  # noqa: E402
from fp8mp.nn.fp8_state_dict import split_fp8_state  # noqa: E402
from fp8mp.scaling import block_grouped  # noqa: E402

VOCAB = 128


def moe_config(family: str):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, bos_token_id=0,
                  eos_token_id=0, pad_token_id=0)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                                           num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                           decoder_sparse_step=1, mlp_only_layers=[])
    if family == "mixtral":
        return transformers.MixtralConfig(**common, intermediate_size=32, num_key_value_heads=2, head_dim=16,
                                          num_local_experts=8, num_experts_per_tok=2)
    if family == "deepseek_v3":  # one dense layer, then routed experts beside a shared expert
        return transformers.DeepseekV3Config(**common, intermediate_size=128, moe_intermediate_size=32,
                                             first_k_dense_replace=1, num_key_value_heads=4, n_routed_experts=8,
                                             n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                                             q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                                             qk_rope_head_dim=16, v_head_dim=16)
    if family == "gpt_oss":  # experts stored transposed, with biases, gate and up interleaved
        return transformers.GptOssConfig(**common, intermediate_size=32, num_key_value_heads=2, head_dim=16,
                                         num_local_experts=8, num_experts_per_tok=2,
                                         layer_types=["sliding_attention", "full_attention"])
    if family == "olmoe":
        return transformers.OlmoeConfig(**common, intermediate_size=32, num_key_value_heads=4, num_experts=8,
                                        num_experts_per_tok=2)
    raise ValueError(family)


FAMILIES = ["qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss", "olmoe"]


def build(family: str, seed: int = 0, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(moe_config(family)).to(dtype)


def token_ids(seed: int = 1, batch: int = 2, seq: int = 24):
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def experts_modules(model):
    return [m for m in model.modules() if hasattr(m, "is_concatenated") and hasattr(m, "has_gate")]


def fp8_linear_share(model) -> float:
    """Share of the non-embedding, non-router linear parameters in FP8: nn.Linear weights and biases (the output
    embedding excluded) and experts' parameters, counted FP8 when in an fp8mp linear module or in experts that run
    the "fp8mp" implementation. Routers are neither (transformers' routers are not nn.Linear)."""
    head = model.get_output_embeddings()
    fp8_experts = model.config._experts_implementation == hf_moe.EXPERTS_IMPLEMENTATION
    total = fp8 = 0
    for module in model.modules():
        if module is head:
            continue
        if isinstance(module, torch.nn.Linear):
            count = sum(p.numel() for p in module.parameters(recurse=False))
            total += count
            fp8 += count if isinstance(module, (fp8mp.nn.Linear, fp8mp.nn.Conv1D)) else 0
        elif module in experts_modules(model):
            count = sum(p.numel() for p in module.parameters(recurse=False))
            total += count
            fp8 += count if fp8_experts and hf_moe._fp8_shapes(module) else 0
    return fp8 / total


@pytest.mark.parametrize("family", FAMILIES)
def test_prepare_selects_fp8_experts_and_forward_is_near_bf16(family):
    reference = build(family)
    model = hf.prepare(copy.deepcopy(reference))
    assert model.config._experts_implementation == "fp8mp"
    ids = token_ids()
    with torch.no_grad():
        expected = reference(input_ids=ids).logits.float()
        with mock.patch("fp8mp.integrations.hf_moe.meta_grouped_linear", wraps=hf_moe.meta_grouped_linear) as spy:
            got = model(input_ids=ids).logits.float()
    # Two grouped linears per MoE layer ran in FP8.
    moe_layers = len(experts_modules(model))
    assert spy.call_count == 2 * moe_layers and moe_layers >= 1
    # E4M3 rounds each operand by at most 2^-4 of itself, each product by < 2^-3, the logits' relative error
    # through two layers stays well under 2^-3 in norm (rounding errors of random sign average out); and the
    # FP8 model is not the BF16 one.
    rel = (got - expected).norm() / expected.norm()
    assert 0 < rel < 2 ** -3, rel


@pytest.mark.parametrize("family", FAMILIES)
def test_backward_gives_finite_gradients_to_every_expert_parameter(family):
    model = hf.prepare(build(family))
    ids = token_ids(batch=4, seq=32)
    model(input_ids=ids, labels=ids).loss.backward()
    for experts in experts_modules(model):
        for name, p in experts.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
            assert p.grad.dtype == p.dtype and p.grad.shape == p.shape


@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_weights_are_those_of_a_model_that_never_saw_fp8mp(family):
    plain = build(family)
    prepared = hf.prepare(build(family))
    weights, fp8_state = split_fp8_state(prepared.state_dict())
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in plain.state_dict().items()}
    # The experts add FP8 state only: their projections' Fp8Meta buffers, split off with every FP8 module's.
    experts_state = [key for key in fp8_state if ".experts." in key]
    assert experts_state and all(".fp8mp_" in key and ".fp8_meta." in key for key in experts_state)


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_save_pretrained_loads_into_a_plain_model_and_back(tmp_path, family):
    model = hf.prepare(build(family))
    ids = token_ids()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.save_pretrained(tmp_path / "fp8")
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fp8", dtype=torch.bfloat16)
    weights, _ = split_fp8_state(model.state_dict())
    for key, value in plain.state_dict().items():
        assert torch.equal(value, weights[key]), key
    plain.save_pretrained(tmp_path / "plain")
    back = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "plain", dtype=torch.bfloat16)
    assert back.config._experts_implementation == "fp8mp"
    for key, value in split_fp8_state(back.state_dict())[0].items():
        assert torch.equal(value, weights[key]), key


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_at_least_95_percent_of_linear_parameters_in_fp8(family):
    model = build(family)
    assert fp8_linear_share(model) == 0.0
    hf.prepare(model)
    assert fp8_linear_share(model) >= 0.95


def test_outside_fp8_autocast_the_experts_run_transformers_grouped_mm():
    model = build("qwen3_moe")
    hf_moe.select_fp8_experts(model)
    with mock.patch("fp8mp.integrations.hf_moe.meta_grouped_linear") as fp8_path:
        model(input_ids=token_ids())
    assert fp8_path.call_count == 0


@pytest.mark.parametrize("has_gate", [True, False])
@pytest.mark.parametrize("is_transposed", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
def test_every_flag_combination_matches_the_float64_experts(has_gate, is_transposed, has_bias):
    """A custom experts class through use_experts_implementation: the "fp8mp" forward against the eager loop in
    float64, for every flag; relative error in norm under the E4M3 bound of two roundings per product."""
    from transformers.integrations.moe import use_experts_implementation

    E, H, I = 4, 32, 16

    @use_experts_implementation(is_transposed=is_transposed, has_bias=has_bias, has_gate=has_gate)
    class Experts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = E
            first = 2 * I if has_gate else I
            shape = (lambda out, inp: (E, inp, out)) if is_transposed else (lambda out, inp: (E, out, inp))
            setattr(self, "gate_up_proj" if has_gate else "up_proj", torch.nn.Parameter(torch.randn(*shape(first, H))))
            self.down_proj = torch.nn.Parameter(torch.randn(*shape(H, I)) / 4)
            if has_bias:
                setattr(self, "gate_up_proj_bias" if has_gate else "up_proj_bias", torch.nn.Parameter(torch.randn(E, first)))
                self.down_proj_bias = torch.nn.Parameter(torch.randn(E, H))
            self.act_fn = torch.nn.functional.silu

        def forward(self, hidden_states, top_k_index, top_k_weights):  # eager: a loop over tokens' experts
            out = torch.zeros_like(hidden_states)
            first = self.gate_up_proj if has_gate else self.up_proj
            for t in range(hidden_states.shape[0]):
                for j in range(top_k_index.shape[1]):
                    e = int(top_k_index[t, j])
                    w1 = first[e].t() if is_transposed else first[e]
                    w2 = self.down_proj[e].t() if is_transposed else self.down_proj[e]
                    h = hidden_states[t] @ w1.t()
                    if has_bias:
                        h = h + (self.gate_up_proj_bias if has_gate else self.up_proj_bias)[e]
                    h = self._apply_gate(h[None])[0] if has_gate else self.act_fn(h)
                    h = h @ w2.t() + (self.down_proj_bias[e] if has_bias else 0)
                    out[t] += top_k_weights[t, j] * h
            return out

    torch.manual_seed(0)
    config = transformers.PretrainedConfig()
    experts = Experts(config)
    x = torch.randn(12, H)
    index = torch.stack([torch.randperm(E)[:2] for _ in range(12)])
    index[:, 0] = 1  # expert 1 takes every token; some experts none
    weights = torch.rand(12, 2)
    config._experts_implementation = "eager"
    x64 = x.double().requires_grad_()
    expected = copy.deepcopy(experts).double()(x64, index, weights.double())
    grad_out = torch.randn(12, H)
    expected.backward(grad_out.double())
    hf_moe.register()
    config._experts_implementation = "fp8mp"
    x = x.requires_grad_()
    with fp8mp.fp8_autocast():
        got = experts(x, index, weights)
    got.backward(grad_out)
    rel = (got.double() - expected).norm() / expected.norm()
    assert 0 < rel < 2 ** -3, rel
    # The input gradient sums each token's k experts' gradients; its bound adds E5M2's unit roundoff (2^-3) for the
    # gradients cast in both grouped GEMMs' backward to E4M3's for the weights (measured 0.07-0.10).
    rel_dx = (x.grad.double() - x64.grad).norm() / x64.grad.norm()
    assert 0 < rel_dx < 2 ** -2, rel_dx
    assert all(torch.isfinite(p.grad).all() for p in experts.parameters())


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_fp8mp_hf_does_not_import_transformers_and_registers_where_it_is():
    assert run_python("import sys, fp8mp.integrations.hf; print('transformers' in sys.modules)") == "False"
    assert run_python("import transformers, fp8mp.integrations.hf\n"
                      "from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS\n"
                      "print('fp8mp' in ALL_EXPERTS_FUNCTIONS)") == "True"


FINE_GRAINED = [fp8mp.recipe.RowwiseScaling(), fp8mp.recipe.BlockScaling(), fp8mp.recipe.MXFP8Scaling()]


@pytest.mark.parametrize("recipe", FINE_GRAINED, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("family", FAMILIES)
def test_fine_grained_recipes_forward_near_bf16_and_backward_finite(family, recipe):
    reference = build(family)
    model = hf.prepare(copy.deepcopy(reference), recipe=recipe)
    ids = token_ids()
    with torch.no_grad():
        expected = reference(input_ids=ids).logits.float()
    with mock.patch("fp8mp.scaling.block_grouped.block_scaled_grouped_gemm",
                    wraps=block_grouped.block_scaled_grouped_gemm) as spy:
        out = model(input_ids=ids, labels=ids)
    moe_layers = len(experts_modules(model))
    assert spy.call_count == 2 * moe_layers and moe_layers >= 1  # every expert projection in block-scaled FP8
    got = out.logits.float()
    # Block scales round each operand by at most 2^-4 of its block's largest value (E4M3): near the BF16 model
    # under the same bound as the per-tensor recipes, and not equal to it.
    rel = (got - expected).norm() / expected.norm()
    assert 0 < rel < 2 ** -3, rel
    out.loss.backward()
    for experts in experts_modules(model):
        for name, p in experts.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_a_nonfinite_expert_gradient_is_caught_by_the_loss_scaler_and_the_fallback_policy():
    from fp8mp.training import fp8_cast_check

    model = hf.prepare(build("qwen3_moe"), recipe=fp8mp.recipe.CurrentScaling())
    experts = experts_modules(model)[0]
    down = experts.fp8mp_down_proj
    assert isinstance(down, fp8mp.nn.Fp8Module)
    monitor = fp8mp.monitor.attach(model)
    assert any(name.endswith("experts.fp8mp_down_proj") for name in monitor.layers)

    def poison(module, args, output):  # an Inf in the gradient that reaches this layer's down projection
        def hook(grad):
            grad = grad.clone()
            grad[0, 0] = float("inf")
            return grad
        output.register_hook(hook)

    handle = experts.register_forward_hook(poison)
    scaler = fp8mp.LossScaler()
    fp8_cast_check.forget()
    ids = token_ids()
    scaler.scale(model(input_ids=ids, labels=ids).loss).backward()
    handle.remove()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler.step(optimizer)
    scaler.update()
    found = scaler.nonfinite_fp8_casts
    assert [f.module for f in found if f.module is down] == [down]
    assert "grad_output" in next(f for f in found if f.module is down).tensors
    policy = fp8mp.fallback.FallbackPolicy(max_bad_steps=1)
    policy.step(model, nonfinite_layers=[n for n, m in model.named_modules() if any(f.module is m for f in found)])
    assert down.fp8_fallback


def test_prepare_pins_its_recipe_on_the_experts_projections_before_any_forward():
    recipe = fp8mp.recipe.DelayedScaling(amax_history_len=7)
    model = hf.prepare(build("qwen3_moe"), recipe=recipe)
    projections = [m for m in model.modules() if isinstance(m, hf_moe.ExpertsProjectionFp8)]
    assert projections and all(p.fp8_recipe is recipe for p in projections)
    assert all(p.fp8_meta.amax_history.shape[0] == 7 for p in projections)  # shaped for it before any load
    unpinned = hf.prepare(build("qwen3_moe"))
    assert all(m.fp8_recipe is None for m in unpinned.modules() if isinstance(m, hf_moe.ExpertsProjectionFp8))
