"""SQNR of fp8mp.nn.Linear's output under each recipe, on inputs with and without outliers.

SQNR = 20 log10(||y_fp32|| / ||y_fp8 - y_fp32||) in dB, over the whole output ("tensor") and per
output row (one token; "row median" and "row p10", the 10th percentile, i.e. the worst tokens).
Weights are Gaussian [N, K]; the inputs:

  gaussian         x ~ N(0, 1)
  outlier channels 1% of the K channels 100x larger (outlier features)
  token scales 1e5 each token (row) scaled by 10^U(0, 5)
  lognormal rows   each token scaled by exp(N(0, 3^2))

Every recipe is E4M3 forward; tensorwise is CurrentScaling (one scale per tensor, from its amax).

    python benchmarks/sqnr_recipes.py [--tokens 512] [--k 1024] [--n 512] [--seed 0]
"""
from __future__ import annotations

import argparse
import math

import torch

import fp8mp
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, Format, MXFP8Scaling, RowwiseScaling

RECIPES = {
    "tensorwise (current)": CurrentScaling(fp8_format=Format.E4M3),
    "rowwise (pow2)": RowwiseScaling(),
    "block 1x128/128x128": BlockScaling(),
    "MXFP8 1x32 (rceil)": MXFP8Scaling(),
}


def inputs(kind: str, tokens: int, k: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(tokens, k, generator=g)
    if kind == "outlier channels":
        channels = torch.randperm(k, generator=g)[: max(1, k // 100)]
        x[:, channels] *= 100.0
    elif kind == "token scales 1e5":
        x *= torch.pow(10.0, torch.rand(tokens, 1, generator=g) * 5)
    elif kind == "lognormal rows":
        x *= torch.exp(torch.randn(tokens, 1, generator=g) * 3)
    return x


def sqnr(ref: torch.Tensor, approx: torch.Tensor, dim=None) -> torch.Tensor:
    ref, approx = ref.double(), approx.double()
    signal = ref.pow(2).sum(dim=dim)
    noise = (ref - approx).pow(2).sum(dim=dim)
    return 10 * torch.log10(signal / noise)


def measure(kind: str, args) -> dict:
    g = torch.Generator().manual_seed(args.seed)
    x = inputs(kind, args.tokens, args.k, g)
    layer = fp8mp.nn.Linear(args.k, args.n, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(args.n, args.k, generator=g) / math.sqrt(args.k))
        ref = x @ layer.weight.T
    rows = {}
    for name, recipe in RECIPES.items():
        with fp8mp.fp8_autocast(fp8_recipe=recipe), torch.no_grad():
            out = layer(x)
        per_row = sqnr(ref, out, dim=1)
        rows[name] = (sqnr(ref, out).item(), per_row.median().item(), per_row.quantile(0.1).item())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"Linear [{args.tokens} x {args.k}] @ [{args.k} x {args.n}], seed {args.seed}; SQNR in dB "
          "(tensor / row median / row p10)\n")
    kinds = ["gaussian", "outlier channels", "token scales 1e5", "lognormal rows"]
    results = {kind: measure(kind, args) for kind in kinds}
    print("| recipe | " + " | ".join(kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for name in RECIPES:
        cells = [" / ".join(f"{v:.1f}" for v in results[kind][name]) for kind in kinds]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
