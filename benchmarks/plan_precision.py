"""fp8mp.plan_precision on the demo GPT (examples/gpt_model.py) with planted outliers and without.

The planted outliers: 4 hidden channels of the last block's MLP made 30000x larger (through its GELU), the columns
of `mlp.proj` that read them 30000x smaller, so the network computes about what it did but `mlp.proj`'s input
spans ~19 binades, more than one per-tensor E4M3 scale holds (at 1000x a Gaussian bulk still fits: see
tests/planning/planted_models.py). For each model the script prints the plan's table, the time planning took, the
share of GEMM FLOPs the plan runs in FP8 and the rank correlation between the sensitivity estimate and the
measured one-layer loss change, and writes the plan's plot.

    python benchmarks/plan_precision.py                      # real timings of this device
    python benchmarks/plan_precision.py --memory-first       # FP8 even where slower than high precision
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import fp8mp  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402

FACTOR, CHANNELS = 30000.0, 4


def build(planted: bool, config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    model = fp8mp.unconvert(GPT(config))  # torch modules: what a plan plans and convert converts
    if planted:
        mlp = model.blocks[-1].mlp
        with torch.no_grad():
            picked = torch.arange(CHANNELS)
            mlp.fc.weight[picked] *= FACTOR
            mlp.fc.bias[picked] += 0.5 * FACTOR
            mlp.proj.weight[:, picked] /= FACTOR
    return model


def batches(config: GPTConfig, count: int, rows: int, seed: int) -> list[torch.Tensor]:
    """Byte sequences stepping up by 1, 2 or 3 (mod 256)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        start = torch.randint(0, 256, (rows, 1), generator=generator)
        steps = torch.randint(1, 4, (rows, config.context - 1), generator=generator)
        out.append(torch.cat([start, start + steps.cumsum(1)], 1) % 256)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-first", action="store_true")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--out-dir", default=".", help="where the plots (and the plans' JSON) go")
    args = parser.parse_args()
    config = GPTConfig(n_layers=args.layers, d_model=args.d_model, n_heads=4, context=args.context)
    data = batches(config, args.batches, args.rows, args.seed + 1)
    print(f"demo GPT {args.layers} x d{args.d_model}, {args.batches} batches of {args.rows} x {args.context} tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for planted in (False, True):
        name = "planted" if planted else "clean"
        model = build(planted, config, args.seed)
        started = time.perf_counter()
        plan = fp8mp.plan_precision(model, data, loss_fn=lambda m, b: m(b, b)[1], budget=args.budget,
                                    memory_first=args.memory_first, measure_loss=True, progress=False)
        seconds = time.perf_counter() - started
        correlation = plan.notes["rank_correlation"]
        print(f"\n== {name}: {seconds:.1f} s to plan, {100 * plan.fp8_flop_share:.1f}% of GEMM FLOPs in FP8, "
              f"rank correlation {correlation['sensitivity_vs_abs_measured']:.3f} (sensitivity vs |measured|), "
              f"{correlation['estimate_vs_measured']:.3f} (estimate vs measured) over {correlation['pairs']} pairs, "
              f"curvature scale {plan.notes['curvature_scale']:.1f}")
        print(plan)
        os.makedirs(args.out_dir, exist_ok=True)
        plan.save(os.path.join(args.out_dir, f"plan_precision_{name}.json"))
        try:
            print("plot:", plan.plot(os.path.join(args.out_dir, f"plan_precision_{name}.png")))
        except ImportError as error:
            print(f"plot skipped: {error}")


if __name__ == "__main__":
    main()
