"""FP8 weight storage under the fine-grained recipes: the stored weight carries its block scales.

The stored codes and scales are checked against the independent references (torchao's rowwise
scaling and to_mx, the plain-PyTorch DeepSeek-V3 quantizer), at creation and after every
optimizer step; checkpoints (torch.save, safetensors) round-trip them and training resumes
bit for bit; LoRA bases store them too.
"""
from __future__ import annotations

import copy

import pytest
import torch

import fp8mp
import torchao_reference
from blockwise_reference import deepseek_quantize, expand_tiles
from fp8mp.nn.lora import apply_lora
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, Format, MXFP8Scaling, RowwiseScaling
from fp8mp.optim.master_weights import MasterWeightOptimizer

# MasterWeightOptimizer is deprecated; its behaviour is still tested here (the warning: test_fp8_weights.py)
pytestmark = pytest.mark.filterwarnings("ignore:fp8mp.optim.MasterWeightOptimizer is deprecated:FutureWarning")

E4M3 = torch.float8_e4m3fn
RECIPES = [RowwiseScaling(), RowwiseScaling(power_of_2_scales=False), BlockScaling(), BlockScaling(power_of_2_scales=True),
           MXFP8Scaling(), MXFP8Scaling("floor")]
IDS = ["rowwise", "rowwise-fp32", "block", "block-pow2", "mx-rceil", "mx-floor"]
# Shapes: not multiples of 128 for BlockScaling (partial weight blocks); multiples of 32 for to_mx.
SHAPES = {RowwiseScaling: (72, 200), BlockScaling: (136, 200), MXFP8Scaling: (96, 160)}  # (N, K)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def reference_quantize(w: torch.Tensor, recipe) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale_inv) of w [R, C] quantized along C as `recipe` quantizes a weight, by an independent reference."""
    w = w.detach()
    if isinstance(recipe, RowwiseScaling):
        data, scale = torchao_reference.rowwise(w, E4M3, recipe.power_of_2_scales)
        return data, scale.reciprocal()
    if isinstance(recipe, BlockScaling):
        return deepseek_quantize(w, 128, 128, E4M3, recipe.power_of_2_scales)
    scale, data = torchao_reference.to_mx(w.contiguous(), E4M3, 32, recipe.scale_mode)
    return data, scale.reshape(w.shape[0], w.shape[1] // 32)


def assert_stores_the_reference_quantization_of(layer, w: torch.Tensor, recipe) -> None:
    data, scale_inv = reference_quantize(w, recipe)
    assert torch.equal(bits(layer.weight_fp8), bits(data))
    assert layer.weight_scale_inv.dtype == scale_inv.dtype and torch.equal(bits(layer.weight_scale_inv), bits(scale_inv))
    if isinstance(recipe, BlockScaling):  # square blocks: W.T's quantization is the transpose, nothing more is stored
        assert not hasattr(layer, "weight_fp8_t")
        return
    data_t, scale_inv_t = reference_quantize(w.t(), recipe)
    assert torch.equal(bits(layer.weight_fp8_t), bits(data_t))
    assert torch.equal(bits(layer.weight_scale_inv_t), bits(scale_inv_t))


def make_layer(recipe, seed=0, bias=True):
    n, k = SHAPES[type(recipe)]
    torch.manual_seed(seed)
    init = torch.nn.Linear(k, n, bias=bias)
    with fp8mp.fp8_model_init(recipe=recipe):
        layer = fp8mp.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.quantize_weight_from(init.weight)
        if bias:
            layer.bias.copy_(init.bias)
    return init, layer


def train_step(layer, optimizer, recipe, x):
    optimizer.zero_grad()
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        loss = layer(x).square().mean()
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_stored_weight_is_the_reference_quantization_of_the_master_after_every_step(recipe):
    init, layer = make_layer(recipe)
    assert_stores_the_reference_quantization_of(layer, init.weight, recipe)
    optimizer = MasterWeightOptimizer(lambda p: torch.optim.AdamW(p, lr=1e-2), layer)
    master = optimizer.masters[0]
    for step in range(3):
        before = master.detach().clone()
        train_step(layer, optimizer, recipe, torch.randn(16, layer.in_features) * (step + 1))
        assert not torch.equal(master, before)
        assert_stores_the_reference_quantization_of(layer, master, recipe)


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=IDS[::2])
def test_stored_layer_computes_what_a_high_precision_layer_with_the_master_weight_computes(recipe):
    """Forward and both gradients, bit for bit: the stored weight is the forward's own quantization of the master."""
    _, stored = make_layer(recipe)
    optimizer = MasterWeightOptimizer(lambda p: torch.optim.SGD(p, lr=0.1), stored)
    train_step(stored, optimizer, recipe, torch.randn(8, stored.in_features))
    optimizer.zero_grad()
    master = optimizer.masters[0]
    plain = fp8mp.nn.Linear(stored.in_features, stored.out_features)
    with torch.no_grad():
        plain.weight.copy_(master)
        plain.bias.copy_(stored.bias)
    x, grad = torch.randn(3, 11, stored.in_features), torch.randn(3, 11, stored.out_features)
    outs, input_grads = [], []
    for layer in (stored, plain):
        xi = x.clone().requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = layer(xi)
        out.backward(grad)
        outs.append(out)
        input_grads.append(xi.grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(input_grads[0], input_grads[1])
    assert torch.equal(master.grad, plain.weight.grad) and torch.equal(stored.bias.grad, plain.bias.grad)


def test_forward_reads_the_stored_bytes():
    recipe = MXFP8Scaling()
    _, layer = make_layer(recipe, bias=False)
    layer.eval()
    with torch.no_grad():  # codes no quantization of any master gives: the forward must read them as they are
        layer.weight_fp8.copy_(torch.randint(-40, 41, layer.weight_fp8.shape).float().to(E4M3))
    x = torch.randint(-6, 7, (5, layer.in_features)).float()  # integers: chunk sums exact, any order
    with fp8mp.fp8_autocast(fp8_recipe=recipe), torch.no_grad():
        out = layer(x)
    sx, xq = torchao_reference.to_mx(x, E4M3, 32, "rceil")
    w = layer.weight_fp8.float() * expand_tiles(layer.weight_scale_inv.float(), 1, 32, layer.weight_fp8.shape)
    xd = xq.float() * expand_tiles(sx.reshape(5, -1).float(), 1, 32, x.shape)
    assert torch.equal(out, xd @ w.T)


@pytest.mark.parametrize("recipe", RECIPES[::2], ids=IDS[::2])
def test_decoding_masters_and_dtype_conversion_keep_the_block_scales(recipe):
    _, layer = make_layer(recipe)
    blocks = (128, 128) if isinstance(recipe, BlockScaling) else (1, 32 if isinstance(recipe, MXFP8Scaling) else layer.in_features)
    expected = layer.weight_fp8.float() * expand_tiles(layer.weight_scale_inv.float(), *blocks, layer.weight_fp8.shape)
    assert torch.equal(layer.decode_stored_weight(torch.float32), expected)
    optimizer = MasterWeightOptimizer(lambda p: torch.optim.SGD(p, lr=0.1), layer)
    assert torch.equal(optimizer.masters[0], expected)  # the masters start as the decoded weights
    x = torch.randn(4, layer.in_features)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, expected, layer.bias))  # outside fp8_autocast
    before = {k: bits(v).clone() for k, v in layer.state_dict().items() if k.startswith("weight")}
    layer.bfloat16()
    after = layer.state_dict()
    assert all(after[k].dtype == layer._buffers[k].dtype and torch.equal(bits(after[k]), v) for k, v in before.items())
    assert layer.bias.dtype == torch.bfloat16


