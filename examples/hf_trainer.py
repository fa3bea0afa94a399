"""FP8 training with transformers.Trainer: the two lines fp8mp adds, against the same run in BF16.

    python examples/hf_trainer.py                       # tiny GPT-2 and Llama, BF16 and FP8, 3 seeds each
    python examples/hf_trainer.py --model llama --steps 200 --seeds 0

The models are built from configs (no downloads) and learn a synthetic token task (sequences that
step up by 1, 2 or 3: the best possible loss is ln 3 = 1.10 nats). Each run trains with gradient
accumulation, evaluates, saves a checkpoint, and ends with save_model (save_pretrained); FP8 runs
are then reloaded with fp8mp.integrations.hf.from_pretrained and checked to evaluate the same.
Needs transformers and accelerate (what transformers.Trainer needs); CPU is fine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import fp8mp.integrations.hf as fp8_hf  # noqa: E402  (FP8 line 1 of 2)

VOCAB, SEQ = 256, 32


def build(family: str, seed: int):
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                         bos_token_id=0, eos_token_id=0)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                          max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config)


class RandomWalks(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        steps = torch.randint(1, 4, (n, SEQ - 1), generator=gen)
        self.ids = torch.cat([start, start + steps.cumsum(1)], 1) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run(family: str, precision: str, seed: int, steps: int, out: str, eval_size: int = 256) -> float:
    model = build(family, seed)
    if precision == "fp8":
        fp8_hf.prepare(model)  # FP8 line 2 of 2: convert, and run every forward inside fp8_autocast
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=8, per_device_eval_batch_size=64,
        gradient_accumulation_steps=2,
        learning_rate=3e-3, warmup_steps=steps // 10, logging_steps=max(1, steps // 10), eval_strategy="steps",
        eval_steps=max(1, steps // 2), save_steps=max(1, steps // 2), bf16=True, use_cpu=not torch.cuda.is_available(),
        report_to=[], disable_tqdm=True, seed=seed, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RandomWalks(4096, seed + 1),
                                   eval_dataset=RandomWalks(eval_size, 10_000))
    trainer.train()
    eval_loss = trainer.evaluate()["eval_loss"]
    trainer.save_model(os.path.join(out, "final"))
    if precision == "fp8":  # back from save_pretrained, FP8 state and all: evaluates the same as the saved model
        # Evaluating updates delayed scaling's amax history too (as in training), and each layer's amax depends on the
        # FP8 layers before it, so two evaluations in a row can differ in the last bits. The saved model and its
        # reload are compared from the same state: the one the checkpoint holds.
        saved = trainer.evaluate()["eval_loss"]
        reloaded = fp8_hf.from_pretrained(transformers.AutoModelForCausalLM, os.path.join(out, "final"))
        again = transformers.Trainer(model=reloaded, args=args, eval_dataset=RandomWalks(eval_size, 10_000)).evaluate()
        assert again["eval_loss"] == saved, (again["eval_loss"], saved)
    return eval_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "llama", "both"], default="both")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    cli = parser.parse_args()
    families = ["gpt2", "llama"] if cli.model == "both" else [cli.model]
    transformers.logging.set_verbosity_error()
    print(f"{'model':<6} {'seed':>4} {'bf16 eval':>10} {'fp8 eval':>10} {'fp8 - bf16':>11}")
    for family in families:
        results = []
        for seed in cli.seeds:
            with tempfile.TemporaryDirectory() as out:
                bf16 = run(family, "bf16", seed, cli.steps, os.path.join(out, "bf16"))
                fp8 = run(family, "fp8", seed, cli.steps, os.path.join(out, "fp8"))
            results.append((bf16, fp8))
            print(f"{family:<6} {seed:>4} {bf16:>10.4f} {fp8:>10.4f} {100 * (fp8 - bf16) / bf16:>10.2f}%", flush=True)
        if len(results) > 1:
            bf16s = [b for b, _ in results]
            spread = 100 * (max(bf16s) - min(bf16s)) / statistics.mean(bf16s)
            gaps = [100 * (f - b) / b for b, f in results]
            print(f"{family:<6} bf16 seed-to-seed spread {spread:.2f}%; fp8 - bf16 from {min(gaps):+.2f}% to {max(gaps):+.2f}%")


if __name__ == "__main__":
    main()
