"""fp8mp.nn.Conv1D (transformers' Conv1D, weight [in, out]) and its conversion."""
from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fp8mp
from fp8_reference import FP8_DTYPES, FP8_MAX, dbias_reference, saturate
from gemm_reference import assert_close_to_reference, reference_f64
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Format

RECIPES = [DelayedScaling(amax_history_len=4), CurrentScaling(), DelayedScaling(fp8_format=Format.E4M3)]
RECIPE_IDS = ["delayed-hybrid", "current-hybrid", "delayed-e4m3"]


def pair(nf=48, nx=32, seed=0):
    """An fp8mp Conv1D and an fp8mp Linear holding the same weight, transposed."""
    torch.manual_seed(seed)
    conv = fp8mp.nn.Conv1D(nf, nx)
    torch.nn.init.normal_(conv.bias)
    linear = fp8mp.nn.Linear(nx, nf)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.t())
        linear.bias.copy_(conv.bias)
    return conv, linear


def step(module, x, grad, recipe, enabled=True):
    x = x.clone().requires_grad_(True)
    with fp8mp.fp8_autocast(enabled=enabled, fp8_recipe=recipe):
        out = module(x)
    out.backward(grad)
    return out, x.grad


def test_constructor_parameters_and_state_dict_keys():
    conv = fp8mp.nn.Conv1D(48, 32)
    assert conv.weight.shape == (32, 48) and conv.bias.shape == (48,)
    assert (conv.in_features, conv.out_features) == (32, 48) and "nf=48, nx=32" in repr(conv)
    assert list(conv.state_dict()) == ["weight", "bias", "fp8_meta.amax", "fp8_meta.amax_history", "fp8_meta.scale",
                                       "fp8_meta.scale_inv", "fp8_meta.initialized"]


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_is_bit_identical_to_fp8_linear_on_the_transposed_weight(recipe, dtype):
    conv, linear = pair()
    conv, linear = conv.to(dtype), linear.to(dtype)
    gen = torch.Generator().manual_seed(1)
    for i in range(3):  # later steps use the delayed-scaling history
        x = (torch.randn(2, 5, 32, generator=gen) * (i + 1)).to(dtype)
        grad = (torch.randn(2, 5, 48, generator=gen) * 1e-2).to(dtype)
        conv.zero_grad(), linear.zero_grad()
        out_c, dx_c = step(conv, x, grad, recipe)
        out_l, dx_l = step(linear, x, grad, recipe)
        assert out_c.dtype == dtype and out_c.shape == (2, 5, 48)
        assert torch.equal(out_c, out_l) and torch.equal(dx_c, dx_l)
        assert torch.equal(conv.weight.grad, linear.weight.grad.t()) and torch.equal(conv.bias.grad, linear.bias.grad)
    for name in ("amax", "amax_history", "scale", "scale_inv"):
        assert torch.equal(getattr(conv.fp8_meta, name), getattr(linear.fp8_meta, name)), name


def quantize(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, float]:
    """Current scaling by torch's own float8 cast: (codes, scale_inv) with scale = fp8_max / amax."""
    scale = torch.tensor(FP8_MAX[fmt], dtype=torch.float32) / t.abs().amax().float()
    return saturate(t.float() * scale, fmt).to(FP8_DTYPES[fmt]), float(scale.reciprocal())


def test_current_scaling_matches_an_independent_fp8_reference():
    conv, _ = pair(nf=32, nx=64)
    x = torch.randn(24, 64)
    grad = torch.randn(24, 32) * 1e-3
    out, dx = step(conv, x, grad, CurrentScaling())
    xq, x_si = quantize(x, "e4m3")
    wq, w_si = quantize(conv.weight.detach(), "e4m3")
    gq, g_si = quantize(grad, "e5m2")
    # y = x @ W + b, dx = dy @ W.T, dW = x.T @ dy: each an FP8 product with fp32 accumulation
    assert_close_to_reference(out.detach(), *reference_f64(xq, x_si, wq.t(), w_si, conv.bias.detach()), torch.float32)
    assert_close_to_reference(dx, *reference_f64(gq, g_si, wq, w_si, None), torch.float32)
    assert_close_to_reference(conv.weight.grad, *reference_f64(xq.t(), x_si, gq.t(), g_si, None), torch.float32)
    # The bias gradient is the grad cast's fused fp32 column sum, in its documented order.
    assert torch.equal(conv.bias.grad.view(torch.int32), torch.from_numpy(dbias_reference(grad)).view(torch.int32))
    torch.testing.assert_close(conv.bias.grad, grad.sum(0))


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_no_transpose_copy_of_the_weight_per_step():
    # The FP8 cast writes both layouts, so Conv1D's step runs exactly the ops of Linear's, whose
    # weight is already [out, in]: a transposed copy of the weight would show up as an extra op.
    conv, linear = pair()
    logs = []
    for module in (conv, linear):
        x, grad = torch.randn(8, 32, requires_grad=True), torch.randn(8, 48)
        with OpLog() as log:
            with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
                out = module(x)
            out.backward(grad)
        logs.append(log.ops)
    assert "fp8mp.cast_to_fp8_transpose" in logs[0] and logs[0].count("fp8mp.fp8_gemm") == 3
    assert sorted(logs[0]) == sorted(logs[1])