def test_a_recipe_of_another_weight_layout_is_refused_naming_both():
    _, block_layer = make_layer(BlockScaling())
    x = torch.randn(2, block_layer.in_features)
    with pytest.raises(RuntimeError, match=r"stored for BlockScaling \(128 x 128 blocks.*runs under MXFP8Scaling.*"
                                           r"fp8_model_init\(recipe=\.\.\.\)"):
        with fp8mp.fp8_autocast(fp8_recipe=MXFP8Scaling()), torch.no_grad():
            block_layer.eval()(x)
    with pytest.raises(RuntimeError, match="stored for BlockScaling .* runs under CurrentScaling, which needs one per-tensor"):
        with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()), torch.no_grad():
            block_layer(x)
    with pytest.raises(RuntimeError, match="'fp32'.* runs under BlockScaling, which needs BlockScaling .*'pow2'"):
        with fp8mp.fp8_autocast(fp8_recipe=BlockScaling(power_of_2_scales=True)), torch.no_grad():
            block_layer(x)
    with fp8mp.fp8_autocast(fp8_recipe=BlockScaling(fp8_format=Format.HYBRID)), torch.no_grad():
        block_layer(x)  # E5M2 gradients: the weight's layout (E4M3 forward) is the same
    with pytest.raises(TypeError, match="'recipe'"):
        with fp8mp.fp8_model_init(recipe="block"):
            pass


