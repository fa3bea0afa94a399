"""FSDP2 on CPU (gloo): bytes all-gathered and reduce-scattered a step, training state per rank, step time.

A Hugging Face Llama from a tiny config (LlamaForCausalLM; hidden 512, 4 layers, 8 heads, intermediate 1408,
vocabulary 1024, untied head: 13.8M parameters), `fully_shard` per decoder layer and the root, trained on
random tokens (batch 2 x 64 per rank) by N processes started here (torch.multiprocessing, gloo over
loopback), for each N of --ranks. Runs, in each process one after the other, from the same initial weights:

  bf16 FSDP2             bf16 parameters, torch.optim.AdamW (bf16 states), no FP8: the reference
  fp8mp memory-lean      bf16 parameters, fp8mp.convert(fp8_saved_activations=True) (the LM head kept in
                         bf16), fp8mp.optim.AdamW with E4M3 states (bf16 states for the 1-D norms, whose
                         shards are not whole 128-element blocks), fp8_autocast(fp8_group=WORLD)
  + FP8 all-gather       the same with convert(..., fp8_all_gather=True): FSDP2 gathers the Linear weights
                         as E4M3 codes
  torchao Float8         torchao.float8.convert_to_float8_training(Float8LinearConfig(
                         enable_fsdp_float8_all_gather=True)) (the LM head kept in bf16), torch AdamW,
                         precompute_float8_dynamic_scale_for_fsdp after each step; a row that says why where it
                         does not run here

Columns (per rank, rank 0's figures; the ranks' byte counts differ only by FSDP2's uneven padding):
  all-gathered / step     bytes of the all-gather outputs FSDP2 asked for in one step (forward and backward
                          gathers), counted at torch.distributed's all-gather (benchmarks/collective_bytes.py)
  reduce-scattered / step bytes of the gradients FSDP2 reduce-scattered in that step (the input buffer)
  training state          this rank's parameter shards + gradient shards + optimizer state, each storage once
                          (fp8mp.nn.tensor_bytes), after the optimizer step, before zero_grad
  step                    median wall time of the timed steps (after --warmup steps), the slowest rank's
and each run's ratio to bf16 FSDP2 of the same world size. The byte counts do not depend on the machine; the
times do (and on this CPU FP8 GEMMs are emulated: step time is not the point of this table).

    python benchmarks/bench_fsdp.py [--ranks 2 4] [--steps 3] [--warmup 1] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.dirname(HERE))  # this checkout's fp8mp where none is installed (the workers inherit sys.path)

from collective_bytes import count_collective_bytes  # noqa: E402
from results_json import record  # noqa: E402
from timing import markdown_table  # noqa: E402

RUNS = ("bf16 FSDP2", "fp8mp memory-lean", "fp8mp memory-lean + FP8 all-gather", "torchao Float8 + FP8 all-gather")
LLAMA = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
             intermediate_size=1408, vocab_size=1024, tie_word_embeddings=False, max_position_embeddings=64)
QUICK_LLAMA = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                   intermediate_size=128, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=16)
BATCH, SEQ, QUICK_SEQ = 2, 64, 16
MIB = 2**20


class RunUnavailable(Exception):
    """The run cannot run here; the message says why."""


def keep_head(name: str, module) -> bool:
    return name != "lm_head"


def build(run: str, config: dict):
    """(model, optimizer, after_step callable, autocast context factory) of a run, sharded."""
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    import fp8mp

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")).bfloat16()
    after_step = lambda: None  # noqa: E731
    autocast = lambda: torch.enable_grad()  # noqa: E731 (a no-op context)
    if run.startswith("fp8mp"):
        fp8mp.convert(model, module_filter=keep_head, fp8_saved_activations=True,
                      fp8_all_gather=run.endswith("FP8 all-gather"))
        autocast = lambda: fp8mp.fp8_autocast(fp8_group=dist.group.WORLD)  # noqa: E731
    elif run.startswith("torchao"):
        model = torchao_float8(model)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    if run.startswith("fp8mp"):
        matrices = [p for p in model.parameters() if p.dim() >= 2]
        vectors = [p for p in model.parameters() if p.dim() < 2]
        optimizer = fp8mp.optim.AdamW([{"params": matrices}, {"params": vectors, "state_dtype": torch.bfloat16}],
                                      lr=1e-4, state_dtype=torch.float8_e4m3fn)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if run.startswith("torchao"):
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
        after_step = lambda: precompute_float8_dynamic_scale_for_fsdp(model)  # noqa: E731
    return model, optimizer, after_step, autocast


def torchao_float8(model):
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as error:
        raise RunUnavailable(f"torchao is not installed ({error})") from None
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    return convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name != "lm_head")


def local_bytes(tensors) -> int:
    from fp8mp.nn import tensor_bytes
    return tensor_bytes(t.to_local() if hasattr(t, "to_local") else t for t in tensors)


def state_bytes(model, optimizer) -> int:
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return local_bytes(params) + local_bytes(grads) + local_bytes(states)


def measure(run: str, config: dict, seq: int, steps: int, warmup: int) -> dict:
    model, optimizer, after_step, autocast = build(run, config)
    gen = torch.Generator().manual_seed(dist.get_rank())
    gathered, scattered, times, held = [], [], [], 0
    for step in range(warmup + steps):
        ids = torch.randint(0, config["vocab_size"], (BATCH, seq), generator=gen)
        dist.barrier()
        start = time.perf_counter()
        with count_collective_bytes() as counts:
            with autocast():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        optimizer.step()
        held = max(held, state_bytes(model, optimizer))
        optimizer.zero_grad()
        after_step()
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= warmup:
            gathered.append(counts.all_gathered)
            scattered.append(counts.reduce_scattered)
            times.append(elapsed.item())
        if not torch.isfinite(loss.detach()).all():
            raise RuntimeError(f"{run}: non-finite loss at step {step}")
    return {"all_gathered": max(gathered), "reduce_scattered": max(scattered), "state": held,
            "step_s": statistics.median(times), "params": sum(p.numel() for p in model.parameters()),
            "loss": loss.item()}


def worker(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    config, seq = (QUICK_LLAMA, QUICK_SEQ) if args.quick else (LLAMA, SEQ)
    results = {}
    for run in RUNS:
        try:
            results[run] = measure(run, config, seq, args.steps, args.warmup)
        except RunUnavailable as error:
            results[run] = {"unavailable": str(error)}
        except Exception as error:  # a peer that fails here gets a row saying why, not a failed benchmark
            if run.startswith("fp8mp") or run.startswith("bf16"):
                raise
            last = traceback.extract_tb(error.__traceback__)[-1]
            results[run] = {"unavailable": f"{type(error).__name__}: {str(error).splitlines()[0][:160]} "
                                           f"({os.path.basename(last.filename)}:{last.lineno})"}
        dist.barrier()
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        torch.multiprocessing.spawn(worker, args=(world, free_port(), args, out), nprocs=world, join=True)
        return torch.load(out, weights_only=False)


def table(world: int, results: dict) -> str:
    base = results[RUNS[0]]
    rows = []
    for run in RUNS:
        got = results[run]
        if "unavailable" in got:
            rows.append([run, f"does not run here: {got['unavailable']}"] + [""] * 7)
            continue
        rows.append([run, f"{got['all_gathered'] / MIB:.2f}", f"**{got['all_gathered'] / base['all_gathered']:.3f}x**",
                     f"{got['reduce_scattered'] / MIB:.2f}", f"{got['reduce_scattered'] / base['reduce_scattered']:.3f}x",
                     f"{got['state'] / MIB:.2f}", f"{got['state'] / base['state']:.3f}x",
                     f"{got['step_s'] * 1e3:.0f}", f"{got['step_s'] / base['step_s']:.2f}x"])
    title = (f"{world} ranks (gloo, CPU): Llama {base['params'] / 1e6:.1f}M parameters, per rank and step "
             "(MiB; ratios to bf16 FSDP2)")
    return markdown_table(title, ["run", "all-gathered", "vs bf16", "reduce-scattered", "vs bf16",
                                  "training state", "vs bf16", "step ms", "vs bf16"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny Llama, for a smoke test")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.ranks) or args.steps < 1 or args.warmup < 0:
        parser.error("--ranks must be >= 1, --steps >= 1, --warmup >= 0")
    for world in args.ranks:
        results = run_world(world, args)
        print(table(world, results), flush=True)
        ratio = results[RUNS[2]]["all_gathered"] / results[RUNS[0]]["all_gathered"]
        print(f"\nFP8 all-gather: {ratio:.3f}x of bf16 FSDP2's all-gathered bytes a step "
              f"({'within' if ratio <= 0.52 else 'NOT within'} the 0.52x goal)\n", flush=True)
        record(args.json, f"fsdp_{world}_ranks", {run: results[run] for run in RUNS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
