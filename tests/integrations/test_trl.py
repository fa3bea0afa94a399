"""TRL's SFTTrainer (trl 1.16.0, pinned in requirements-frameworks.txt) fine-tunes LoRA adapters (peft 0.21.2) on a
tiny transformers Llama whose frozen base `fp8mp.integrations.hf.prepare(model, frozen_weights="fp8")` stores at one
byte a parameter and runs in FP8: the three lines of docs/frameworks.md, on CPU, with an in-memory tokenizer and
dataset (nothing from the Hub)."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub

import datasets  # noqa: E402
import peft  # noqa: E402
import safetensors.torch  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import fp8mp  # noqa: E402
import fp8mp.integrations.hf as fp8_hf  # noqa: E402
from fp8mp.nn import Fp8FrozenWeight, tensor_bytes  # noqa: E402
import framework_helpers as fh  # noqa: E402

STEPS, SAVED_AT = 6, 3
PROJECTIONS = 7 * 2  # q, k, v, o, gate, up, down in each of the 2 layers


def char_tokenizer():
    """One token a printable character, plus <pad> and <eos>."""
    vocab = {"<pad>": 0, "<eos>": 1, **{chr(c): c - 30 for c in range(32, 127)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="<eos>")


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return transformers.LlamaForCausalLM(config)


def fp8_base():
    """What the user's script does before the trainer: the two lines after the import. Current scaling: the scales
    come from each step's tensors, so the adapter-only checkpoints of PEFT carry all a resume needs."""
    model = tiny_llama()
    model.requires_grad_(False)
    return fp8_hf.prepare(model, recipe=fp8mp.recipe.CurrentScaling(), frozen_weights="fp8")


def sums():
    return datasets.Dataset.from_dict({"text": [f"{a} plus {b} is {a + b}." for a in range(10) for b in range(10)]})


def mean_loss(model, tokenizer, texts) -> float:
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        return model(**batch, labels=labels).loss.item()


def sft_trainer(model, tokenizer, folder):
    args = SFTConfig(output_dir=str(folder), max_steps=STEPS, per_device_train_batch_size=8, learning_rate=1e-2,
                     lr_scheduler_type="constant", logging_steps=1, save_strategy="steps", save_steps=SAVED_AT,
                     report_to=[], use_cpu=True, bf16=True, gradient_checkpointing=False, max_length=32,
                     disable_tqdm=True, seed=0)
    lora = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return SFTTrainer(model=model, args=args, train_dataset=sums(), processing_class=tokenizer, peft_config=lora)


def logged_losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def adapters(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}


def test_sft_trainer_trains_lora_adapters_on_an_fp8_base_that_stays_one_byte_a_parameter(tmp_path):
    tokenizer = char_tokenizer()
    model = fp8_base()
    base = {name: p for name, p in model.named_parameters() if isinstance(p, Fp8FrozenWeight)}
    assert len(base) == PROJECTIONS  # every projection; the LM head (kept in high precision), embeddings, norms stay
    base_numel = sum(p.numel() for p in base.values())
    assert tensor_bytes(base.values()) == base_numel + 4 * len(base)  # E4M3 codes plus one fp32 scale each
    before = {name: p.codes.clone() for name, p in base.items()}

    trainer = sft_trainer(model, tokenizer, tmp_path / "run")
    untrained = mean_loss(trainer.model, tokenizer, sums()["text"][:16])
    with fh.Fp8OpCount() as ops:
        trainer.train()

    # FP8 GEMMs each step: the forward and the input gradient of every projection, but the input gradients of the
    # first layer's q, k, v (their input comes from the frozen embedding); no weight gradient (frozen)
    assert ops.counts["fp8mp.fp8_gemm"] == STEPS * (2 * PROJECTIONS - 3)
    losses = logged_losses(trainer)
    assert len(losses) == STEPS and losses[-1] < losses[0] - 0.2, losses
    # only the adapters trained; the base holds the same FP8 codes, still one byte a parameter
    peft_model = trainer.model
    trained = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert tensor_bytes(base.values()) == base_numel + 4 * len(base)
    assert all(torch.equal(p.codes.view(torch.uint8), before[name].view(torch.uint8)) for name, p in base.items())

    # the adapter alone saves, and reloads onto a fresh FP8 base bit for bit
    trainer.save_model(str(tmp_path / "adapter"))
    saved = safetensors.torch.load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert saved and all("lora_" in key for key in saved)
    reloaded = peft.PeftModel.from_pretrained(fp8_base(), str(tmp_path / "adapter"))
    assert fh.same_bits(adapters(reloaded), adapters(peft_model))
    assert mean_loss(reloaded, tokenizer, sums()["text"][:16]) < untrained - 0.2

    # the Trainer's own checkpoint (adapters, optimizer, scheduler, RNG) resumes the run bit for bit
    resumed = sft_trainer(fp8_base(), tokenizer, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{SAVED_AT}"))
    assert logged_losses(resumed) == losses  # the first SAVED_AT from the checkpoint's log, the rest recomputed
    assert fh.same_bits(adapters(resumed.model), adapters(peft_model))
