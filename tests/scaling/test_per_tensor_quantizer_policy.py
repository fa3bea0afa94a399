"""The per-tensor quantizer's scale policy (fp8mp/scaling/per_tensor_quantizer.py) over an Fp8Meta, one method per step:
prepare_forward_scales sets what a forward's casts use under each recipe, and hands backward the rule for the gradient's scale. References in numpy float32."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fp8mp.scaling.fp8_meta import GRAD, INPUT, WEIGHT, Fp8Meta
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Format

E4M3_MAX, E5M2_MAX = np.float32(448.0), np.float32(57344.0)


def fresh(recipe) -> Fp8Meta:
    meta = Fp8Meta(3, backward_tensors=(GRAD,))
    meta.configure(recipe)
    return meta


def current_scale(t: torch.Tensor, fp8_max: np.float32, margin: int = 0) -> np.float32:
    amax = np.float32(np.abs(t.numpy()).max())
    return fp8_max / amax / np.float32(2.0 ** margin)


@pytest.mark.parametrize("recipe", [CurrentScaling(), CurrentScaling(margin=2), DelayedScaling()])
def test_current_scaling_and_a_first_delayed_step_scale_input_and_weight_from_themselves(recipe):
    torch.manual_seed(0)
    meta = fresh(recipe)
    x, w, g = torch.randn(8, 16) * 30, torch.randn(4, 16) / 7, torch.randn(8, 4) * 1e3
    grad_rule = meta.quantizer.prepare_forward_scales(meta, x, w)
    assert meta.scale[INPUT].item() == current_scale(x, E4M3_MAX, recipe.margin)
    assert meta.scale[WEIGHT].item() == current_scale(w, E4M3_MAX, recipe.margin)
    assert meta.scale[GRAD].item() == 1.0  # the gradient's scale waits for the gradient
    assert meta.scale_inv[INPUT].item() == np.float32(1) / np.float32(meta.scale[INPUT].item())
    grad_rule(g)
    assert meta.scale[GRAD].item() == current_scale(g, E5M2_MAX, recipe.margin)


def test_a_tensor_cast_elsewhere_keeps_its_scale():
    meta = fresh(CurrentScaling())
    meta.quantizer.prepare_forward_scales(meta, None, torch.full((2, 2), 7.0))  # a fused norm casts the input itself
    assert meta.scale.tolist() == [1.0, np.float32(448) / np.float32(7), 1.0]


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_updates_every_scale_from_the_history_and_leaves_backward_nothing(algo):
    meta = fresh(DelayedScaling(amax_history_len=3, amax_compute_algo=algo, fp8_format=Format.HYBRID))
    meta.mark_initialized()
    steps = [[2.0, 0.5, 100.0], [8.0, 0.25, 3.0]]
    for amaxes in steps:
        meta.amax.copy_(torch.tensor(amaxes))
        assert meta.quantizer.prepare_forward_scales(meta, torch.ones(2, 2) * 1e4, torch.ones(2, 2) * 1e4) is None
    history = np.array(steps[::-1], dtype=np.float32)
    effective = history.max(axis=0) if algo == "max" else history[0]
    expected = np.array([E4M3_MAX, E4M3_MAX, E5M2_MAX], dtype=np.float32) / effective
    assert meta.scale.numpy().tolist() == expected.tolist()  # from the history, not from the 1e4 tensors
    assert meta.amax_history[:2].numpy().tolist() == history.tolist()


def test_forward_buffers_carry_the_step_amax_only_when_gradients_are_recorded():
    meta = fresh(CurrentScaling())
    buffers = meta.forward_buffers()
    assert all(a is b for a, b in zip(buffers, (meta.scale, meta.scale_inv, meta.amax, meta.step_amax), strict=True))
    with torch.no_grad():
        assert meta.forward_buffers()[3] is None
