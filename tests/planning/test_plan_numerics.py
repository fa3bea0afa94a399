"""The planner's numerics: SQNRs against an independent fp64 computation of the same quantization, the input
range, the captured inputs and gradients, and what planted outliers do to one layer's numbers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import planted_models
from blockwise_reference import deepseek_quantize
from fp8_reference import FP8_MAX, decode_reference, torch_reference_bits
from fp8mp.planning.layers import planned_layers
from fp8mp.planning.numerics import LayerNumerics, capture_batch, range_binades
from fp8mp.scaling.recipe import CurrentScaling, RowwiseScaling

K, N, M = 64, 48, 96


def sqnr64(reference: torch.Tensor, approx: torch.Tensor) -> float:
    reference, approx = reference.double(), approx.double()
    return 10 * math.log10(reference.square().sum().item() / (approx - reference).square().sum().item())


def per_tensor(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """t through one current-scaling cast: scale = fp8_max / amax in fp32, the codes by torch's own float8 cast."""
    scale = (torch.tensor(FP8_MAX[fmt], dtype=torch.float32) / t.abs().max().float()).item()
    codes = torch_reference_bits(t, scale, fmt)
    return torch.from_numpy(decode_reference(codes, fmt)).double() / scale


def rowwise(t: torch.Tensor) -> torch.Tensor:
    """t quantized per row along its last axis, power-of-two E4M3 scales (DeepSeek's rule, 1 x len tiles)."""
    data, scale_inv = deepseek_quantize(t, 1, t.shape[1], torch.float8_e4m3fn, pow2=True)
    return data.double() * scale_inv.double()


def single_linear_numerics(recipe_name: str, recipe):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, N))
    x = torch.randn(M, K) * torch.exp2(torch.randn(M, 1))
    g = torch.randn(M, N)
    loss_fn = lambda m, batch: (m(batch) * g).sum()  # noqa: E731  the output gradient is g
    layer = planned_layers(model)[0]
    numeric = LayerNumerics(layer, {recipe_name: recipe})
    loss, calls, _ = capture_batch(model, [layer], x, loss_fn)
    assert torch.equal(calls["0"][0][0], x) and torch.equal(calls["0"][0][1], g)
    numeric.add_batch(calls["0"])
    return model[0], x, g, numeric.sqnr()[recipe_name]


def test_current_scaling_sqnr_matches_an_fp64_reference():
    linear, x, g, sqnr = single_linear_numerics("current", CurrentScaling())
    w, b = linear.weight.detach(), linear.bias.detach().double()
    xq, wq, gq = per_tensor(x, "e4m3"), per_tensor(w, "e4m3"), per_tensor(g, "e5m2")  # HYBRID: E5M2 gradients
    x64, w64, g64 = x.double(), w.double(), g.double()
    expected = {"output": sqnr64(x64 @ w64.T + b, xq @ wq.T + b), "grad_input": sqnr64(g64 @ w64, gq @ wq),
                "grad_weight": sqnr64(g64.T @ x64, gq.T @ xq)}
    for part, value in expected.items():
        assert sqnr[part] == pytest.approx(value, abs=0.02), part


def test_rowwise_sqnr_matches_an_fp64_reference():
    linear, x, g, sqnr = single_linear_numerics("rowwise", RowwiseScaling())
    w, b = linear.weight.detach(), linear.bias.detach().double()
    x64, w64, g64 = x.double(), w.double(), g.double()
    # Each GEMM quantizes its operands along its own reduction axis: K forward, N for dgrad, M for wgrad.
    expected = {"output": sqnr64(x64 @ w64.T + b, rowwise(x) @ rowwise(w).T + b),
                "grad_input": sqnr64(g64 @ w64, rowwise(g) @ rowwise(w.T.contiguous()).T),
                "grad_weight": sqnr64(g64.T @ x64, rowwise(g.T.contiguous()) @ rowwise(x.T.contiguous()).T)}
    for part, value in expected.items():
        assert sqnr[part] == pytest.approx(value, abs=0.02), part


def test_range_binades_is_max_over_median():
    x = torch.ones(10, 10)
    x[0, 0] = 1024.0
    x[1, :5] = 0.0  # zeros do not count
    assert range_binades(x) == pytest.approx(10.0)
    assert range_binades(torch.zeros(4, 4)) == 0.0


def test_capture_leaves_the_model_gradients_alone():
    model = planted_models.MLP(planted=False)
    loss, calls, flops = capture_batch(model, planned_layers(model), planted_models.mlp_batches(1)[0],
                                       planted_models.mlp_loss, count_flops=True)
    assert all(p.grad is None for p in model.parameters())
    assert [len(c) for c in calls.values()] == [1, 1, 1] and all(c[0][1] is not None for c in calls.values())
    assert flops == 2 * 256 * (32 * 256 + 256 * 256 + 256 * 32)  # the forward's three GEMMs
    assert math.isfinite(loss)


def test_planted_outliers_break_per_tensor_but_not_fine_grained_scaling():
    """The planted layer's input spans ~19 binades; one per-tensor scale loses its output (SQNR far below the
    ~28 dB of E4M3), blocks of 32 or 128 along K keep most of it; the layers after it keep ~28 dB under all."""
    model = planted_models.MLP(planted=True)
    layers = planned_layers(model)
    candidates = planted_models.fp8mp.planning.default_candidates()
    numerics = {layer.name: LayerNumerics(layer, candidates) for layer in layers}
    for batch in planted_models.mlp_batches():
        _, calls, _ = capture_batch(model, layers, batch, planted_models.mlp_loss)
        for layer in layers:
            numerics[layer.name].add_batch(calls[layer.name])
    planted = numerics["fc2"]
    assert planted.range > 14 and numerics["fc3"].range < 6
    output = {name: parts["output"] for name, parts in planted.sqnr().items()}
    worst_fine, best_per_tensor = (min(output[c] for c in planted_models.FINE_GRAINED),
                                   max(output[c] for c in planted_models.PER_TENSOR))
    assert best_per_tensor < 15 and worst_fine > best_per_tensor + 8, output  # measured: 10.9 against 20.8 dB
    assert np.all([parts["output"] > 25 for parts in numerics["fc3"].sqnr().values()])
