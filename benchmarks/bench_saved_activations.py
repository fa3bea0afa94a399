"""Saved-for-backward bytes of the demo GPT by category, and what FP8 storage of norm and activation inputs saves.

One training forward of examples/gpt_model.py's GPT (by default the shape of the memory table: d_model 512,
4 layers, 8 heads, batch 8 x 128), counted with fp8mp.training.saved_tensor_bytes (each storage once,
parameters left out) in four runs: FP32; BF16 AMP (torch.autocast bf16); fp8mp FP8 (fp8_autocast inside
bf16 autocast, delayed scaling, one step first so the scales exist); and the same with
``fp8mp.convert(model, fp8_saved_activations=True)``. Categories, by the innermost module whose forward
saved the storage: norm (LayerNorm), activation fn (GELU), Linear (inputs and, outside FP8, the weight's
bf16 copy; FP8 in the FP8 runs), attention (SDPA's q, k, v, output and statistics), other (embeddings,
LM head, loss). Ratios are against BF16 AMP in the same run, and so is the step time (forward +
backward, median of --repeats).

A second table compares the two ways to store a module's saved tensors in FP8, per module on a
[tokens, hidden] fp32 input: the saved-tensor hooks around torch's own ops (fp8mp's mechanism) and a
fused autograd function saving exactly what backward needs (fp8mp's fused norms: one tensor; for
GELU a hand-written function saving its input in FP8): bytes, and the gradient's largest error
against fp64 relative to the gradient's largest magnitude.

    python benchmarks/bench_saved_activations.py [--d-model 512 --layers 4 --heads 8 --batch 8 --context 128]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import fp8mp
from fp8mp.memory.saved_activations import (dequantize_saved, disable_fp8_saved_activations, enable_fp8_saved_activations,
                                        quantize_saved)
from fp8mp.memory.saved_tensors import saved_tensor_bytes

from results_json import record
from timing import markdown_table, where

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt_model import GPT, CausalSelfAttention, GPTConfig  # noqa: E402

CATEGORIES = ["norm", "activation fn", "Linear", "attention", "other"]
RUNS = ["FP32", "BF16 AMP", "fp8mp FP8", "fp8mp FP8 + FP8 saved activations"]
MIB = 2 ** 20


def category(module: torch.nn.Module | None) -> str:
    if module is None:
        return "other"
    if type(module).__name__.endswith(("LayerNorm", "RMSNorm")):
        return "norm"
    if isinstance(module, torch.nn.GELU):
        return "activation fn"
    if isinstance(module, torch.nn.Linear):
        return "Linear"
    if isinstance(module, CausalSelfAttention):
        return "attention"
    return "other"


def gpt_run(run: str, config: GPTConfig, batch: int, repeats: int) -> dict:
    torch.manual_seed(0)
    model = GPT(config)
    if run == RUNS[3]:
        fp8mp.convert(model, fp8_saved_activations=True)
    idx = torch.randint(0, config.vocab_size, (batch, config.context), generator=torch.Generator().manual_seed(1))

    def forward():
        with contextlib.ExitStack() as stack:
            if run != "FP32":
                stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            stack.enter_context(fp8mp.fp8_autocast(enabled=run.startswith("fp8mp")))
            return model(idx, idx)[1]

    forward().backward()  # delayed scaling's first step
    counts = saved_tensor_bytes(forward, model, category)
    seconds = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        forward().backward()
        seconds.append(time.perf_counter() - start)
    return {"run": run, **{c: counts.get(c, 0) for c in CATEGORIES}, "total": counts["total"],
            "step_s": statistics.median(seconds)}


def gpt_table(rows: list[dict], title: str) -> str:
    base = rows[1]
    cells = [[r["run"]] + [f"{r[c] / MIB:.2f}" for c in CATEGORIES] + [f"{r['total'] / MIB:.2f}",
             f"{r['total'] / base['total']:.3f}", f"{r['step_s'] / base['step_s']:.2f}"] for r in rows]
    return markdown_table(title, ["run"] + [f"{c} MiB" for c in CATEGORIES] + ["total MiB", "vs BF16 AMP",
                                                                                "step time vs BF16 AMP"], cells)


class Fp8SavedGELU(torch.autograd.Function):
    """GELU saving its input in FP8 itself (the fused alternative to the hooks, for comparison)."""

    @staticmethod
    def forward(ctx, x):
        data, scale_inv = quantize_saved(x)
        ctx.save_for_backward(data, scale_inv)
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx, grad):
        x = dequantize_saved(*ctx.saved_tensors, ctx.shape, ctx.dtype).requires_grad_()
        with torch.enable_grad():
            (dx,) = torch.autograd.grad(torch.nn.functional.gelu(x), x, grad)
        return dx


class FusedGELU(torch.nn.Module):
    def forward(self, x):
        return Fp8SavedGELU.apply(x)


MECHANISMS = [  # (module, how it stores in FP8, make)
    ("LayerNorm", "hooks around torch.nn.LayerNorm", lambda h: enable_fp8_saved_activations(torch.nn.LayerNorm(h))),
    ("LayerNorm", "hooks around fp8mp.nn.LayerNorm (fused op)", lambda h: enable_fp8_saved_activations(fp8mp.nn.LayerNorm(h))),
    ("RMSNorm", "hooks around torch.nn.RMSNorm", lambda h: enable_fp8_saved_activations(torch.nn.RMSNorm(h))),
    ("RMSNorm", "hooks around transformers LlamaRMSNorm", lambda h: enable_fp8_saved_activations(LlamaRMSNorm(h))),
    ("RMSNorm", "hooks around fp8mp.nn.RMSNorm (fused op)", lambda h: enable_fp8_saved_activations(fp8mp.nn.RMSNorm(h))),
    ("GELU", "hooks around torch.nn.GELU", lambda h: enable_fp8_saved_activations(torch.nn.GELU())),
    ("GELU", "autograd function saving FP8", lambda h: FusedGELU()),
]


def without_fp8(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` that stores nothing in FP8 (the fused GELU's is torch's GELU)."""
    if isinstance(module, FusedGELU):
        return torch.nn.GELU()
    return disable_fp8_saved_activations(copy.deepcopy(module))


