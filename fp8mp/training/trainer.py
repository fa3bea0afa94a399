"""`fp8mp.Trainer`: the FP8 training loop of the README, assembled from fp8mp's pieces by one config.

    trainer = fp8mp.Trainer(model, {"precision": "fp8_mixed", "keep_high_precision": ["lm_head"], "lr": 3e-4})
    losses = trainer.fit(batches, loss_fn, steps=1000)        # loss_fn(model, batch) -> scalar loss
    val = trainer.evaluate(val_batches, loss_fn)
    torch.save(trainer.state_dict(), "ckpt.pt")

One step: forward under torch.autocast (bf16 activations, per config) and fp8mp.fp8_autocast (fp8_mixed),
`scaler.scale(loss).backward()`, `scaler.unscale_`, gradient clipping in FP32 on the true gradients,
`scaler.step` (skipped on an Inf/NaN gradient), `scaler.update`, then the fallback policy and the monitor.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import os
from typing import Any, Callable, Iterable

import torch
from tqdm import tqdm

from fp8mp.scaling.config_checks import check_int
from fp8mp.training import rng_state
from fp8mp.training.checkpoint_folder import CheckpointFolder
from fp8mp.training.loss_scaler import LossScaler
from fp8mp.scaling.autocast import fp8_autocast
from fp8mp.nn.conversion import convert
from fp8mp.training.fallback import FallbackPolicy
from fp8mp.training.monitor import Fp8Monitor
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.nn.lora import apply_lora
from fp8mp.optim.master_weights import MasterWeightOptimizer
from fp8mp.planning.replan import replan
from fp8mp.training.trainer_config import TrainerConfig

__all__ = ["Trainer"]

logger = logging.getLogger("fp8mp")

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
_STATE_KEYS = ("model", "optimizer", "scaler", "step")
_FP8_STATE = "fp8_meta."  # in the state_dict key of every FP8 scaling buffer or extra state


def name_under(name: str, prefix: str) -> bool:
    """True when module `name` is `prefix` or lies under it ("enc" covers "enc.fc", not "encoder")."""
    return name == prefix or name.startswith(prefix + ".")


class Trainer:
    """Converts `model` per `config` (in place) and trains it (see the module docstring).

    Args:
        model: any torch module; its nn.Linear layers become fp8mp.nn.Linear except under
            config.keep_high_precision (under precision "bf16"/"fp32" they compute exactly as nn.Linear).
        config: a TrainerConfig or a plain dict for TrainerConfig.from_dict.
        optimizer: None builds AdamW(lr, weight_decay) over the trainable parameters (wrapped in
            fp8mp.optim.MasterWeightOptimizer when the model has unfrozen FP8-stored weights); or your own.

    Attributes: model, config, optimizer, scaler (LossScaler), fallback (FallbackPolicy or None),
    monitor (Fp8Monitor or None), recipe (the default FP8 recipe), step (optimizer steps taken), plan (the plan the
    model trains under now: config.plan, replaced by each replan), replans ((step, changes) of each replan).
    """

    def __init__(self, model: torch.nn.Module, config: TrainerConfig | dict, optimizer=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Trainer: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(config, dict):
            config = TrainerConfig.from_dict(config)
        if not isinstance(config, TrainerConfig):
            raise TypeError(f"Trainer: argument 'config' must be a TrainerConfig or a dict, got {type(config).__name__}")
        self.config = config
        self.recipe = config.fp8_recipe()
        self.model = prepare_model(model, config, self.recipe)
        self.optimizer = optimizer if optimizer is not None else build_optimizer(self.model, config)
        self.scaler = LossScaler(init_scale=config.initial_scale, growth_interval=config.growth_interval,
                                 enabled=config.dynamic_loss_scaling)
        self.fallback = FallbackPolicy(cooldown_steps=config.fallback_cooldown_steps) if config.fallback else None
        self.monitor = Fp8Monitor(self.model, every=config.log_every) if config.monitor else None
        self.step = 0
        self.plan, self.replans = config.plan, []
        self._recent_batches = collections.deque(maxlen=config.replan_batches)  # replan's calibration batches

    # ----------------------------------------------------------------------------- one step
    def compute_context(self) -> contextlib.ExitStack:
        """The forward's precision: torch.autocast(bf16) and/or fp8_autocast, per config.precision."""
        stack = contextlib.ExitStack()
        precision = self.config.precision
        if precision == "bf16" or (precision == "fp8_mixed" and self.config.activation_dtype == "bf16"):
            stack.enter_context(torch.autocast(_device_type(self.model), dtype=torch.bfloat16))
        if precision == "fp8_mixed":
            stack.enter_context(fp8_autocast(enabled=True, fp8_recipe=self.recipe))
        return stack

    def train_step(self, batch, loss_fn: LossFn) -> float:
        """One optimizer step on `batch`; returns the (unscaled) loss. Skipped by the scaler on Inf/NaN grads."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.config.replan_every_steps is not None:
            self._recent_batches.append(batch)
        with self.compute_context():
            loss = _checked_loss(loss_fn(self.model, batch))
        self.scaler.scale(loss.float()).backward()
        self.scaler.unscale_(self.optimizer)
        if self.config.grad_clip is not None:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        nonfinite = self._log_nonfinite_fp8_casts()
        if self.fallback is not None:
            self.fallback.step(self.model, nonfinite_layers=nonfinite if self.scaler.is_enabled() else None)
        if self.monitor is not None:
            self.monitor.record_step()
        self.step += 1
        if self.config.replan_every_steps is not None and self.step % self.config.replan_every_steps == 0:
            self._replan(loss_fn)
        return loss.item()

    def _replan(self, loss_fn: LossFn) -> None:
        """Re-measure the model on the recent batches, apply the changed layers in place, log them (INFO)."""
        self.plan, changes = replan(self.model, list(self._recent_batches), self.plan, loss_fn=loss_fn, progress=False)
        self.replans.append((self.step, changes))
        logger.info("fp8mp.Trainer: step %d: replanned on the last %d batches: %d layer(s) changed%s", self.step,
                    len(self._recent_batches), len(changes), f"\n{changes}" if changes else "")

    def _log_nonfinite_fp8_casts(self) -> list[str]:
        """Log (WARNING, "fp8mp" logger) the layers whose FP8 casts met an Inf/NaN in the step just skipped;
        returns their names."""
        layers = nonfinite_layer_names(self.model, self.scaler.nonfinite_fp8_casts)
        if not layers:
            return []
        logger.warning("fp8mp.Trainer: step %d skipped: FP8 casts met Inf/NaN in %s", self.step,
                       ", ".join(f"'{name}' ({', '.join(tensors)})" for name, tensors in layers))
        return [name for name, _ in layers]

    def fit(self, batches: Iterable, loss_fn: LossFn, steps: int | None = None, *,
            checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 100, keep_last: int = 3,
            resume: bool | None = None) -> list[float]:
        """`train_step` on each batch (the first `steps` of them when given); returns the losses.

        A tqdm bar (config.progress_bar) shows the loss and the loss scale every config.log_every steps.

        checkpoint_dir: save a kill-safe checkpoint there every `checkpoint_every` steps and at the end
            (fp8mp/training/checkpoint_folder.py: atomic, checksummed, the newest `keep_last` kept): model with its
            FP8 scaling state, optimizer, loss scaler, fallback policy, step, every RNG, the position in
            `batches` and the losses so far. Under torch.distributed every rank must call fit alike.
        resume: continue from the newest checkpoint in checkpoint_dir that verifies (a corrupted or
            truncated one is logged and skipped): `batches` is iterated from its start with the RNG state
            the first run had there (a shuffling DataLoader deals the same order), the batches already
            trained on are skipped, and the returned losses include theirs. Default: True when the folder
            holds checkpoints. False refuses a folder with checkpoints (they would mix two runs).
        """
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"Trainer.fit: argument 'steps' must be None or an int >= 1, got {steps!r}")
        if checkpoint_dir is not None and self.config.replan_every_steps is not None:
            raise ValueError("Trainer.fit: argument 'checkpoint_dir' with config key 'replan_every_steps': a resumed "
                             "run converts from config.plan, not from the plan the checkpoint was trained under")
        run = self._start_run(checkpoint_dir, checkpoint_every, keep_last, resume)
        iterator = iter(batches)  # after the start RNG is in place: a shuffling DataLoader draws its order here
        if run.position:
            for _ in itertools.islice(iterator, run.position):
                pass
            rng_state.restore(run.rng_now)
        total = steps if steps is not None else (len(batches) if hasattr(batches, "__len__") else None)
        todo = None if steps is None else max(steps - run.position, 0)
        bar = tqdm(itertools.islice(iterator, todo), total=total, initial=run.position, desc="train", unit="step",
                   dynamic_ncols=True, disable=not self.config.progress_bar)
        losses = run.losses
        for batch in bar:
            losses.append(self.train_step(batch, loss_fn))
            run.position += 1
            if len(losses) % self.config.log_every == 0 or len(losses) == total:
                bar.set_postfix(loss=f"{losses[-1]:.4f}", scale=f"{self.scaler.get_scale():g}")
            if run.folder is not None and run.position % checkpoint_every == 0:
                self._save_checkpoint(run)
        bar.close()
        if run.folder is not None and run.saved_position != run.position:
            self._save_checkpoint(run)
        if steps is not None and len(losses) < steps:
            logger.warning("fp8mp.Trainer.fit: argument 'batches' ran out after %d of %d steps", len(losses), steps)
        return losses

    # ----------------------------------------------------------------------------- kill-safe runs
    def _start_run(self, checkpoint_dir, checkpoint_every: int, keep_last: int, resume: bool | None) -> "_Run":
        """A fresh run, or the one the newest valid checkpoint in checkpoint_dir left (RNG set for iter())."""
        run = _Run(rng_at_start=rng_state.capture())
        if checkpoint_dir is None:
            return run
        check_int("Trainer.fit: argument 'checkpoint_every'", checkpoint_every, 1)
        if resume is not None and not isinstance(resume, bool):
            raise ValueError(f"Trainer.fit: argument 'resume' must be None, True or False, got {resume!r}")
        run.folder = CheckpointFolder(checkpoint_dir, keep_last)
        has_checkpoints = bool(run.folder.steps())
        if resume is False and has_checkpoints:
            raise ValueError(f"Trainer.fit: argument 'checkpoint_dir' {str(checkpoint_dir)!r} holds checkpoints of an "
                             "earlier run; pass resume=True to continue it, or an empty folder")
        if not (resume or (resume is None and has_checkpoints)):
            return run
        sharded = self._sharded_state()
        found = run.folder.load_newest(sharded)
        if found is None:
            logger.warning("fp8mp.Trainer.fit: no valid checkpoint in %s; starting from the beginning", checkpoint_dir)
            return run
        step, state = found
        self._load_run_state(state, sharded)
        run.position, run.saved_position, run.losses = state["position"], state["position"], list(state["losses"])
        run.rng_at_start, run.rng_now = state["rng_at_start"], state["rng"]
        rng_state.restore(run.rng_at_start)
        logger.info("fp8mp.Trainer.fit: resumed from the checkpoint of step %d in %s", step, checkpoint_dir)
        return run

    def _sharded_state(self) -> dict | None:
        """Under torch.distributed: the model and optimizer state dicts torch.distributed.checkpoint saves."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1):
            return None
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError("Trainer.fit: distributed checkpoints need a torch.optim.Optimizer, got "
                            f"{type(self.optimizer).__name__}")
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        # FP8 scaling state is per rank and changes shape with the recipe (the amax history): it goes into
        # each rank's own file (see _save_checkpoint), not through torch.distributed.checkpoint.
        model_state = {key: value for key, value in model_state.items() if _FP8_STATE not in key}
        return {"model": model_state, "optimizer": optimizer_state}

    def _save_checkpoint(self, run: "_Run") -> None:
        sharded = self._sharded_state()
        state = self.state_dict()
        if sharded is not None:
            # FP8 scaling state is per rank (without an fp8_group each rank scales from its own shard): each
            # rank keeps its own in its file.
            state["fp8_state"] = {name: m.fp8_meta.state_dict() for name, m in self.model.named_modules()
                                  if isinstance(m, Fp8Module)}
            del state["model"], state["optimizer"]
        else:
            sharded = {"model": state.pop("model"), "optimizer": state.pop("optimizer")}
        local = {**state, "position": run.position, "losses": list(run.losses), "rng": rng_state.capture(),
                 "rng_at_start": run.rng_at_start}
        run.folder.save(self.step, local, sharded)
        run.saved_position = run.position

    def _load_run_state(self, state: dict, sharded: dict) -> None:
        if "sharded" in state:  # one process: everything came in one file
            self.load_state_dict({**state, **state["sharded"]})
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        missing, unexpected = set_state_dict(self.model, self.optimizer, model_state_dict=sharded["model"],
                                             optim_state_dict=sharded["optimizer"], options=StateDictOptions(strict=False))
        missing = [key for key in missing if _FP8_STATE not in key]
        if missing or unexpected:
            raise RuntimeError(f"Trainer.fit: the checkpoint does not fit the model: missing {missing}, "
                               f"unexpected {list(unexpected)}")
        modules = dict(self.model.named_modules())
        for name, fp8_state in state["fp8_state"].items():
            modules[name].fp8_meta.load_state_dict(fp8_state)
        self._load_loop_state(state)

    def evaluate(self, batches: Iterable, loss_fn: LossFn) -> float:
        """Mean loss over `batches`, in eval mode, without grad, in the training precision (monitor paused)."""
        was_training = self.model.training
        self.model.eval()
        losses = []
        paused = self.monitor.pause() if self.monitor is not None else contextlib.nullcontext()
        try:
            with torch.no_grad(), paused:
                for batch in batches:
                    with self.compute_context():
                        losses.append(_checked_loss(loss_fn(self.model, batch)).item())
        finally:
            self.model.train(was_training)
        if not losses:
            raise ValueError("Trainer.evaluate: argument 'batches' yielded no batch")
        return sum(losses) / len(losses)

    # ----------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Model (with FP8 scaling state), optimizer, loss scaler and step count.

        Tensors are references, as in torch's state_dicts: torch.save it (or copy.deepcopy) to keep it.
        """
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "step": self.step,
                "fallback": self.fallback.state_dict() if self.fallback is not None else None}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what `state_dict()` returned; training then continues as it would have."""
        missing = [k for k in _STATE_KEYS if not isinstance(state_dict, dict) or k not in state_dict]
        if missing:
            raise ValueError(f"Trainer.load_state_dict: argument 'state_dict' lacks keys {missing}")
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self._load_loop_state(state_dict)

    def _load_loop_state(self, state_dict: dict) -> None:
        """Everything of `state_dict()` but the model and the optimizer."""
        self.scaler.load_state_dict(state_dict["scaler"])
        self.step = int(state_dict["step"])
        if self.fallback is not None and state_dict.get("fallback") is not None:
            self.fallback.load_state_dict(state_dict["fallback"], self.model)


