"""Final loss over seeds: fp8mp's memory-lean recipe with every memory lever on, against BF16 and against the
memory-lean recipe without the newer levers, on the demo GPT and a tiny Hugging Face Llama.

Runs, per model and seed (the same initial weights, batches and learning-rate schedule; no gradient clipping in any
run, since the optimizer step in backward refuses a global clipping norm):

  BF16         fp32 parameters, torch.autocast(bfloat16), torch.optim.AdamW
  memory-lean  bf16 nn.Parameters, fp8mp's Linear layers under fp8_autocast(fp8_recipe=RowwiseScaling()),
               fp8mp.optim.AdamW with E4M3 states, activation functions saving FP8 and norms bf16
               (fp8mp.convert(model, fp8_saved_activations=True))
  every lever  memory-lean, and: the MLP's gated multiply and attention saving q, k, v in FP8
               (fp8mp.integrations.hf.use_fp8_saved_activations; the GPT: GPTConfig(fp8_saved_attention=True)), the
               LM head and loss chunked (use_chunked_loss; GPTConfig(chunked_loss=True)), and the optimizer step in
               backward (fp8mp.step_in_backward)

Models: the demo GPT of examples/gpt_model.py (train_gpt.py --quick's: 2 layers, d_model 128, 4 heads, context 64)
and a Llama from a transformers config (2 layers, hidden 128, 4 heads of 32 with 2 key-value heads, intermediate
384, vocabulary 256, untied head), both on train_gpt.py's byte corpus, batch 8 x 64, AdamW lr 1e-3 (warmup,
cosine), weight decay 0.1. The final loss is the validation loss over fixed batches at the last step, in each run's
own precision. Goal: every lever's mean over the seeds within 0.5% of BF16's; per seed, every lever against
memory-lean. `--ablations` adds the memory-lean recipe taken apart and varied (ABLATIONS: FP8 Linears alone, with
fp32 parameters and torch's AdamW; then with bf16 parameters and fp8mp's E4M3-state AdamW too, where memory-lean
adds the FP8-saved activation functions and bf16-saved norms; memory-lean with per-tensor DelayedScaling instead of
RowwiseScaling; memory-lean with the norms saving E4M3 too), each run's mean against BF16's.

    python benchmarks/loss_parity_memory_lean.py [--steps 150] [--seeds 5] [--models gpt,llama] [--threads 1]
                                                 [--ablations] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

import fp8mp  # noqa: E402
from results_json import record  # noqa: E402
from timing import markdown_table  # noqa: E402
from train_gpt import OPTIMIZERS, TrainConfig, batch_starts, get_batch, load_data, lr_at, set_lr  # noqa: E402

GOAL = 0.005  # every lever's mean final loss within 0.5% of BF16's
CONTEXT, BATCH, EVAL_BATCHES = 64, 8, 8


@dataclass(frozen=True)
class Run:
    name: str
    lean: bool  # bf16 parameters, FP8 Linears, FP8 AdamW states, FP8-saved norms and activations
    every_lever: bool = False  # + FP8-saved MLP multiply and attention, chunked loss, step in backward
    # The memory-lean recipe taken apart (--ablations): which of its parts (lean=False) a run has
    fp8_linears: bool = False  # fp8mp's Linear layers under fp8_autocast (else torch.autocast(bfloat16))
    lean_optimizer: bool = False  # bf16 parameters and fp8mp.optim.AdamW's E4M3 states (else fp32 and torch's)
    recipe: str = "rowwise"  # the FP8 Linears' recipe, a key of RECIPES
    norm_format: str = "bf16"  # what the norms save (fp8mp.memory.saved_activations's norm_format)


# The memory-lean recipe's FP8 scaling is rowwise: per-tensor scaling costs it about half a point of final loss
# on the tiny Llama (ABLATIONS).
RECIPES = {"rowwise": fp8mp.recipe.RowwiseScaling(), "delayed": fp8mp.recipe.DelayedScaling()}
RUNS = [Run("BF16", lean=False), Run("memory-lean", lean=True), Run("every lever", lean=True, every_lever=True)]
# Memory-lean less its FP8-saved activations, and less those and its optimizer; then memory-lean with per-tensor
# scaling, and with E4M3-saved norms: with BF16 and memory-lean, they tell which part of the recipe moves the loss.
ABLATIONS = [Run("FP8 Linears", lean=False, fp8_linears=True),
             Run("FP8 Linears + bf16 params + FP8 states", lean=False, fp8_linears=True, lean_optimizer=True),
             Run("memory-lean, DelayedScaling", lean=True, recipe="delayed"),
             Run("memory-lean, E4M3-saved norms", lean=True, norm_format="e4m3")]


def build(model_key: str, run: Run):
    """(model, loss of (model, x, y)); weights drawn from the current torch seed."""
    if model_key == "gpt":
        from gpt_model import GPT, GPTConfig

        config = GPTConfig(n_layers=2, d_model=128, n_heads=4, context=CONTEXT, fp8_saved_attention=run.every_lever,
                           chunked_loss=run.every_lever)
        return GPT(config), lambda m, x, y: m(x, y)[1]
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=384, vocab_size=256, max_position_embeddings=CONTEXT,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config), lambda m, x, y: m(input_ids=x, labels=y, shift_labels=y.contiguous()).loss


def prepared(model_key: str, run: Run, seed: int):
    """The run's model, loss function, optimizer and stepper (None: backward, then optimizer.step())."""
    torch.manual_seed(seed)
    model, loss_of = build(model_key, run)
    config = TrainConfig(lr=1e-3)
    head = model.get_output_embeddings() if model_key != "gpt" else None
    if not run.lean:
        if run.fp8_linears:
            model = fp8mp.convert(model, module_filter=lambda name, m: m is not head)
        if run.lean_optimizer:
            model = model.to(torch.bfloat16)
        return model, loss_of, OPTIMIZERS["fp8mp AdamW FP8" if run.lean_optimizer else "torch AdamW"](
            model.parameters(), config), None
    keep_head = lambda name, m: m is not head  # noqa: E731
    if run.norm_format == "bf16":  # (fp8mp.convert's own)
        model = fp8mp.convert(model, module_filter=keep_head, fp8_saved_activations=True)
    else:
        from fp8mp.memory.saved_activations import enable_fp8_saved_activations

        model = enable_fp8_saved_activations(fp8mp.convert(model, module_filter=keep_head), keep_head,
                                             norm_format=run.norm_format)
    model = model.to(torch.bfloat16)
    if run.every_lever and model_key != "gpt":
        import fp8mp.integrations.hf as fp8_hf

        fp8_hf.use_chunked_loss(model)
        fp8_hf.use_fp8_saved_activations(model)
    optimizer = OPTIMIZERS["fp8mp AdamW FP8"](model.parameters(), config)
    return model, loss_of, optimizer, fp8mp.step_in_backward(optimizer) if run.every_lever else None


