"""Models whose sensitive layer is known by construction, their calibration batches, and pinned layer times.

A planted outlier: a few hidden channels made `factor` times larger feeding one Linear (the "massive activations"
of real LLMs), the weight columns that read them divided by the same factor, so the network computes about what
it did. Their input range then exceeds what one per-tensor E4M3 scale holds: the bulk's values sit log2(factor)
binades further below the scale's maximum, among E4M3's subnormals. (At 1000x, E4M3's 17.8 binades still hold a
Gaussian bulk: a per-tensor output SQNR of 28.7 dB against 29.0 for rowwise; the planted factor is 30000x.)
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import fp8mp  # noqa: E402
from fp8mp.planning.layers import planned_layers  # noqa: E402
from fp8mp.planning.speed import cache_key, clear_cache  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402

FACTOR = 30000.0
CHANNELS = 4
PER_TENSOR = ("delayed", "current")
FINE_GRAINED = ("block", "mxfp8")  # finer than a row: a row of x holds every outlier channel, so rowwise cannot help
# Pinned forward + backward times (ms): FP8 faster than high precision, per-tensor the fastest (a GPU's order).
TIMES = {"bf16": 2.0, "delayed": 1.0, "current": 1.05, "rowwise": 1.2, "block": 1.3, "mxfp8": 1.4}


def plant(fc: torch.nn.Linear, reader: torch.nn.Linear, factor: float = FACTOR, channels: int = CHANNELS) -> None:
    """Make `channels` outputs of `fc` (positive, through a GELU) `factor` times larger, and the columns of `reader`
    that read them `factor` times smaller."""
    with torch.no_grad():
        picked = torch.arange(channels)
        fc.weight[picked] *= factor
        fc.bias[picked] += 0.5 * factor
        reader.weight[:, picked] /= factor


class MLP(torch.nn.Module):
    """x -> fc1 -> GELU -> fc2 -> GELU -> fc3, the loss an MSE against a fixed random teacher's output."""

    def __init__(self, planted: bool, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(32, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 32)
        self.act = torch.nn.GELU()
        if planted:
            plant(self.fc1, self.fc2)

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def mlp_batches(count: int = 2, rows: int = 256, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 32, generator=generator) / 32**0.5
    batches = []
    for _ in range(count):
        x = torch.randn(rows, 32, generator=generator)
        batches.append((x, torch.tanh(x @ teacher)))
    return batches


def mlp_loss(model, batch):
    x, target = batch
    return torch.nn.functional.mse_loss(model(x), target)


def gpt(planted: bool, seed: int = 0, d_model: int = 64) -> GPT:
    """The demo GPT (examples/gpt_model.py) as torch modules (unconverted, what a plan plans), outliers planted in
    the last block's MLP: they feed `blocks.1.mlp.proj`."""
    torch.manual_seed(seed)
    model = fp8mp.unconvert(GPT(GPTConfig(n_layers=2, d_model=d_model, n_heads=4, context=32)))
    if planted:
        plant(model.blocks[1].mlp.fc, model.blocks[1].mlp.proj)
    return model


def gpt_batches(count: int = 2, rows: int = 4, seed: int = 1) -> list[torch.Tensor]:
    """Byte sequences that step up by 1, 2 or 3: a pattern a GPT can learn."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        start = torch.randint(0, 256, (rows, 1), generator=generator)
        steps = torch.randint(1, 4, (rows, 31), generator=generator)
        batches.append(torch.cat([start, start + steps.cumsum(1)], 1) % 256)
    return batches


def gpt_loss(model, batch):
    return model(batch, batch)[1]


def pinned_times(model: torch.nn.Module, tokens: int, path, times: dict = TIMES) -> str:
    """Write a speed cache at `path` giving every planned layer of `model` `times` (split half forward, half
    backward) at `tokens` rows, and forget this process's measured times. Returns the path."""
    clear_cache()
    candidates = fp8mp.planning.default_candidates()
    entries = {}
    for layer in planned_layers(model):
        for name, ms in times.items():
            recipe = None if name == "bf16" else candidates[name]
            key = cache_key(layer.module.weight.device, layer.module.weight.dtype, tokens, layer.in_features,
                            layer.out_features, recipe)
            entries[key] = {"forward": ms / 2, "backward": ms / 2}
    with open(path, "w") as f:
        json.dump(entries, f)
    return os.fspath(path)
