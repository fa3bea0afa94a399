"""Train a tiny transformers Qwen3-MoE in FP8 and in BF16 with the same seed and batches, over several seeds.

    python examples/train_moe.py --seeds 5 --threads 1   # 200 steps per run, FP8 and BF16 for seeds 0..4
                                                         # (about 5 minutes on one thread of a busy host)
    python examples/train_moe.py --quick                 # 30 steps, one seed, under a minute

The model is transformers' Qwen3-MoE from a config (2 layers, hidden size 128, 8 experts top-2 of width 64,
byte-level vocabulary) on the GPT example's generated corpus, trained with train_gpt.py's loop: the same
batches, learning-rate schedule, AdamW, gradient clipping and validation batches for both runs.

FP8: `fp8mp.integrations.hf.prepare(model)` converts the attention projections to fp8mp.nn.Linear and selects
the "fp8mp" experts implementation (FP8 grouped GEMMs for the experts), and runs every forward inside
fp8mp.fp8_autocast; the router and the LM head stay in high precision. BF16: the same model without fp8mp
(transformers' grouped_mm experts). Both keep fp32 master weights and AdamW state and run under
torch.autocast(bfloat16), as transformers' Trainer does with bf16=True: a user training in bf16 keeps fp32
masters, since bf16 weights lose AdamW's small updates to rounding.

Each seed's final validation loss is the mean over --eval-batches held-out batches; the table gives the
per-seed losses, FP8's gap to BF16 and the means over the seeds, and says whether the mean FP8 loss is
within 0.5% of the mean BF16 loss.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mp  # noqa: E402
from train_gpt import Precision, TrainConfig, run_seeds  # noqa: E402


@dataclass(frozen=True)
class MoEConfig:
    """A tiny Qwen3-MoE: every layer sparse, expert dimensions multiples of 16 (FP8 GEMM alignment)."""

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 2
    experts: int = 8
    top_k: int = 2
    expert_width: int = 64
    context: int = 64
    vocab_size: int = 256  # bytes

    def qwen3_moe(self):
        import transformers

        return transformers.Qwen3MoeConfig(
            vocab_size=self.vocab_size, hidden_size=self.d_model, moe_intermediate_size=self.expert_width,
            intermediate_size=4 * self.d_model, num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_kv_heads, head_dim=self.d_model // self.n_heads, num_experts=self.experts,
            num_experts_per_tok=self.top_k, decoder_sparse_step=1, mlp_only_layers=[],
            max_position_embeddings=self.context)


class CausalLM(torch.nn.Module):
    """A transformers causal LM called as the GPT example's model: model(x, y) -> (logits, mean cross-entropy)."""

    def __init__(self, lm: torch.nn.Module, config: MoEConfig):
        super().__init__()
        self.lm = lm
        self.config = config

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.lm(input_ids=x).logits
        return logits, F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def build_moe(config: MoEConfig, precision: Precision) -> CausalLM:
    """A fresh Qwen3-MoE from the current torch seed, prepared by fp8mp for the FP8 run and left as it is otherwise."""
    import transformers

    import fp8mp.integrations.hf as fp8_hf

    lm = transformers.AutoModelForCausalLM.from_config(config.qwen3_moe())
    if precision.fp8:
        fp8_hf.prepare(lm, recipe=fp8mp.recipe.DelayedScaling(fp8_format=fp8mp.recipe.Format.HYBRID))
    return CausalLM(lm, config)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="FP8 and BF16 for seeds 0..N-1")
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--eval-batches", type=int, default=16, help="held-out batches averaged into each val loss")
    parser.add_argument("--quick", action="store_true", help="30 steps, 4 validation batches: under a minute")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads of every run (OMP_NUM_THREADS of its process); on a busy host 1 keeps a "
                             "run's parallel regions from waiting on descheduled threads")
    return parser.parse_args(argv)


def configs_from(args: argparse.Namespace) -> tuple[MoEConfig, TrainConfig]:
    steps, eval_batches = (30, 4) if args.quick else (args.steps, args.eval_batches)
    return MoEConfig(), TrainConfig(steps=steps, batch_size=args.batch_size, eval_every=steps,
                                    eval_batches=eval_batches, corpus_bytes=400_000)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"--threads must be >= 1, got {args.threads}")
    if args.threads is not None:  # each run is a fresh process, which reads OMP_NUM_THREADS as torch starts
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    model_config, config = configs_from(args)
    print(f"fp8mp {fp8mp.__version__} | torch {torch.__version__} | {torch.get_num_threads()} CPU threads")
    print(f"model: {model_config}\ntrain: {config}\n")
    t0 = time.perf_counter()
    table = run_seeds(model_config, config, args.seeds, None, build_model=build_moe, lean=False)
    print(table)  # ends with the FP8 mean's gap to BF16's and whether it is within the goal
    print(f"total wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