def forward_context(run: Run):
    if run.lean or run.fp8_linears:
        return fp8mp.fp8_autocast(fp8_recipe=RECIPES[run.recipe])
    return torch.autocast("cpu", dtype=torch.bfloat16)


def train(model_key: str, run: Run, seed: int, steps: int, data, progress) -> dict:
    train_data, val_data = data
    config = TrainConfig(steps=steps, lr=1e-3, seed=seed)
    starts = batch_starts(train_data, steps, BATCH, CONTEXT, seed + 1)
    val_starts = batch_starts(val_data, EVAL_BATCHES, BATCH, CONTEXT, 2)
    model, loss_of, optimizer, stepper = prepared(model_key, run, seed)
    losses = []
    for step in range(steps):
        set_lr(optimizer, lr_at(step, config))
        x, y = get_batch(train_data, starts[step], CONTEXT)
        with forward_context(run):
            loss = loss_of(model, x, y)
        if stepper is not None:
            stepper.backward(loss)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
        progress.update(1)
    model.eval()
    with torch.no_grad(), forward_context(run):
        val = [loss_of(model, *get_batch(val_data, s, CONTEXT)).item() for s in val_starts]
    return {"model": model_key, "run": run.name, "seed": seed, "train_losses": losses, "final_val": sum(val) / len(val)}


