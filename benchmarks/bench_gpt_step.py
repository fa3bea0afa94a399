"""One training step of the example GPT (examples/gpt_model.py) in FP8, BF16 and FP32, same model and batch.

The step is examples/train_gpt.py's own `train_step` (forward, backward, clip, AdamW). Ratios are
peer time / FP8 time (> 1: FP8 faster). On CPU the FP8 GEMM is an emulation (decode + fp32 GEMM),
so FP8 is not expected to beat BF16 there: this measures the overhead of the FP8 path end to end.

    python benchmarks/bench_gpt_step.py [--device cpu|cuda] [--layers 4] [--d-model 256] [--batch-size 8]
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import fp8mp  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402
from timing import markdown_table, time_peers, where  # noqa: E402
from train_gpt import PRECISIONS, train_step  # noqa: E402

from fp8mp.recipe import DelayedScaling  # noqa: E402

DEFAULTS = {"cpu": dict(layers=4, d_model=256, batch_size=8), "cuda": dict(layers=12, d_model=1024, batch_size=16)}


def run(device: str, layers: int | None = None, d_model: int | None = None, batch_size: int | None = None) -> list[dict]:
    defaults = DEFAULTS[device]
    config = GPTConfig(n_layers=layers or defaults["layers"], d_model=d_model or defaults["d_model"])
    batch = batch_size or defaults["batch_size"]
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, config.vocab_size, (batch, config.context), generator=gen).to(device)
    y = torch.randint(0, config.vocab_size, (batch, config.context), generator=gen).to(device)
    recipe = DelayedScaling(amax_history_len=16)
    steps = {}
    for key, precision in PRECISIONS.items():
        torch.manual_seed(0)
        model = GPT(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        steps[key] = functools.partial(train_step, model, optimizer, x, y, precision, recipe, 1.0, device)
    # Three rounds of each peer in turn: one step's time moves by +-5 % with the host's other load, and a
    # peer timed alone in a slow second would carry all of it.
    timed = time_peers(steps, device, rounds=3, min_repeats=3, min_seconds=0.4)
    times = {key: seconds for key, (seconds, _) in timed.items()}
    shape = f"{config.n_layers} layers, d={config.d_model}, {batch}x{config.context} tokens"
    return [{"shape": shape, **{f"{k}_ms": t * 1e3 for k, t in times.items()}}]


def table(rows: list[dict], device: str) -> str:
    headers = ["model / batch", "FP8 ms", "BF16 ms", "FP32 ms", "BF16 / FP8", "FP32 / FP8"]
    cells = [[r["shape"], f"{r['fp8_ms']:.1f}", f"{r['bf16_ms']:.1f}", f"{r['fp32_ms']:.1f}",
              f"{r['bf16_ms'] / r['fp8_ms']:.2f}x", f"{r['fp32_ms'] / r['fp8_ms']:.2f}x"] for r in rows]
    return markdown_table(f"small-GPT training step (examples/train_gpt.py), {where(device)}", headers, cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args()
    print(table(run(args.device, args.layers, args.d_model, args.batch_size), args.device))


if __name__ == "__main__":
    main()
