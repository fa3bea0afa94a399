"""Weight memory of FP8 weight storage (`fp8mp.fp8_model_init`) against FP32, per layer and for an MLP.

Bytes are those of the module's state_dict (parameters and persistent buffers): for FP32 the weight
and bias, for FP8 storage the float8_e4m3fn weight, the fp32 bias and two 4-byte scales. The FP32
master weights live in `fp8mp.optim.MasterWeightOptimizer`, with the optimizer state, not in the model.

    python benchmarks/bench_memory.py
"""
from __future__ import annotations

import torch

import fp8mp
from fp8mp.nn.fp8_weight import state_dict_bytes

from timing import markdown_table

LAYERS = [(64, 64), (1024, 1024), (4096, 1024), (4096, 4096)]
MLP_WIDTHS = [512, 2048, 2048, 512]


def mlp(widths: list[int], layer) -> torch.nn.Module:
    blocks = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        blocks += [layer(a, b)] + ([torch.nn.GELU()] if i < len(widths) - 2 else [])
    return torch.nn.Sequential(*blocks)


def row(name: str, build) -> dict:
    fp32 = build(torch.nn.Linear)
    with fp8mp.fp8_model_init():
        fp8 = build(fp8mp.nn.Linear)
    fp32_bytes, fp8_bytes = state_dict_bytes(fp32), state_dict_bytes(fp8)
    return {"model": name, "fp32": fp32_bytes, "fp8": fp8_bytes, "ratio": fp8_bytes / fp32_bytes}


def run(device: str = "cpu") -> list[dict]:
    """Sizes do not depend on the device: the layers are built on the CPU."""
    rows = [row(f"Linear {k}->{n}", lambda layer, k=k, n=n: layer(k, n)) for k, n in LAYERS]
    rows.append(row("MLP " + "-".join(map(str, MLP_WIDTHS)), lambda layer: mlp(MLP_WIDTHS, layer)))
    return rows


def table(rows: list[dict], device: str = "cpu") -> str:
    cells = [[r["model"], f"{r['fp32']:,}", f"{r['fp8']:,}", f"{r['ratio']:.4f}"] for r in rows]
    return markdown_table("weight memory: FP8 storage vs FP32", ["model", "FP32 bytes", "FP8 bytes", "ratio"], cells)


def main() -> None:
    print(table(run()))


if __name__ == "__main__":
    main()
