"""torchao as an independent reference, imported inside the tests that use it.

A test module that imported torchao at its top would fail to collect where torchao is absent (the GPU
machine of benchmarks/gpu_check.sh has none), taking every other test of the module with it. Each helper
here imports torchao when called and skips the calling test, saying why, where it is missing.
"""
from __future__ import annotations

import pytest
import torch

WHY = "torchao is this test's independent reference and is not installed"


def _torchao(module: str):
    return pytest.importorskip(module, reason=WHY)


def to_mx(x: torch.Tensor, elem: torch.dtype, block: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, data) of torchao's MX quantization of x in blocks of `block` along its last dim; mode 'floor' or 'rceil'."""
    config = _torchao("torchao.prototype.mx_formats.config")
    mx_tensor = _torchao("torchao.prototype.mx_formats.mx_tensor")
    return mx_tensor.to_mx(x, elem, block, config.ScaleCalculationMode(mode))


def rowwise(x: torch.Tensor, elem: torch.dtype, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) of torchao's axiswise (one scale per row) FP8 scaling; scale is the multiplier, [rows, 1]."""
    config = _torchao("torchao.float8.config")
    utils = _torchao("torchao.float8.float8_utils")
    scale = utils.tensor_to_scale(x, elem, scaling_granularity=config.ScalingGranularity.AXISWISE, axiswise_dim=-1,
                                  round_scales_to_power_of_2=pow2)
    return utils.to_fp8_saturated(x.to(torch.float32) * scale, elem), scale


def float8_training(model: torch.nn.Module, recipe_name: str) -> torch.nn.Module:
    """`model` with torchao's Float8Linear (emulate=True) under its named recipe ('tensorwise', 'rowwise', ...)."""
    import dataclasses

    float8 = _torchao("torchao.float8")
    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name(recipe_name), emulate=True)
    return float8.convert_to_float8_training(model, config=config)
