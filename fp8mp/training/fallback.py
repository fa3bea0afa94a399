"""Automatic precision fallback: a layer whose FP8 casts keep overflowing runs in high precision for a while.

Usage::

    policy = fp8mp.fallback.FallbackPolicy(max_bad_steps=2, cooldown_steps=100)
    for x, y in data:
        with fp8mp.fp8_autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        policy.step(model)         # once per optimizer step, after backward

A step is *bad* for a layer when any amax its FP8 casts recorded in that step (input, weight,
gradient of the output) is Inf or NaN. After `max_bad_steps` bad steps in a row the layer's
`fp8_fallback` flag is set: it then computes with plain `F.linear` in the input's dtype (BF16 for
bf16 inputs) for exactly `cooldown_steps` steps, after which its scaling state is reset (scales
from the data again, as on step 0) and it retries FP8. Both transitions are logged on the
"fp8mp" logger (WARNING when a layer falls back, INFO when it returns). `step` checks all layers
with one stacked reduction and one device->host sync.

Per-layer precision policy of fp8mp training:
    - matmuls (fp8mp.nn.Linear): FP8 inside fp8_autocast, E4M3 forward, E5M2 (HYBRID) or E4M3 gradients,
      fp32 accumulation; layers in fallback: the input's dtype.
    - norms, softmax, losses, activations: not fp8mp modules; they run in the model's precision
      (fp32, or bf16 under torch.autocast, which keeps softmax/norm reductions in fp32).
    - weights: FP32 (or FP8 storage with FP32 masters, fp8mp.optim.MasterWeightOptimizer); the
      optimizer update is always in FP32.
    - gradient clipping: in FP32 on true gradients; with a LossScaler call `scaler.unscale_(optimizer)`
      before `torch.nn.utils.clip_grad_norm_`.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.scaling.config_checks import check_int

__all__ = ["FallbackPolicy"]

logger = logging.getLogger("fp8mp")


@dataclasses.dataclass
class _LayerState:
    bad_steps: int = 0  # bad steps in a row while in FP8
    cooldown_left: int = 0  # steps still to run in high precision
    total_bad_steps: int = 0  # every bad step so far


def _fp8_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The FP8 modules of `model` (fp8mp.nn.Fp8Module: an `fp8_meta` and an `fp8_fallback` flag), by name."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"FallbackPolicy.step: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    return [(name or "<root>", m) for name, m in model.named_modules() if isinstance(m, Fp8Module)]


class FallbackPolicy:
    """Drops layers whose FP8 casts overflow repeatedly to high precision (see the module docstring).

    Args:
        max_bad_steps: int >= 1, bad steps in a row that send a layer to high precision.
        cooldown_steps: int >= 1, steps the layer then runs in high precision before retrying FP8.
        fp8_group: torch.distributed process group (the one given to fp8_autocast): a layer is judged
            bad when it overflowed on any rank (one all_reduce per step), so every rank falls back together.
    """

    def __init__(self, max_bad_steps: int = 2, cooldown_steps: int = 100, fp8_group=None):
        self.max_bad_steps = check_int("FallbackPolicy: argument 'max_bad_steps'", max_bad_steps, 1)
        self.cooldown_steps = check_int("FallbackPolicy: argument 'cooldown_steps'", cooldown_steps, 1)
        self.fp8_group = fp8_group
        self._states: dict[str, _LayerState] = {}

    def state_dict(self) -> dict:
        """Per-layer counters (bad steps in a row, cooldown left), for checkpoints."""
        return {name: dataclasses.asdict(state) for name, state in self._states.items()}

    def load_state_dict(self, state_dict: dict, model: torch.nn.Module) -> None:
        """Restore `state_dict()`'s counters and set `model`'s layers in cooldown back to high precision."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"FallbackPolicy.load_state_dict: argument 'state_dict' must be a dict, got {type(state_dict).__name__}")
        self._states = {name: _LayerState(**fields) for name, fields in state_dict.items()}
        for name, layer in _fp8_layers(model):
            state = self._states.get(name)
            layer.fp8_fallback = state is not None and state.cooldown_left > 0

    def step(self, model: torch.nn.Module, nonfinite_layers=None) -> None:
        """Judge this step for every fp8mp layer of `model` and flip their `fp8_fallback` flags.

        nonfinite_layers: the names of the layers whose FP8 casts met an Inf/NaN in this step, when the
        caller already knows them (fp8mp.Trainer passes what LossScaler found: no second sync); None
        reads each layer's newest amax.
        """
        watched = []
        for name, layer in _fp8_layers(model):
            state = self._states.setdefault(name, _LayerState())
            if layer.fp8_fallback:
                if state.cooldown_left > 0:  # a flag set by hand is left alone
                    self._count_down(name, layer, state)
            else:
                watched.append((name, layer, state))
        if nonfinite_layers is None:
            flags = self._bad_flags([layer for _, layer, _ in watched])
        else:
            named = set(nonfinite_layers)
            flags = self._agreed(torch.tensor([name in named for name, _, _ in watched], dtype=torch.bool))
        for (name, layer, state), bad in zip(watched, flags):
            state.bad_steps = state.bad_steps + 1 if bad else 0
            state.total_bad_steps += bool(bad)
            if state.bad_steps >= self.max_bad_steps:
                self._fall_back(name, layer, state)

    def _bad_flags(self, layers: list[torch.nn.Module]) -> list[bool]:
        """Whether each layer's amax holds an Inf/NaN (on any rank of fp8_group): one stacked reduction, one sync."""
        if not layers:
            return []
        device = layers[0].fp8_meta.amax.device
        return self._agreed(torch.stack([~torch.isfinite(layer.fp8_meta.amax).all().to(device, non_blocking=True)
                                         for layer in layers]))

    def _agreed(self, flags: torch.Tensor) -> list[bool]:
        """`flags` as bools, each set when it is on any rank of fp8_group (one all_reduce)."""
        if self.fp8_group is not None and flags.numel():
            flags = flags.to(torch.int32)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX, group=self.fp8_group)
        return [bool(flag) for flag in flags.tolist()]

    def _fall_back(self, name: str, layer: torch.nn.Module, state: _LayerState) -> None:
        layer.fp8_fallback = True
        state.bad_steps, state.cooldown_left = 0, self.cooldown_steps
        logger.warning("fp8mp: layer '%s' overflowed in FP8 (non-finite amax) for %d steps in a row; "
                       "running it in high precision for %d steps", name, self.max_bad_steps, self.cooldown_steps)

    @staticmethod
    def _count_down(name: str, layer: torch.nn.Module, state: _LayerState) -> None:
        state.cooldown_left -= 1
        if state.cooldown_left > 0:
            return
        layer.fp8_fallback = False
        layer.fp8_meta.reset_scaling()
        logger.info("fp8mp: layer '%s' returns to FP8 after its high-precision cooldown", name)

    def bad_step_counts(self) -> dict[str, int]:
        """Every layer's number of bad steps (non-finite FP8 casts) so far, in FP8 or not."""
        return {name: state.total_bad_steps for name, state in self._states.items()}

    def layers_in_fallback(self, model: torch.nn.Module) -> list[str]:
        """Names of `model`'s fp8mp layers now running in high precision."""
        return [name for name, layer in _fp8_layers(model) if layer.fp8_fallback]
