"""FP8 weight storage with FP32 master weights: numerics, exact re-quantization, memory, training."""
from __future__ import annotations

import copy

import pytest
import torch

import fp8mp
import tiny_task
from fp8mp.nn.fp8_state_dict import state_dict_bytes
from fp8mp.optim.master_weights import MasterWeightOptimizer
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Format
from fp8mp.ops.scale_update import compute_scale

from test_linear import sqnr_db

# MasterWeightOptimizer is deprecated; its behaviour is still tested here (the warning: test_fp8_weights.py)
pytestmark = pytest.mark.filterwarnings("ignore:fp8mp.optim.MasterWeightOptimizer is deprecated:FutureWarning")

E4M3_RECIPES = [DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4), CurrentScaling(fp8_format=Format.E4M3)]


def same_bits(a, b) -> bool:
    """Bitwise equality of state_dict values: tensors, or the FP8 extra-state dicts holding them."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return a == b


def make_pair(in_f, out_f, bias=True, seed=0):
    """An FP32 torch Linear and an FP8-weight fp8mp Linear made from the same initial weights."""
    torch.manual_seed(seed)
    ref = torch.nn.Linear(in_f, out_f, bias=bias)
    torch.manual_seed(seed)
    with fp8mp.fp8_model_init():
        fp8 = fp8mp.nn.Linear(in_f, out_f, bias=bias)
    return ref, fp8


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def weight_scale_for(tensor: torch.Tensor) -> torch.Tensor:
    return compute_scale(tensor.detach().abs().amax().reshape(1), 448.0, 0, torch.ones(1))


def test_model_init_and_flag_choose_the_storage():
    with fp8mp.fp8_model_init():
        inside = fp8mp.nn.Linear(16, 8)
        opted_out = fp8mp.nn.Linear(16, 8, fp8_weight=False)
        plain_torch = torch.nn.Linear(16, 8)
        with fp8mp.fp8_model_init(enabled=False):
            nested_off = fp8mp.nn.Linear(16, 8)
    flagged = fp8mp.nn.Linear(16, 8, fp8_weight=True)
    assert inside.stores_fp8_weight and flagged.stores_fp8_weight
    assert not opted_out.stores_fp8_weight and not nested_off.stores_fp8_weight and not fp8mp.nn.Linear(16, 8).stores_fp8_weight
    assert isinstance(plain_torch.weight, torch.nn.Parameter)
    assert inside.weight is None and inside.weight_fp8.dtype == torch.float8_e4m3fn
    assert set(inside.state_dict()) == {"bias", "weight_fp8", "weight_scale", "weight_scale_inv", "fp8_meta.amax",
                                    "fp8_meta.amax_history", "fp8_meta.scale", "fp8_meta.scale_inv", "fp8_meta.initialized"}
    assert [name for name, _ in inside.named_parameters()] == ["bias"]


def test_initial_weight_is_the_exact_cast_of_the_high_precision_init():
    ref, fp8 = make_pair(48, 24)
    scale = weight_scale_for(ref.weight)
    expected = fp8mp.cast_to_fp8(ref.weight.detach(), scale, torch.zeros(1), "e4m3")
    assert torch.equal(fp8.weight_fp8.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(fp8.weight_scale, scale) and torch.equal(fp8.weight_scale_inv, scale.reciprocal())
    assert torch.equal(fp8.bias, ref.bias)


@pytest.mark.parametrize("recipe", E4M3_RECIPES, ids=["delayed", "current"])
def test_forward_uses_the_stored_fp8_weight(recipe):
    _, fp8 = make_pair(64, 32)
    optimizer = MasterWeightOptimizer(sgd, fp8)  # noqa: F841  (the layer holds its master weakly)
    # Make the stored weight something no cast of the master would give: the forward must read it.
    fp8.weight_fp8.copy_(torch.randn(32, 64).mul(100).to(torch.float8_e4m3fn))
    x = torch.randn(16, 64)
    for _ in range(2):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = fp8(x)
    meta = fp8.fp8_meta
    x_fp8 = fp8mp.cast_to_fp8(x, meta.scale[0:1], torch.zeros(1), "e4m3")
    expected = fp8mp.fp8_gemm(x_fp8, meta.scale_inv[0:1], fp8.weight_fp8, fp8.weight_scale_inv, fp8.bias, torch.float32)
    assert torch.equal(out, expected)
    assert meta.amax[1].item() == 0.0  # the weight column was never cast


@pytest.mark.parametrize("recipe", E4M3_RECIPES, ids=["delayed", "current"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch_shape,in_f,out_f", [((64,), 128, 96), ((4, 7), 50, 70)])
def test_forward_backward_sqnr_against_fp32(recipe, dtype, batch_shape, in_f, out_f):
    ref, fp8 = make_pair(in_f, out_f)
    optimizer = MasterWeightOptimizer(sgd, fp8)
    torch.manual_seed(1)
    x = torch.randn(*batch_shape, in_f)
    grad = torch.randn(*batch_shape, out_f) * 1e-3
    x_ref = x.clone().requires_grad_(True)
    out_ref = ref(x_ref)
    out_ref.backward(grad)
    for _ in range(3):  # later steps exercise the delayed-scaling history
        optimizer.zero_grad()
        x_fp8 = x.to(dtype).clone().requires_grad_(True)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = fp8(x_fp8)
        out.backward(grad.to(dtype))
    master = optimizer.masters[0]
    assert out.dtype == dtype and x_fp8.grad.dtype == dtype and master.grad.dtype == torch.float32
    assert sqnr_db(out_ref, out) >= 25
    assert sqnr_db(x_ref.grad, x_fp8.grad) >= 25
    assert sqnr_db(ref.weight.grad, master.grad) >= 25
    assert sqnr_db(ref.bias.grad, fp8.bias.grad) >= 40


def test_step_updates_master_in_fp32_and_requantizes_exactly():
    _, fp8 = make_pair(40, 24)
    optimizer = MasterWeightOptimizer(sgd, fp8)
    master = optimizer.masters[0]
    for step in range(3):
        optimizer.zero_grad()
        x = torch.randn(8, 40) * (step + 1)
        with fp8mp.fp8_autocast():
            fp8(x).square().sum().backward()
        before, grad = master.detach().clone(), master.grad.clone()
        optimizer.step()
        assert torch.equal(master, torch.add(before, grad, alpha=-0.1))  # SGD in fp32 on the master
        scale = weight_scale_for(master)
        expected = fp8mp.cast_to_fp8(master.detach(), scale, torch.zeros(1), "e4m3")
        assert torch.equal(fp8.weight_scale, scale) and torch.equal(fp8.weight_scale_inv, scale.reciprocal())
        assert torch.equal(fp8.weight_fp8.view(torch.uint8), expected.view(torch.uint8))


def test_outside_autocast_decodes_the_weight_and_trains_the_master():
    _, fp8 = make_pair(32, 16)
    x = torch.randn(4, 32)
    with pytest.raises(RuntimeError, match="MasterWeightOptimizer"):
        fp8(x)  # training mode, grad enabled, no master: refuses to silently not train
    with torch.no_grad():
        no_grad_out = fp8(x)
    fp8.eval()
    eval_out = fp8(x)
    fp8.train()
    optimizer = MasterWeightOptimizer(sgd, fp8)
    decoded = fp8mp.cast_from_fp8(fp8.weight_fp8, fp8.weight_scale_inv, torch.float32)
    out = fp8(x)
    expected = torch.nn.functional.linear(x, decoded, fp8.bias)
    assert torch.equal(out, expected) and torch.equal(no_grad_out, expected) and torch.equal(eval_out, expected)
    grad = torch.randn(4, 16)
    out.backward(grad)
    assert torch.allclose(optimizer.masters[0].grad, grad.t() @ x)
    out_bf16 = fp8(x.bfloat16())
    assert out_bf16.dtype == torch.bfloat16


def test_gradients_accumulate_on_the_master():
    _, fp8 = make_pair(32, 16)
    optimizer = MasterWeightOptimizer(sgd, fp8)
    x = torch.randn(8, 32)
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        fp8(x).sum().backward()
        once = optimizer.masters[0].grad.clone()
        fp8(x).sum().backward()
    assert torch.equal(optimizer.masters[0].grad, 2 * once)


def mlp(fp8_weight: bool, seed: int = 0, fp8_compute: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    if fp8_weight:
        layer = lambda i, o: fp8mp.nn.Linear(i, o, fp8_weight=True)  # noqa: E731
    else:
        layer = fp8mp.nn.Linear if fp8_compute else torch.nn.Linear
    return torch.nn.Sequential(layer(32, 64), torch.nn.GELU(), layer(64, 64), torch.nn.GELU(), layer(64, 1))


def train_mlp(mode: str, steps: int = 200) -> tuple[float, float]:
    """tiny_task's (first loss, last-20 mean) for mode "fp32" (torch.nn.Linear), "fp8" (FP8 compute,
    FP32 weights) or "fp8_weight" (FP8 weights + FP32 masters)."""
    model = mlp(mode == "fp8_weight", fp8_compute=mode != "fp32")
    factory = lambda params: torch.optim.AdamW(params, lr=3e-3)  # noqa: E731
    optimizer = MasterWeightOptimizer(factory, model) if mode == "fp8_weight" else factory(model.parameters())
    return tiny_task.train(model, optimizer, fp8=mode != "fp32", steps=steps)


@pytest.mark.parametrize("shape", [(64, 64), (256, 128), (1024, 1024)])
def test_weight_memory_is_under_030_of_fp32(shape):
    torch.manual_seed(0)
    fp32 = torch.nn.Linear(*shape)
    fp8 = fp8mp.nn.Linear(*shape, fp8_weight=True)
    ratio = state_dict_bytes(fp8) / state_dict_bytes(fp32)
    assert ratio <= 0.3, ratio
    assert state_dict_bytes(fp8) == shape[0] * shape[1] + 4 * shape[1] + 8  # FP8 weight, fp32 bias, two scales


def test_mlp_memory_and_training_match_fp32():
    assert state_dict_bytes(mlp(True)) / state_dict_bytes(mlp(False, fp8_compute=False)) <= 0.3
    first, fp8_weight_loss = train_mlp("fp8_weight")
    _, fp8_compute_loss = train_mlp("fp8")
    _, fp32_loss = train_mlp("fp32")
    tiny_task.assert_learned(first, fp8_weight_loss)
    assert abs(fp8_weight_loss - fp32_loss) / fp32_loss <= 0.02, (fp8_weight_loss, fp32_loss)
    # FP8 weight storage adds (almost) nothing to FP8 compute's own error.
    assert abs(fp8_weight_loss - fp8_compute_loss) / fp8_compute_loss <= 0.01, (fp8_weight_loss, fp8_compute_loss)


def test_loss_scaler_skip_leaves_fp8_weights_and_masters_untouched():
    model = mlp(True)
    optimizer = MasterWeightOptimizer(lambda p: torch.optim.Adam(p, lr=1e-2), model)
    scaler = fp8mp.LossScaler(init_scale=256.0)
    x = torch.randn(16, 32)
    for bad in (False, True):
        optimizer.zero_grad()
        with fp8mp.fp8_autocast():
            loss = model(x).square().mean()
        scaler.scale(loss).backward()
        if bad:
            optimizer.masters[1].grad[0, 0] = float("nan")
        model_before, masters_before = copy.deepcopy(model.state_dict()), [m.detach().clone() for m in optimizer.masters]
        scaler.step(optimizer)
        scaler.update()
    for key, value in model.state_dict().items():
        assert same_bits(value, model_before[key]), key
    assert all(torch.equal(a, b) for a, b in zip(masters_before, optimizer.masters))
    assert scaler.num_skipped_steps == 1 and scaler.get_scale() == 128.0


def test_state_dict_round_trip_restores_masters_and_fp8_weights():
    model = mlp(True)
    optimizer = MasterWeightOptimizer(lambda p: torch.optim.AdamW(p, lr=1e-2), model)
    for _ in range(3):
        optimizer.zero_grad()
        with fp8mp.fp8_autocast():
            model(torch.randn(8, 32)).square().mean().backward()
        optimizer.step()
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    restored = mlp(True, seed=1)
    restored_opt = MasterWeightOptimizer(lambda p: torch.optim.AdamW(p, lr=1e-2), restored)
    restored.load_state_dict(saved_model)
    restored_opt.load_state_dict(saved_opt)
    for a, b in zip(optimizer.masters, restored_opt.masters):
        assert torch.equal(a, b)
    for key, value in model.state_dict().items():
        assert same_bits(value, restored.state_dict()[key]), key
    with pytest.raises(ValueError, match="'state_dict'"):
        restored_opt.load_state_dict({"optimizer": saved_opt["optimizer"], "master_weights": saved_opt["master_weights"][:1]})


def test_existing_optimizer_gets_the_masters_as_a_param_group():
    model = mlp(True)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)  # biases only
    optimizer = MasterWeightOptimizer(inner, model)
    assert optimizer.optimizer is inner and len(inner.param_groups) == 2
    assert inner.param_groups[1]["params"] == optimizer.masters and inner.param_groups[1]["lr"] == 0.1


def test_bad_arguments():
    with pytest.raises(ValueError, match="'model'"):
        MasterWeightOptimizer(sgd, torch.nn.Sequential(fp8mp.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="'model'"):
        MasterWeightOptimizer(sgd, [fp8mp.nn.Linear(4, 4, fp8_weight=True)])
    with pytest.raises(TypeError, match="'optimizer'"):
        MasterWeightOptimizer("adam", fp8mp.nn.Linear(4, 4, fp8_weight=True))
    with pytest.raises(TypeError, match="'optimizer'"):
        MasterWeightOptimizer(lambda p: None, fp8mp.nn.Linear(4, 4, fp8_weight=True))
    with pytest.raises(ValueError, match="'source'"):
        fp8mp.nn.Linear(4, 4, fp8_weight=True).quantize_weight_from(torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match="high precision"):
        fp8mp.nn.Linear(4, 4).quantize_weight_from(torch.zeros(4, 4))
    with pytest.raises(TypeError, match="'enabled'"):
        with fp8mp.fp8_model_init(enabled=1):
            pass


def test_dtype_conversion_keeps_stored_fp8_weight():
    with fp8mp.fp8_model_init():
        layer = fp8mp.nn.Linear(32, 16)
    bits = layer.weight_fp8.view(torch.uint8).clone()
    layer.bfloat16()
    assert layer.weight_fp8.dtype == torch.float8_e4m3fn and torch.equal(layer.weight_fp8.view(torch.uint8), bits)
    assert layer.weight_scale.dtype == layer.weight_scale_inv.dtype == torch.float32
    assert layer.bias.dtype == torch.bfloat16


def test_master_weight_optimizer_warns_that_it_is_deprecated_and_names_what_to_use():
    with fp8mp.fp8_model_init():
        model = fp8mp.nn.Linear(32, 16)
    with pytest.warns(FutureWarning, match=r"deprecated.*fp8mp\.optim\.AdamW.*frozen_weights='fp8'"):
        MasterWeightOptimizer(lambda params: torch.optim.SGD(params, lr=0.1), model)
