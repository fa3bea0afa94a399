"""FP8 Linear forward + backward vs its peers, measured in the same run.

CPU peers: torch.nn.Linear in fp32 and bf16, and torchao's Float8Linear with
emulate=True (torchao's own CPU path for FP8 training). CUDA peers: nn.Linear
in bf16 and a torch._scaled_mm forward (when a CUDA device and fp8mp's CUDA
kernels are present). Ratios are peer time / fp8mp time (> 1: fp8mp faster).
On CPU fp8mp is fed fp32 activations (its "fp8mp ms" column, as the fp32 and
torchao peers are) and, in the last two columns, the bf16 input and gradient the
bf16 peer gets.

    python benchmarks/bench_linear.py [--device cpu|cuda] [--shapes 4096x1024x1024,8192x2048x2048]

A shape MxKxN is a batch of M rows, K input features, N output features.
"""
from __future__ import annotations

import argparse
import copy

import torch

import fp8mp
from fp8mp.recipe import DelayedScaling

from results_json import record
from timing import markdown_table, parse_shapes, time_peers, where


DEFAULT_SHAPES = {"cpu": "4096x1024x1024,8192x2048x2048", "cuda": "4096x4096x4096,16384x8192x8192"}


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
    fp8_x, fp8_g = (x32, g32) if device == "cpu" else (x16, g16)
    steps = {"fp8mp": fwd_bwd(fp8_layer, fp8_x, fp8_g, fp8=True)}
    if device == "cpu":
        steps["fp32"] = fwd_bwd(base, x32, g32)
        # The same layer fed the bf16 input and gradient the bf16 peer gets (activations in bf16, as under autocast).
        steps["fp8mp_bf16_in"] = fwd_bwd(copy.deepcopy(fp8_layer), x16, g16, fp8=True)
    steps["bf16"] = fwd_bwd(copy.deepcopy(base).bfloat16(), x16, g16)
    ao = torchao_emulated(base) if device == "cpu" else None
    if ao is not None:
        steps["torchao_emulate"] = fwd_bwd(ao, x32, g32)
    timed = time_peers(steps, device)
    row = {"shape": f"{m}x{k}x{n}", "torchao_emulate_ms": float("nan")}
    row.update({f"{name}_ms": seconds * 1e3 for name, (seconds, _) in timed.items()})
    row["page_faults"] = {name: faults for name, (_, faults) in timed.items()}
    return row


def peers(device: str) -> list[str]:
    return ["fp32_ms", "bf16_ms", "torchao_emulate_ms"] if device == "cpu" else ["bf16_ms"]


def table(rows: list[dict], device: str) -> str:
    names = [p.replace("_ms", "") for p in peers(device)]
    headers = ["M x K x N", "fp8mp ms"] + [f"{n} ms" for n in names] + [f"vs {n}" for n in names]
    cells = [[r["shape"], f"{r['fp8mp_ms']:.1f}"] + [f"{r[p]:.1f}" for p in peers(device)]
             + [f"{r[p] / r['fp8mp_ms']:.2f}x" for p in peers(device)] for r in rows]
    if device == "cpu":  # fp8mp with bf16 activations against the bf16 layer
        headers += ["fp8mp bf16-in ms", "bf16-in vs bf16"]
        for r, row_cells in zip(rows, cells):
            row_cells += [f"{r['fp8mp_bf16_in_ms']:.1f}", f"{r['bf16_ms'] / r['fp8mp_bf16_in_ms']:.2f}x"]
    text = markdown_table(f"fp8mp.nn.Linear forward+backward, {where(device)}", headers, cells)
    if device == "cpu":  # the allocator's share (timing.time_peers): fresh pages cost about 1 us per 4 KiB
        text += "\n\nminor page faults per step: " + "; ".join(
            f"{r['shape']}: " + ", ".join(f"{name} {faults:.0f}" for name, faults in r["page_faults"].items())
            for r in rows)
    return text


def run(device: str, shapes: str | None = None) -> list[dict]:
    return [bench_shape(m, k, n, device) for m, k, n in parse_shapes(shapes or DEFAULT_SHAPES[device])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", default=None, help="comma-separated MxKxN (default depends on device)")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    rows = run(args.device, args.shapes)
    print(table(rows, args.device))
    record(args.json, "linear", rows)


if __name__ == "__main__":
    main()
