"""Hugging Face transformers: FP8 training with `transformers.Trainer` in two added lines.

    import fp8mp.integrations.hf as fp8_hf            # added line 1
    model = AutoModelForCausalLM.from_config(config)  # or .from_pretrained(...)
    fp8_hf.prepare(model)                             # added line 2: FP8 from here on
    trainer = Trainer(model=model, args=TrainingArguments(..., bf16=True), ...)
    trainer.train()                                   # gradient accumulation, evaluation, checkpoints, resume
    trainer.save_model(out)                           # save_pretrained: safetensors with the FP8 state

    model = fp8_hf.from_pretrained(AutoModelForCausalLM, out)   # back, FP8 state and all
    model = AutoModelForCausalLM.from_pretrained(out)           # or a plain model (FP8 state unused)

`prepare` converts the model in place (nn.Linear and GPT-2's Conv1D, except the output
embedding; mixture-of-experts layers get the "fp8mp" experts implementation of hf_moe.py) and
makes every forward of the model run inside `fp8mp.fp8_autocast`, so the Trainer's training
and evaluation steps (and `generate`) run in FP8 with no other change. The FP8 scaling state
is a set of buffers in the state_dict, so `save_pretrained`, the Trainer's
checkpoints and `resume_from_checkpoint` carry it as they carry the weights.

transformers is imported only by `from_pretrained` (`pip install 'fp8mp[hf]'`).
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable

import torch

from fp8mp.integrations.hf_chunked_loss import restore_loss, use_chunked_loss, uses_chunked_loss
from fp8mp.integrations.hf_saved_activations import (restore_saved_activations, use_fp8_saved_activations,
                                                     uses_fp8_saved_activations)
from fp8mp.integrations.hf_moe import register_if_transformers_imported, select_fp8_experts
from fp8mp.nn.fp8_state_dict import load_state_dict, split_fp8_state
from fp8mp.nn.conversion import convert
from fp8mp.planning.plan import PrecisionPlan, as_plan
from fp8mp.scaling.autocast import fp8_autocast, validate_recipe
from fp8mp.scaling.recipe import Recipe
from fp8mp.training.trainer import name_under

__all__ = ["prepare", "from_pretrained", "is_prepared", "use_chunked_loss", "restore_loss", "uses_chunked_loss",
           "use_fp8_saved_activations", "restore_saved_activations", "uses_fp8_saved_activations"]

register_if_transformers_imported()  # the "fp8mp" experts implementation (hf_moe.py), where transformers is loaded

_ATTRIBUTE = "_fp8mp_forward"


class Fp8Forward:
    """Forward pre-hook and (always-called) forward hook that enter and leave fp8_autocast around a forward.

    One stack per thread, so nested or concurrent forwards of the same model each leave their own context.
    """

    def __init__(self, recipe: Recipe | None):
        self.recipe = recipe
        self._stacks: dict[int, list] = {}

    def enter(self, module, args) -> None:
        context = fp8_autocast(enabled=True, fp8_recipe=self.recipe)
        context.__enter__()
        self._stacks.setdefault(threading.get_ident(), []).append(context)

    def leave(self, module, args, output) -> None:
        stack = self._stacks.get(threading.get_ident())
        if stack:
            stack.pop().__exit__(None, None, None)


def is_prepared(model: torch.nn.Module) -> bool:
    return isinstance(getattr(model, _ATTRIBUTE, None), Fp8Forward)


def output_embedding_names(model: torch.nn.Module) -> tuple[str, ...]:
    """The name of a transformers model's output embedding (lm_head), which stays in high precision."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return tuple(name for name, module in model.named_modules() if head is not None and module is head)