def test_outside_autocast_and_under_fallback_it_is_transformers_conv1d():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.pytorch_utils.Conv1D(48, 32)
    ours = fp8mp.nn.Conv1D.from_hf(copy.deepcopy(hf))
    x = torch.randn(3, 4, 32)
    assert torch.equal(ours(x), hf(x))
    ours.fp8_fallback = True
    with fp8mp.fp8_autocast():
        assert torch.equal(ours(x), hf(x))


def test_convert_swaps_gpt2_conv1d_sharing_parameters_and_unconvert_restores():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    reference = copy.deepcopy(model)
    params = {name: p for name, p in model.named_parameters()}
    fp8mp.convert(model, module_filter=lambda name, m: name != "lm_head")
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, fp8mp.nn.Conv1D))
    assert converted == sorted(f"transformer.h.{i}.{p}" for i in range(2)
                               for p in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))
    assert all(params[name] is p for name, p in model.named_parameters())  # shared, not copied
    ids = torch.randint(0, 128, (2, 16))
    with fp8mp.fp8_autocast() as ctx:
        loss = model(input_ids=ids, labels=ids).loss
    assert len(ctx.modules) == 8
    ref_loss = reference(input_ids=ids, labels=ids).loss
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < 0.02
    loss.backward()
    assert all(model.get_parameter(n + ".weight").grad is not None for n in converted)

    fp8mp.unconvert(model)
    hf_conv1d = transformers.pytorch_utils.Conv1D
    assert not any(isinstance(m, fp8mp.nn.Conv1D) for m in model.modules())
    assert sum(type(m) is hf_conv1d for m in model.modules()) == 8
    assert all(params[name] is p for name, p in model.named_parameters())
    assert model.state_dict().keys() == reference.state_dict().keys()


def test_convert_keeps_unaligned_conv1d(caplog):
    transformers = pytest.importorskip("transformers")
    model = torch.nn.Sequential(transformers.pytorch_utils.Conv1D(40, 32), transformers.pytorch_utils.Conv1D(32, 40))
    with caplog.at_level("INFO", logger="fp8mp"):
        fp8mp.convert(model)
    assert all(type(m) is transformers.pytorch_utils.Conv1D for m in model)
    assert "multiples of 16" in caplog.text


def test_bad_input():
    conv = fp8mp.nn.Conv1D(16, 32)
    with fp8mp.fp8_autocast():
        with pytest.raises(ValueError, match="fp8mp.nn.Conv1D: argument 'input' must have last dimension 32"):
            conv(torch.randn(4, 16))
        with pytest.raises(TypeError, match="argument 'input' must be float32, bfloat16 or float16"):
            conv(torch.randn(4, 32).double())


def test_forward_holds_the_module_lock():
    """Like Linear, Conv1D takes its Fp8Meta's lock from the scale update to the casts: a thread sharing the
    layer waits while another holds it."""
    conv = fp8mp.nn.Conv1D(16, 8)
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with conv.fp8_meta.lock():
            held.set()
            release.wait(10)

    def caller():
        with fp8mp.fp8_autocast(enabled=True):
            conv(torch.randn(4, 8))
        done.set()

    first = threading.Thread(target=holder)
    first.start()
    assert held.wait(10)
    second = threading.Thread(target=caller)
    second.start()
    assert not done.wait(0.5)  # blocked on the lock
    release.set()
    first.join(10)
    second.join(30)
    assert done.is_set()
