"""The recipe's per-GEMM accumulation (fp8_gemm_fprop/dgrad/wgrad, TE's MMParams) reaches fp8_gemm."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fp8mp
from fp8mp.ops import operand as operand_ops
from fp8mp.ops import gemm as gemm_ops
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, MMParams, gemm_fast_accum

SPLIT, FAST = MMParams(use_split_accumulator=True), MMParams(use_split_accumulator=False)


@pytest.fixture
def gemm_calls(monkeypatch):
    """The use_fast_accum of every fp8_gemm the FP8 linear function makes, in call order."""
    calls = []

    def recording_gemm(a, a_scale_inv, b, b_scale_inv, bias, out_dtype, use_fast_accum=False):
        calls.append(use_fast_accum)
        return gemm_ops.fp8_gemm(a, a_scale_inv, b, b_scale_inv, bias, out_dtype, use_fast_accum)

    monkeypatch.setattr(operand_ops, "fp8_gemm", recording_gemm)
    return calls


def test_defaults_are_transformer_engines():
    for recipe in (DelayedScaling(), CurrentScaling()):
        assert recipe.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
        assert recipe.fp8_gemm_dgrad == MMParams(use_split_accumulator=True)
        assert recipe.fp8_gemm_wgrad == MMParams(use_split_accumulator=True)
        assert gemm_fast_accum(recipe) == (True, False, False)
    assert MMParams().use_split_accumulator is True  # TE's MMParams default
    assert fp8mp.recipe.MMParams is MMParams


def test_bad_gemm_params_are_refused():
    with pytest.raises(ValueError, match="fp8_gemm_dgrad must be a fp8mp.recipe.MMParams"):
        DelayedScaling(fp8_gemm_dgrad=True)
    with pytest.raises(ValueError, match="use_split_accumulator must be a bool"):
        MMParams(use_split_accumulator=1)


@pytest.mark.parametrize("recipe_type", [DelayedScaling, CurrentScaling])
@pytest.mark.parametrize("fprop, dgrad, wgrad", [(FAST, SPLIT, SPLIT), (SPLIT, FAST, SPLIT), (SPLIT, SPLIT, FAST)])
@pytest.mark.parametrize("module", ["linear", "layernorm_linear", "conv1d"])
def test_each_gemm_gets_its_recipe_field(gemm_calls, recipe_type, fprop, dgrad, wgrad, module):
    recipe = recipe_type(fp8_gemm_fprop=fprop, fp8_gemm_dgrad=dgrad, fp8_gemm_wgrad=wgrad)
    torch.manual_seed(0)
    if module == "linear":
        layer = fp8mp.nn.Linear(32, 16)
    elif module == "layernorm_linear":
        layer = fp8mp.nn.LayerNormLinear(32, 16)
    else:
        layer = fp8mp.nn.Conv1D(16, 32)
    x = torch.randn(8, 32, requires_grad=True)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = layer(x)
    assert gemm_calls == [not fprop.use_split_accumulator]
    out.sum().backward()
    assert gemm_calls == [not fprop.use_split_accumulator, not dgrad.use_split_accumulator,
                          not wgrad.use_split_accumulator]


def test_recipe_with_gemm_params_is_still_frozen():
    recipe = DelayedScaling()
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.fp8_gemm_fprop = SPLIT


def test_one_layer_follows_each_new_recipe(gemm_calls):
    # An Fp8Meta keeps the quantizer of the recipe in use (its formats and fast_accum): a new recipe replaces it.
    layer = fp8mp.nn.Linear(32, 16)
    for fprop, dgrad, wgrad in [(FAST, SPLIT, SPLIT), (SPLIT, FAST, SPLIT), (SPLIT, SPLIT, FAST), (FAST, SPLIT, SPLIT)]:
        gemm_calls.clear()
        with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling(fp8_gemm_fprop=fprop, fp8_gemm_dgrad=dgrad, fp8_gemm_wgrad=wgrad)):
            out = layer(torch.randn(8, 32, requires_grad=True))
        out.sum().backward()
        assert gemm_calls == [not p.use_split_accumulator for p in (fprop, dgrad, wgrad)]