def prepare(model: torch.nn.Module, recipe: Recipe | None = None, keep_high_precision: Iterable[str] | None = None,
            convert_norms: bool = False, frozen_weights: str | None = None,
            plan: PrecisionPlan | str | os.PathLike | None = None) -> torch.nn.Module:
    """Convert `model` in place and run each of its forwards inside `fp8_autocast(fp8_recipe=recipe)`.

    Args:
        model: a transformers model (or any torch module).
        recipe: any fp8mp recipe (per-tensor or fine-grained), pinned on every converted module and on the
            experts' projections (their state shaped for it before any load, as DCP needs); None:
            fp8_autocast's DelayedScaling().
        keep_high_precision: module-name prefixes left as they are; None keeps the output
            embedding (`model.get_output_embeddings()`, lm_head), whose logits feed the loss directly.
        convert_norms: also swap torch's LayerNorm/RMSNorm (not transformers' own RMSNorm classes).
        frozen_weights: None, or "fp8": the frozen (requires_grad=False) weights of the converted layers stored at one
            byte a parameter (`fp8mp.convert`'s option), the base of a LoRA fine-tune: `model.requires_grad_(False)`
            first, then PEFT (or TRL's SFTTrainer with a `peft_config`) adds the adapters.
        plan: an fp8mp.PrecisionPlan or the path of its JSON: `fp8mp.convert(model, plan=plan)` converts instead,
            each planned layer pinned to its recipe and its "bf16" layers (the output embedding too, if the plan
            says so) kept; keep_high_precision is refused beside it. `recipe` then serves what the plan does not
            pin: the experts' projections and fp8_autocast's default.
    Returns `model`. Preparing a prepared model is an error (its hooks would nest).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fp8mp.integrations.hf.prepare: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if is_prepared(model):
        raise ValueError("fp8mp.integrations.hf.prepare: argument 'model' is already prepared")
    if recipe is not None:
        validate_recipe(recipe)
    prefixes = keep_high_precision
    if prefixes is not None and (isinstance(prefixes, str) or not isinstance(prefixes, Iterable)
                                 or not all(isinstance(p, str) for p in prefixes)):
        raise TypeError("fp8mp.integrations.hf.prepare: argument 'keep_high_precision' must be an iterable of "
                        f"module-name prefixes, got {keep_high_precision!r}")
    if plan is not None:
        plan = as_plan(plan, "fp8mp.integrations.hf.prepare: argument 'plan'")
        if keep_high_precision is not None:
            raise ValueError("fp8mp.integrations.hf.prepare: argument 'plan' decides each layer's precision; pass it "
                             "without 'keep_high_precision' (edit the plan's choices instead)")
        convert(model, plan=plan, convert_norms=convert_norms, frozen_weights=frozen_weights)
    else:
        keep = output_embedding_names(model) if keep_high_precision is None else tuple(keep_high_precision)
        convert(model, recipe=recipe, module_filter=lambda name, m: not any(name_under(name, p) for p in keep),
                convert_norms=convert_norms, frozen_weights=frozen_weights)
    select_fp8_experts(model, recipe)
    hooks = Fp8Forward(recipe)
    model.register_forward_pre_hook(hooks.enter)
    model.register_forward_hook(hooks.leave, always_call=True)
    setattr(model, _ATTRIBUTE, hooks)
    return model


# ----------------------------------------------------------------------------------- loading
def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError("fp8mp.integrations.hf.from_pretrained needs transformers: pip install 'fp8mp[hf]'") from error
    return transformers


def read_checkpoint(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a save_pretrained directory (safetensors or .bin, one file or sharded)."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    def load(file: str) -> dict[str, torch.Tensor]:
        if file.endswith(".safetensors"):
            from safetensors.torch import load_file
            return load_file(file)
        return torch.load(file, map_location="cpu", weights_only=True)

    directory = os.fspath(directory)
    for single, index in ((SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME), (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)):
        if os.path.isfile(os.path.join(directory, single)):
            return load(os.path.join(directory, single))
        if os.path.isfile(os.path.join(directory, index)):
            with open(os.path.join(directory, index)) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load(os.path.join(directory, shard)))
            return state
    raise FileNotFoundError(f"fp8mp.integrations.hf.from_pretrained: argument 'directory' ({directory}) holds no "
                            f"{SAFE_WEIGHTS_NAME} or {WEIGHTS_NAME} (sharded or not); pass a save_pretrained directory")


def from_pretrained(model_class, directory: str | os.PathLike, recipe: Recipe | None = None,
                    keep_high_precision: Iterable[str] | None = None, convert_norms: bool = False,
                    plan: PrecisionPlan | str | os.PathLike | None = None, **kwargs):
    """`model_class.from_pretrained(directory, **kwargs)`, prepared (see `prepare`), with the checkpoint's FP8 state.

    Args:
        model_class: a transformers model class or Auto class (e.g. AutoModelForCausalLM).
        directory: a local save_pretrained directory (of a prepared model, or of any model: the
            converted modules then start with fresh FP8 state). The weights load as transformers
            loads them; the FP8 scaling state then loads bit-exactly into the converted modules,
            and FP8 state of modules kept in high precision is ignored (one log line).
        recipe, keep_high_precision, convert_norms, plan: `prepare`'s (pass the plan the model trained under).
    """
    transformers = _transformers()
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"fp8mp.integrations.hf.from_pretrained: argument 'directory' must be a local "
                                f"directory written by save_pretrained, got {directory!r}")
    weights, fp8_state = split_fp8_state(read_checkpoint(directory))
    config = kwargs.pop("config", None) or transformers.AutoConfig.from_pretrained(directory)
    # transformers reads the weights from `state_dict` (and the config from `config`): it never sees the FP8 state.
    # A state_dict excludes a path, and an Auto class needs one to pick its class: pick it here.
    mapping = getattr(model_class, "_model_mapping", None)  # transformers' Auto classes have one
    concrete = mapping[type(config)] if mapping is not None else model_class
    model = concrete.from_pretrained(None, config=config, state_dict=weights, **kwargs)
    prepare(model, recipe=recipe, keep_high_precision=keep_high_precision, convert_norms=convert_norms, plan=plan)
    load_state_dict(model, fp8_state, strict=False)
    return model
