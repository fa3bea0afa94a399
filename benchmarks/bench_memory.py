"""Weight memory of FP8 weight storage (`fp8mp.fp8_model_init`) against FP32, per layer and for an MLP;
with --device cuda also the peak GPU memory of a training step.

Bytes are those of the module's state_dict (parameters and persistent buffers): for FP32 the weight
and bias, for FP8 storage the float8_e4m3fn weight, the fp32 bias and two 4-byte scales. The FP32
master weights live in `fp8mp.optim.MasterWeightOptimizer`, with the optimizer state, not in the model.

Peak GPU memory (torch.cuda.max_memory_allocated over two steps, less what was allocated before the
model): forward, backward and AdamW step of one MLP block on bf16 activations, as a bf16 nn.Linear model,
as fp8mp.nn.Linear with FP32 weights under fp8_autocast, and with FP8 weight storage and
MasterWeightOptimizer. On the CPU the same steps run, and no peak is measured.

    python benchmarks/bench_memory.py [--device cpu|cuda] [--step-widths 4096x16384x4096] [--tokens 8192]
"""
from __future__ import annotations

import argparse

import torch

import fp8mp
from fp8mp.nn.fp8_state_dict import state_dict_bytes

from results_json import record
from timing import markdown_table, parse_shapes, where

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


def training_step_peak(device: str, precision: str, widths: list[int], tokens: int) -> int | None:
    """Bytes of GPU memory a training step's peak adds (None on the CPU); precision 'bf16', 'fp8' or 'fp8 weights'."""
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    torch.manual_seed(0)
    with torch.device(device):
        if precision == "bf16":
            model = mlp(widths, torch.nn.Linear).bfloat16()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        elif precision == "fp8":
            model = mlp(widths, fp8mp.nn.Linear)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        else:
            with fp8mp.fp8_model_init():
                model = mlp(widths, fp8mp.nn.Linear)
            optimizer = fp8mp.optim.MasterWeightOptimizer(lambda params: torch.optim.AdamW(params, lr=1e-4), model)
        x = torch.randn(tokens, widths[0], dtype=torch.bfloat16)
    for _ in range(2):  # the second step has the optimizer state of the first
        with fp8mp.fp8_autocast(enabled=precision != "bf16"):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if not cuda:
        return None
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del model, optimizer, x, loss
    return peak


STEP_PRECISIONS = ["bf16", "fp8", "fp8 weights"]


def step_table(rows: list[dict], device: str) -> str:
    def mib(n):
        return "n/a" if n is None else f"{n / 2**20:,.0f}"

    cells = [[r["model"], str(r["tokens"])] + [mib(r[p]) for p in STEP_PRECISIONS]
             + ["n/a" if r[p] is None else f"{r[p] / r['bf16']:.2f}" for p in STEP_PRECISIONS[1:]] for r in rows]
    headers = ["model", "tokens", "BF16 MiB", "FP8 MiB", "FP8 weights MiB", "FP8 / BF16", "FP8 weights / BF16"]
    return markdown_table(f"peak GPU memory of a training step (forward, backward, AdamW), {where(device)}", headers,
                          cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--step-widths", default="4096x16384x4096", help="the MLP of the training step, AxBxC...")
    parser.add_argument("--tokens", type=int, default=8192, help="rows of the training step's input")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    rows = run()
    print(table(rows))
    record(args.json, "weight_memory", rows)
    if args.device == "cuda" or args.json:
        widths = list(parse_shapes(args.step_widths)[0])
        step = {"model": "MLP " + "-".join(map(str, widths)), "tokens": args.tokens}
        step.update({p: training_step_peak(args.device, p, widths, args.tokens) for p in STEP_PRECISIONS})
        print()
        print(step_table([step], args.device))
        record(args.json, "training_step_peak_memory", [step])


if __name__ == "__main__":
    main()
