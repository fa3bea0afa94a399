"""FP8 Linear forward + backward vs its peers, measured in the same run.

CPU peers: torch.nn.Linear in fp32 and bf16, and torchao's Float8Linear with
emulate=True (torchao's own CPU path for FP8 training). CUDA peers: nn.Linear
in bf16 and a torch._scaled_mm forward (when a CUDA device and fp8mp's CUDA
kernels are present). Ratios are peer time / fp8mp time (> 1: fp8mp faster).

    python benchmarks/bench_linear.py [--device cpu|cuda] [--shapes 4096x1024x1024,8192x2048x2048]

A shape MxKxN is a batch of M rows, K input features, N output features.
"""
from __future__ import annotations

import argparse
import copy

import torch

import fp8mp
from fp8mp.recipe import DelayedScaling

from bench_cast import median_time


def parse_shape(text: str) -> tuple[int, int, int]:
    m, k, n = (int(v) for v in text.lower().split("x"))
    return m, k, n


def torchao_emulated(linear: torch.nn.Linear) -> torch.nn.Module | None:
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    model = torch.nn.Sequential(copy.deepcopy(linear))
    convert_to_float8_training(model, config=Float8LinearConfig(emulate=True))
    return model


def fwd_bwd(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, fp8: bool = False):
    def step():
        with fp8mp.fp8_autocast(enabled=fp8, fp8_recipe=RECIPE):
            out = module(x)
        out.backward(grad)

    return step


RECIPE = DelayedScaling(amax_history_len=16)


def bench_shape(m: int, k: int, n: int, device: str) -> dict:
    torch.manual_seed(0)
    base = torch.nn.Linear(k, n, device=device)
    fp8_layer = fp8mp.nn.Linear(k, n, device=device)
    fp8_layer.load_state_dict(base.state_dict())
    x32 = torch.randn(m, k, device=device, requires_grad=True)
    g32 = torch.randn(m, n, device=device)
    x16 = x32.detach().bfloat16().requires_grad_(True)
    g16 = g32.bfloat16()
    row = {"shape": f"{m}x{k}x{n}"}
    row["fp8mp_ms"] = median_time(fwd_bwd(fp8_layer, x32 if device == "cpu" else x16, g32 if device == "cpu" else g16, fp8=True), device) * 1e3
    if device == "cpu":
        row["fp32_ms"] = median_time(fwd_bwd(base, x32, g32), device) * 1e3
    row["bf16_ms"] = median_time(fwd_bwd(copy.deepcopy(base).bfloat16(), x16, g16), device) * 1e3
    ao = torchao_emulated(base) if device == "cpu" else None
    row["torchao_emulate_ms"] = median_time(fwd_bwd(ao, x32, g32), device) * 1e3 if ao is not None else float("nan")
    return row


def format_table(rows: list[dict], device: str) -> str:
    peers = ["fp32_ms", "bf16_ms", "torchao_emulate_ms"] if device == "cpu" else ["bf16_ms"]
    head = "| shape (MxKxN) | fp8mp ms | " + " | ".join(p.replace("_ms", " ms") for p in peers) + " | " + " | ".join(
        f"vs {p.replace('_ms', '')}" for p in peers
    ) + " |"
    lines = [f"### fp8mp.nn.Linear forward+backward, {device}, {torch.get_num_threads()} threads", "", head,
             "|" + "---|" * (2 + 2 * len(peers))]
    for r in rows:
        times = " | ".join(f"{r[p]:.1f}" for p in peers)
        ratios = " | ".join(f"{r[p] / r['fp8mp_ms']:.2f}x" for p in peers)
        lines.append(f"| {r['shape']} | {r['fp8mp_ms']:.1f} | {times} | {ratios} |")
    return "\n".join(lines)


def run(device: str, shapes: list[tuple[int, int, int]]) -> list[dict]:
    return [bench_shape(m, k, n, device) for m, k, n in shapes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", default="4096x1024x1024,8192x2048x2048")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    rows = run(args.device, [parse_shape(s) for s in args.shapes.split(",")])
    print(format_table(rows, args.device))


if __name__ == "__main__":
    main()