@dataclasses.dataclass
class _Run:
    """Where one `fit` stands: its checkpoint folder, position in `batches`, losses, RNG states."""

    rng_at_start: dict
    folder: CheckpointFolder | None = None
    position: int = 0
    saved_position: int = 0
    losses: list = dataclasses.field(default_factory=list)
    rng_now: dict | None = None


# --------------------------------------------------------------------------------- model preparation
def prepare_model(model: torch.nn.Module, config: TrainerConfig, recipe) -> torch.nn.Module:
    """Convert (sparing keep_high_precision, or as config.plan says), pin format_overrides' recipes, then wrap
    LoRA targets."""
    keep = config.keep_high_precision
    names = [name for name, _ in model.named_modules()]
    for prefix in keep:
        if not any(name_under(name, prefix) for name in names):
            raise ValueError(f"TrainerConfig: key 'keep_high_precision' prefix {prefix!r} matches no module of the model")
    if config.plan is not None:
        model = convert(model, plan=config.plan)
    else:
        model = convert(model, module_filter=lambda name, m: not any(name_under(name, p) for p in keep))
    for prefix in keep:
        already = [n for n, m in model.named_modules() if name_under(n, prefix) and isinstance(m, Fp8Module)]
        if already:
            raise ValueError(f"TrainerConfig: key 'keep_high_precision' prefix {prefix!r} covers {already}, which the "
                             "model already builds as FP8 modules (fp8mp.nn.Linear, ...); build them as torch modules "
                             "to keep them")
    _apply_format_overrides(model, config, recipe)
    if config.lora is not None:
        lora = config.lora
        model = apply_lora(model, lora.rank, lora.alpha, list(lora.targets), fp8_base_weight=lora.fp8_base_weight)
    return model


