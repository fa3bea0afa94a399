"""fp8mp.nn.Linear and fp8_autocast: numerics against float references, scaling state, training, compile."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import fp8mp
import tiny_task
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Format

RECIPES = [DelayedScaling(), CurrentScaling(), DelayedScaling(fp8_format=Format.E4M3, amax_history_len=16)]
RECIPE_IDS = ["delayed-hybrid", "current-hybrid", "delayed-e4m3"]


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    reference, approx = reference.double(), approx.double()
    if torch.equal(reference, approx):
        return math.inf
    return 20 * math.log10(reference.norm().item() / (reference - approx).norm().item())


def make_pair(in_f, out_f, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    fp8 = fp8mp.nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    fp8.load_state_dict(ref.state_dict())
    return ref, fp8


def run_step(module, x, grad, recipe=None, enabled=True):
    x = x.clone().requires_grad_(True)
    with fp8mp.fp8_autocast(enabled=enabled, fp8_recipe=recipe):
        out = module(x)
    out.backward(grad)
    return out, x.grad


def test_outside_autocast_is_exactly_nn_linear():
    ref, fp8 = make_pair(64, 32)
    x = torch.randn(8, 64)
    assert torch.equal(ref(x), fp8(x))
    with fp8mp.fp8_autocast(enabled=False):
        assert torch.equal(ref(x), fp8(x))


def test_state_dict_keys_and_loading_nn_linear_checkpoint():
    ref = torch.nn.Linear(48, 16)
    fp8 = fp8mp.nn.Linear(48, 16)
    # torch's keys plus the FP8 scaling state, all tensors (see tests/nn/test_checkpoints.py)
    assert list(fp8.state_dict().keys()) == [*ref.state_dict().keys(), "fp8_meta.amax", "fp8_meta.amax_history",
                                             "fp8_meta.scale", "fp8_meta.scale_inv", "fp8_meta.initialized"]
    fp8.load_state_dict(ref.state_dict(), strict=True)
    assert torch.equal(fp8.weight, ref.weight) and torch.equal(fp8.bias, ref.bias)
    no_bias = fp8mp.nn.Linear(48, 16, bias=False)
    assert [n for n, _ in no_bias.named_parameters()] == [n for n, _ in torch.nn.Linear(48, 16, bias=False).named_parameters()]


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
@pytest.mark.parametrize(
    "batch_shape,in_f,out_f",
    [((64,), 128, 96), ((4, 7), 64, 48), ((1,), 16, 16), ((33,), 50, 70), ((2, 3, 5), 32, 24)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_backward_sqnr(recipe, batch_shape, in_f, out_f, dtype):
    ref, fp8 = make_pair(in_f, out_f, dtype=dtype)
    torch.manual_seed(1)
    x = torch.randn(*batch_shape, in_f, dtype=dtype)
    grad = torch.randn(*batch_shape, out_f, dtype=dtype) * 1e-3
    ref32 = copy.deepcopy(ref).float()
    out_ref, dx_ref = run_step(ref32, x.float(), grad.float(), enabled=False)
    for step in range(3):  # later steps exercise the delayed-scaling history
        fp8.zero_grad()
        out, dx = run_step(fp8, x, grad, recipe)
    assert out.dtype == dtype and dx.dtype == dtype and fp8.weight.grad.dtype == dtype
    assert out.shape == (*batch_shape, out_f)
    assert sqnr_db(out_ref, out) >= 25
    # E4M3 gradients meet the same 25 dB; E5M2 (HYBRID) has one mantissa bit
    # less, about 6 dB less SQNR, so gradients are held to 19 dB there.
    grad_min_db = 25 if recipe.fp8_format == Format.E4M3 else 19
    assert sqnr_db(dx_ref, dx) >= grad_min_db
    assert sqnr_db(ref32.weight.grad, fp8.weight.grad) >= grad_min_db
    assert sqnr_db(ref32.bias.grad, fp8.bias.grad) >= 40  # bias grad is a plain sum


def test_amax_history_contents_are_exact():
    recipe = DelayedScaling(amax_history_len=4)
    _, fp8 = make_pair(32, 16)
    xs = [torch.randn(8, 32) * (i + 1) for i in range(4)]
    grads = [torch.randn(8, 16) * 10 ** -(i + 1) for i in range(4)]
    weights_seen = []
    for x, g in zip(xs[:3], grads[:3]):
        weights_seen.append(fp8.weight.detach().abs().max().item())
        run_step(fp8, x, g, recipe)
        with torch.no_grad():
            fp8.weight.mul_(1.5)  # an optimizer step changes the weight's amax
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        fp8(xs[3])
    meta = fp8.fp8_meta
    expect_input = [xs[2].abs().max().item(), xs[1].abs().max().item(), xs[0].abs().max().item(), 0.0]
    expect_weight = [weights_seen[2], weights_seen[1], weights_seen[0], 0.0]
    expect_grad = [grads[2].abs().max().item(), grads[1].abs().max().item(), grads[0].abs().max().item(), 0.0]
    assert meta.amax_history[:, 0].tolist() == expect_input
    assert meta.amax_history[:, 1].tolist() == expect_weight
    assert meta.amax_history[:, 2].tolist() == expect_grad
    assert meta.amax[0].item() == xs[3].abs().max().item()
    # scale = fp8_max / max(history), computed in fp32
    expected_scale = torch.tensor([448.0, 448.0, 57344.0]) / meta.amax_history.max(dim=0).values
    assert torch.equal(meta.scale, expected_scale)
    assert torch.equal(meta.scale_inv, expected_scale.reciprocal())


def test_first_step_of_delayed_scaling_does_not_saturate():
    _, fp8 = make_pair(32, 16)
    x = torch.randn(8, 32) * 5000  # far beyond E4M3's 448 at scale 1
    out, _ = run_step(fp8, x, torch.randn(8, 16), DelayedScaling())
    ref = torch.nn.functional.linear(x, fp8.weight, fp8.bias)
    assert sqnr_db(ref.detach(), out.detach()) >= 25


def test_tiny_mlp_trains_like_fp32():
    results = {}
    for fp8, layer in ((False, torch.nn.Linear), (True, fp8mp.nn.Linear)):
        model = tiny_task.mlp(layer)
        results[fp8] = tiny_task.train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), fp8=fp8)
        tiny_task.assert_learned(*results[fp8])
    fp32_loss, fp8_loss = results[False][1], results[True][1]
    assert abs(fp8_loss - fp32_loss) / fp32_loss <= 0.02, (fp8_loss, fp32_loss)


def test_compile_fullgraph_matches_eager():
    recipe = DelayedScaling(amax_history_len=8)
    _, eager = make_pair(64, 32)
    compiled_module = copy.deepcopy(eager)

    def forward(module, x):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            return module(x)

    compiled_forward = torch.compile(forward, fullgraph=True)  # backward runs AOTAutograd's compiled graph
    for i in range(3):
        x = torch.randn(16, 64) * (i + 1)
        out_e = forward(eager, x)
        out_e.sum().backward()
        out_c = compiled_forward(compiled_module, x)
        out_c.sum().backward()
        assert torch.equal(out_e, out_c)
        assert torch.equal(eager.weight.grad, compiled_module.weight.grad)
        assert torch.equal(eager.fp8_meta.amax_history, compiled_module.fp8_meta.amax_history)
        assert torch.equal(eager.fp8_meta.scale, compiled_module.fp8_meta.scale)
        eager.zero_grad()
        compiled_module.zero_grad()


def test_autocast_nests_restores_and_records_modules():
    a, b = fp8mp.nn.Linear(16, 16), fp8mp.nn.Linear(16, 16)
    inner_recipe = CurrentScaling()
    x = torch.randn(4, 16)
    assert not fp8mp.is_fp8_enabled()
    with fp8mp.fp8_autocast() as outer:
        a(x)
        with fp8mp.fp8_autocast(fp8_recipe=inner_recipe) as inner:
            assert fp8mp.get_fp8_recipe() is inner_recipe
            b(x)
        with pytest.raises(RuntimeError, match="boom"):
            with fp8mp.fp8_autocast(enabled=False):
                assert not fp8mp.is_fp8_enabled()
                raise RuntimeError("boom")
        assert fp8mp.is_fp8_enabled() and isinstance(fp8mp.get_fp8_recipe(), DelayedScaling)
    assert not fp8mp.is_fp8_enabled() and fp8mp.get_fp8_recipe() is None
    assert set(map(id, outer.modules)) == {id(a), id(b)}
    assert [id(m) for m in inner.modules] == [id(b)]


def test_bad_inputs_and_recipes():
    layer = fp8mp.nn.Linear(16, 8)
    with fp8mp.fp8_autocast():
        with pytest.raises(ValueError, match="'input' must have last dimension 16"):
            layer(torch.randn(4, 15))
        with pytest.raises(TypeError, match="'input'"):
            layer(torch.ones(4, 16, dtype=torch.int32))
        with pytest.raises(TypeError, match="'input'"):
            layer(torch.ones(4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="fp8_recipe"):
        with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_format=Format.E5M2)):
            pass
    with pytest.raises(TypeError, match="fp8_recipe"):
        with fp8mp.fp8_autocast(fp8_recipe="hybrid"):
            pass


def test_empty_batch():
    _, fp8 = make_pair(32, 16)
    out, dx = run_step(fp8, torch.randn(0, 32), torch.randn(0, 16), CurrentScaling())
    assert out.shape == (0, 16) and dx.shape == (0, 32)
    assert torch.equal(fp8.weight.grad, torch.zeros_like(fp8.weight))


@pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")
@pytest.mark.cuda
@pytest.mark.parametrize("in_f,out_f", [(128, 256), (50, 70)])
def test_cuda_linear_matches_cpu(in_f, out_f):
    ref, cpu = make_pair(in_f, out_f, dtype=torch.bfloat16)
    gpu = copy.deepcopy(cpu).cuda()
    x = torch.randn(64, in_f, dtype=torch.bfloat16)
    grad = torch.randn(64, out_f, dtype=torch.bfloat16)
    out_c, dx_c = run_step(cpu, x, grad, CurrentScaling())
    out_g, dx_g = run_step(gpu, x.cuda(), grad.cuda(), CurrentScaling())
    torch.testing.assert_close(out_g.cpu(), out_c, rtol=1.6e-2, atol=1e-5)
    torch.testing.assert_close(dx_g.cpu(), dx_c, rtol=1.6e-2, atol=1e-5)
    torch.testing.assert_close(gpu.weight.grad.cpu(), cpu.weight.grad, rtol=1.6e-2, atol=1e-5)


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_module_running_twice_per_step(recipe):
    # A shared layer updates its scaling buffers in its second forward, before the first one's backward.
    ref, fp8 = make_pair(32, 32)
    ref = ref.float()
    x = torch.randn(8, 32)
    for _ in range(3):
        fp8.zero_grad()
        ref.zero_grad()
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            out = fp8(torch.nn.functional.gelu(fp8(x)))
        out.sum().backward()
    out_ref = ref(torch.nn.functional.gelu(ref(x)))
    out_ref.sum().backward()
    assert sqnr_db(out_ref.detach(), out.detach()) >= 20
    assert sqnr_db(ref.weight.grad, fp8.weight.grad) >= 15


def test_model_dtype_conversion_keeps_fp8_state_in_fp32():
    model = torch.nn.Sequential(fp8mp.nn.Linear(32, 32), torch.nn.GELU(), fp8mp.nn.Linear(32, 16)).bfloat16()
    assert model[0].weight.dtype == torch.bfloat16
    for layer in (model[0], model[2]):
        assert {name: b.dtype for name, b in layer.fp8_meta.named_buffers()} == {
            "amax": torch.float32, "amax_history": torch.float32, "scale": torch.float32, "scale_inv": torch.float32,
            "initialized": torch.bool, "fp8_max": torch.float32, "step_amax": torch.float32}
    for _ in range(2):
        out, dx = run_step(model, torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16),
                           DelayedScaling())
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all() and model[0].weight.grad.dtype == torch.bfloat16


def load_swapping(module: torch.nn.Module, state: dict) -> None:
    """load_state_dict through torch.utils.swap_tensors (torch's opt-in future behaviour), restored after."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.load_state_dict(state)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def test_cached_column_views_follow_replaced_buffers():
    # Fp8Meta.columns() reuses its views of the buffers' columns between calls; whatever replaces a buffer
    # must make the next forward's casts write the amax into the new buffer, not into the old memory.
    torch.manual_seed(0)
    layer = fp8mp.nn.Linear(16, 8)
    meta = layer.fp8_meta

    def forward_writes_input_amax(scale: float) -> None:
        x = torch.randn(4, 16) * scale
        with fp8mp.fp8_autocast():
            layer(x).sum().backward()
        assert meta.amax[0].item() == x.abs().max().item()
        assert meta.step_amax[0].item() == x.abs().max().item()

    forward_writes_input_amax(1.0)
    assert meta.columns() is meta.columns()  # reused while nothing changed
    replacements = {
        "assignment": lambda: setattr(meta, "amax", meta.amax.clone()),
        ".data": lambda: setattr(meta.amax, "data", meta.amax.clone()),
        "load_state_dict(swap)": lambda: load_swapping(meta, {k: v.clone() for k, v in meta.state_dict().items()}),
        "load_state_dict(assign=True)": lambda: meta.load_state_dict(
            {k: v.clone() for k, v in meta.state_dict().items()}, assign=True),
        "step_amax .data": lambda: setattr(meta.step_amax, "data", meta.step_amax.clone()),
        "model.to(dtype)": lambda: layer.to(torch.float64).float(),
    }
    for scale, (name, replace) in enumerate(replacements.items(), start=2):
        replace()
        forward_writes_input_amax(float(scale))
    twin = copy.deepcopy(layer)  # a copy casts into its own buffers
    before = meta.amax.clone()
    x = torch.randn(4, 16) * 100
    with fp8mp.fp8_autocast():
        twin(x)
    assert twin.fp8_meta.amax[0].item() == x.abs().max().item() and torch.equal(meta.amax, before)