def test_weight_bytes_are_those_of_the_stored_layouts():
    for recipe, ratio in ((BlockScaling(), 0.25), (MXFP8Scaling(), 0.5), (RowwiseScaling(), 0.5)):
        with fp8mp.fp8_model_init(recipe=recipe):
            layer = fp8mp.nn.Linear(512, 256, bias=False)
        fp32_bytes = 512 * 256 * 4
        assert fp32_bytes * ratio < fp8mp.nn.fp8_state_dict.state_dict_bytes(layer) < fp32_bytes * (ratio + 0.02)


# ------------------------------------------------------------------------------------------ LoRA
@pytest.mark.parametrize("recipe", RECIPES[::2], ids=IDS[::2])
@pytest.mark.parametrize("how", ["argument", "convert"])
def test_lora_bases_store_block_scales_and_stay_bit_identical(recipe, how):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(160, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
    if how == "argument":
        model = fp8mp.convert(model)
        apply_lora(model, rank=4, alpha=8.0, targets=["0", "2"], fp8_base_weight=True, fp8_base_recipe=recipe)
    else:  # the recipe convert pinned on each layer
        model = fp8mp.convert(model, recipe=recipe)
        apply_lora(model, rank=4, alpha=8.0, targets=["0", "2"], fp8_base_weight=True)
    base = model[0].base
    assert base.stores_fp8_weight and base.fp8_weight_layout == fp8mp.quantized.stored_weight.stored_weight_layout(recipe)
    frozen = {k: bits(v).clone() for k, v in model.state_dict().items() if k.startswith(("0.base.weight", "2.base.weight"))}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = model(torch.randn(8, 160)).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.equal(bits(model.state_dict()[k]), v) for k, v in frozen.items())
    assert model[0].lora_B.abs().sum() > 0 and base.weight is None


# ------------------------------------------------------------------------------------ checkpoints
def save_torch(state, path):
    torch.save(state, path / "model.pt")
    return torch.load(path / "model.pt", weights_only=True)


def save_safetensors(state, path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file(state, path / "model.safetensors")
    return safetensors_torch.load_file(path / "model.safetensors")


def build_model(recipe, seed):
    torch.manual_seed(seed)
    with fp8mp.fp8_model_init(recipe=recipe):
        return torch.nn.Sequential(fp8mp.nn.Linear(160, 136), torch.nn.GELU(), fp8mp.nn.Linear(136, 64))


def train(model, optimizer, recipe, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 160, generator=gen), torch.randn(8, 64, generator=gen)
        optimizer.zero_grad()
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("save", [save_torch, save_safetensors], ids=["torch_save_weights_only", "safetensors"])
@pytest.mark.parametrize("recipe", [RowwiseScaling(), BlockScaling(), MXFP8Scaling()], ids=["rowwise", "block", "mxfp8"])
def test_checkpoint_round_trips_the_block_scales_and_training_resumes(tmp_path, save, recipe):
    adam = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    model = build_model(recipe, 0)
    optimizer = MasterWeightOptimizer(adam, model)
    train(model, optimizer, recipe, 3, seed=1)
    loaded = save(model.state_dict(), tmp_path)
    saved_optimizer = copy.deepcopy(optimizer.state_dict())
    continued = train(model, optimizer, recipe, 3, seed=2)

    fresh = build_model(recipe, 7)  # other weights: everything must come from the checkpoint
    fresh_optimizer = MasterWeightOptimizer(adam, fresh)
    fresh.load_state_dict(loaded, strict=True)
    fresh_optimizer.load_state_dict(saved_optimizer)
    assert {k for k in loaded if "scale_inv" in k} >= {"0.weight_scale_inv", "2.weight_scale_inv"}
    assert train(fresh, fresh_optimizer, recipe, 3, seed=2) == continued
    for key, value in model.state_dict().items():
        other = fresh.state_dict()[key]
        assert value.dtype == other.dtype and torch.equal(bits(value.contiguous()), bits(other.contiguous())), key