def _apply_format_overrides(model: torch.nn.Module, config: TrainerConfig, recipe) -> None:
    """Set `fp8_recipe` on the converted modules under each prefix (the longest matching prefix wins)."""
    converted = {name: m for name, m in model.named_modules() if isinstance(m, Fp8Module)}
    recipes = {config.fp8_format: recipe}
    for prefix, fmt in sorted(config.format_overrides, key=lambda pair: len(pair[0])):
        matched = [m for name, m in converted.items() if name_under(name, prefix)]
        if not matched:
            raise ValueError(f"TrainerConfig: key 'format_overrides' prefix {prefix!r} matches no converted module; "
                             f"the converted modules are {sorted(converted)}")
        if fmt not in recipes:
            recipes[fmt] = config.fp8_recipe(fmt)
        for module in matched:
            module.fp8_recipe = recipes[fmt]


def build_optimizer(model: torch.nn.Module, config: TrainerConfig):
    """AdamW over the trainable parameters; with unfrozen FP8-stored weights, over their FP32 masters too."""
    def adamw(params) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]
        if not trainable:
            raise ValueError("Trainer: argument 'model' has no trainable parameter (all have requires_grad=False)")
        return torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)

    if any(getattr(m, "stores_fp8_weight", False) and not getattr(m, "weight_frozen", False) for m in model.modules()):
        return MasterWeightOptimizer(adamw, model)
    return adamw(model.parameters())


def nonfinite_layer_names(model: torch.nn.Module, found) -> list[tuple[str, tuple[str, ...]]]:
    """(name in `model`, tensors) of each NonfiniteCast in `found` (LossScaler.nonfinite_fp8_casts)."""
    if not found:
        return []
    names = {id(module): name or "<root>" for name, module in model.named_modules()}
    return [(names.get(id(cast.module), type(cast.module).__name__), cast.tensors) for cast in found]


def _device_type(model: torch.nn.Module) -> str:
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device.type
    return "cpu"


def _checked_loss(loss) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        what = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"Trainer: argument 'loss_fn' must return a scalar loss tensor, got {what}")
    return loss
