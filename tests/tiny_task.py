"""The tiny-MLP regression task several test files train on.

y = sin(2 x.w) + 0.3 noise with |x.w| ~ 1: learnable in 200 steps, with an irreducible MSE of
NOISE**2 = 0.09 as real tasks have, so "within 2% of the FP32 loss" compares losses that mean
something (with no noise floor both runs head to ~0 and relative gaps between tiny numbers grow).
"""
from __future__ import annotations

import torch

import fp8mp

NOISE = 0.3
NOISE_FLOOR = NOISE**2


def mlp(layer=torch.nn.Linear, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(layer(32, 64), torch.nn.GELU(), layer(64, 64), torch.nn.GELU(), layer(64, 1))


def train(model: torch.nn.Module, optimizer, fp8: bool, steps: int = 200, data_seed: int = 1) -> tuple[float, float]:
    """(first loss, mean of the last 20 losses); the same batches for every call with the same data_seed."""
    gen = torch.Generator().manual_seed(data_seed)
    w_true = torch.randn(32, 1, generator=gen) / 32**0.5
    losses = []
    for _ in range(steps):
        x = torch.randn(128, 32, generator=gen)
        y = torch.sin(2 * (x @ w_true)) + NOISE * torch.randn(128, 1, generator=gen)
        with fp8mp.fp8_autocast(enabled=fp8):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses[0], sum(losses[-20:]) / 20


def assert_learned(first: float, last: float) -> None:
    """The model really learned: well below its start and near the noise floor."""
    assert last < 0.25 * first and last < 1.25 * NOISE_FLOOR, (first, last)