def mechanism_rows(tokens: int, hidden: int) -> list[dict]:
    torch.manual_seed(0)
    leaf = torch.randn(tokens, hidden, requires_grad=True)
    dy = torch.randn(tokens, hidden)
    rows = []
    for kind, how, make in MECHANISMS:
        module = make(hidden)
        plain = without_fp8(module)
        x64 = leaf.detach().double().requires_grad_()
        reference = copy.deepcopy(plain.to_torch() if hasattr(plain, "to_torch") else plain).double()  # fp8mp's norms take no fp64
        (exact,) = torch.autograd.grad(reference(x64 * 1), x64, dy.double())
        x = leaf * 1
        (grad,) = torch.autograd.grad(module(x), leaf, dy)
        rows.append({"module": kind, "how": how, "plain_bytes": saved_tensor_bytes(lambda: plain(x))["total"],
                     "fp8_bytes": saved_tensor_bytes(lambda: module(x))["total"],
                     "grad_error": ((grad.double() - exact).abs().max() / exact.abs().max()).item()})
    return rows


def mechanism_table(rows: list[dict], tokens: int, hidden: int) -> str:
    cells = [[r["module"], r["how"], f"{r['plain_bytes'] / MIB:.3f}", f"{r['fp8_bytes'] / MIB:.3f}",
              f"{r['fp8_bytes'] / r['plain_bytes']:.3f}", f"{r['grad_error']:.2e}"] for r in rows]
    return markdown_table(f"saved-tensor hooks vs fused functions, fp32 input [{tokens}, {hidden}]",
                          ["module", "FP8 storage by", "fp32 MiB", "FP8 MiB", "ratio", "max |dx - dx_fp64| / max |dx_fp64|"],
                          cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per run (the median is reported)")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args()
    config = GPTConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads, context=args.context)
    rows = [gpt_run(run, config, args.batch, args.repeats) for run in RUNS]
    title = (f"saved for backward, demo GPT d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
             f"batch {args.batch} x {args.context}, {where('cpu')}")
    print(gpt_table(rows, title))
    tokens = args.batch * args.context
    print()
    mechanisms = mechanism_rows(tokens, args.d_model)
    print(mechanism_table(mechanisms, tokens, args.d_model))
    record(args.json, "saved_activations", {"gpt": rows, "mechanisms": mechanisms})


if __name__ == "__main__":
    main()