def summary(model_key: str, rows: list[dict], seeds: int) -> tuple[str, dict]:
    final = {(r["run"], r["seed"]): r["final_val"] for r in rows if r["model"] == model_key}
    cells = []
    for seed in range(seeds):
        bf16, lean, every = (final[(run.name, seed)] for run in RUNS)
        cells.append([str(seed), f"{bf16:.4f}", f"{lean:.4f}", f"{every:.4f}", f"{(every / lean - 1) * 100:+.2f}%",
                      f"{(every / bf16 - 1) * 100:+.2f}%"])
    means = {run.name: statistics.mean(final[(run.name, s)] for s in range(seeds)) for run in RUNS}
    vs_bf16 = means["every lever"] / means["BF16"] - 1
    cells.append(["mean", *(f"{means[run.name]:.4f}" for run in RUNS),
                  f"{(means['every lever'] / means['memory-lean'] - 1) * 100:+.2f}%", f"{vs_bf16 * 100:+.2f}%"])
    table = markdown_table(f"final validation loss, {model_key}, {seeds} seeds",
                           ["seed", "BF16", "memory-lean", "every lever", "every lever vs memory-lean",
                            "every lever vs BF16"], cells)
    verdict = (f"{model_key}: every lever's mean final loss {vs_bf16 * 100:+.2f}% from BF16's "
               f"({'within' if abs(vs_bf16) <= GOAL else 'NOT within'} the goal of {GOAL * 100:.1f}%)")
    # How far 5 seeds resolve it: the standard error of the mean of the per-seed ratios (a chaotic model's is wide)
    ratios = [final[("every lever", seed)] / final[("BF16", seed)] - 1 for seed in range(seeds)]
    standard_error = statistics.stdev(ratios) / len(ratios) ** 0.5 if seeds > 1 else float("nan")
    verdict += f"; the per-seed ratios' standard error {standard_error * 100:.2f}%"
    return table + "\n" + verdict, {"means": means, "every_lever_vs_bf16": vs_bf16,
                                     "every_lever_vs_bf16_standard_error": standard_error}


def ablation_summary(model_key: str, rows: list[dict], seeds: int) -> tuple[str, dict]:
    """Each run's mean final loss over the seeds against BF16's (the main runs and the ablations)."""
    final = {(r["run"], r["seed"]): r["final_val"] for r in rows if r["model"] == model_key}
    names = [run.name for run in RUNS + ABLATIONS if (run.name, 0) in final]
    means = {name: statistics.mean(final[(name, s)] for s in range(seeds)) for name in names}
    cells = [[name, f"{means[name]:.4f}", f"{(means[name] / means['BF16'] - 1) * 100:+.2f}%",
              " ".join(f"{final[(name, s)]:.4f}" for s in range(seeds))] for name in names]
    table = markdown_table(f"the memory-lean recipe taken apart, {model_key}, mean final validation loss of {seeds} "
                           "seeds", ["run", "mean", "vs BF16", "per seed"], cells)
    return table, {name: means[name] / means["BF16"] - 1 for name in names}


def main(argv: list[str] | None = None) -> dict:
    from tqdm import tqdm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--models", default="gpt,llama", help="comma-separated, of gpt, llama")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine's steadier pick)")
    parser.add_argument("--ablations", action="store_true",
                        help="also the memory-lean recipe taken apart and varied (ABLATIONS), in a table of means "
                             "against BF16")
    parser.add_argument("--json", default=None, help="add the figures to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    for key in models:
        if key not in ("gpt", "llama"):
            parser.error(f"argument --models: {key!r} is not one of gpt, llama")
    if args.steps < 1 or args.seeds < 1 or args.threads < 1:
        parser.error("arguments --steps, --seeds and --threads must be >= 1")
    data = load_data(TrainConfig())
    runs = RUNS + ABLATIONS if args.ablations else RUNS
    jobs = [(key, run, seed) for key in models for seed in range(args.seeds) for run in runs]
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        with tqdm(total=len(jobs) * args.steps, desc="steps", unit="step", dynamic_ncols=True) as progress:
            for key, run, seed in jobs:
                progress.set_postfix_str(f"{key} {run.name} seed {seed}")
                rows.append(train(key, run, seed, args.steps, data, progress))
                progress.write(f"{key} {run.name} seed {seed}: final validation loss {rows[-1]['final_val']:.4f}")
    finally:
        torch.set_num_threads(threads)
    figures = {"steps": args.steps, "seeds": args.seeds, "rows": rows, "summary": {}}
    for key in models:
        text, figures["summary"][key] = summary(key, rows, args.seeds)
        print(text + "\n")
        if args.ablations:
            text, figures["summary"][key]["ablations_vs_bf16"] = ablation_summary(key, rows, args.seeds)
            print(text + "\n")
    record(args.json, "loss_parity_memory_lean", figures)
    return figures


if __name__ == "__main__":
    main()
