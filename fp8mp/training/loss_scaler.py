"""Dynamic loss scaling: `LossScaler`, with torch.amp.GradScaler's API and a hard guarantee.

    scaler = fp8mp.LossScaler()
    for x, y in data:
        optimizer.zero_grad()
        with fp8mp.fp8_autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                       # optional: only to clip or inspect grads
        torch.nn.utils.clip_grad_norm_(params, 1.0)      # in FP32, on true (unscaled) gradients
        scaler.step(optimizer)                           # skipped if any gradient is Inf/NaN
        scaler.update()                                  # halve on overflow, grow after clean steps

The loss is multiplied by the scale before backward so that small gradients stay
above FP8/FP16 underflow; gradients are divided by it again before the optimizer
sees them. **No parameter is ever updated from a non-finite gradient**: `step`
checks every gradient of the optimizer (all param groups, all devices, all dtypes)
for Inf/NaN with one fused kernel per (device, dtype) and a single device->host
sync, and does not call `optimizer.step()` when it finds one, so neither the
weights nor the optimizer state (momenta, step counts) change.

**Nor from a batch whose FP8 casts met an Inf or NaN.** E4M3 saturates ±Inf to ±448, so an
Inf activation can leave the loss and every gradient finite. The same check therefore also
looks at the amaxes every FP8 cast of the iteration recorded (forward and backward, of the
fp8mp modules that ran a training forward in FP8 in this thread since the last check or the
scaler's creation; see fp8mp/training/fp8_cast_check.py), synced together with the gradients'
flag: still one sync. Use one scaler per thread for all models of a step, as with GradScaler.
Such a step is skipped exactly like one with a non-finite gradient (the scale backs off), and
`nonfinite_fp8_casts` says which modules, and which of their tensors, met the Inf/NaN.

Works with any `torch.optim.Optimizer` and with `fp8mp.optim.MasterWeightOptimizer`
(anything with `param_groups` and `step`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from fp8mp.training import fp8_cast_check
from fp8mp.training.fp8_cast_check import NonfiniteCast

__all__ = ["LossScaler"]

_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale", "growth_tracker",
               "num_steps", "num_skipped_steps")


def _check_positive_float(name: str, value, low: float = 0.0, high: float = math.inf) -> float:
    """`value` as a float in the open interval (low, high); ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < float(value) < high:
        raise ValueError(f"LossScaler: argument '{name}' must be a finite number in ({low}, {high}), got {value!r}")
    return float(value)


class _OptimizerState:
    """What the scaler knows about one optimizer during the current iteration."""

    def __init__(self) -> None:
        self.unscaled = False
        self.stepped = False
        self.found_inf: bool | torch.Tensor = False  # a bool once synced, a device tensor before


class LossScaler:
    """Dynamic loss scaling (see the module docstring for the loop).

    Args:
        init_scale: first scale, a finite number > 0.
        growth_factor: the scale is multiplied by it after `growth_interval` clean steps in a row (> 1).
        backoff_factor: the scale is multiplied by it after a step with a non-finite gradient (in (0, 1)).
        growth_interval: int >= 1, clean steps in a row before the scale grows.
        min_scale: the scale never backs off below it (finite, > 0, <= init_scale).
        enabled: False makes every method a pass-through (scale(loss) is loss, step just steps).

    Counters: `num_steps` (iterations seen by `update`), `num_skipped_steps` (of which skipped for
    a non-finite gradient or FP8 cast), `num_fp8_skipped_steps` (of which an FP8 cast met an Inf/NaN).
    All of it is in `state_dict()`.
    """

    def __init__(self, init_scale: float = 8192.0, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, min_scale: float = 1.0, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise ValueError(f"LossScaler: argument 'enabled' must be a bool, got {enabled!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"LossScaler: argument 'growth_interval' must be an int >= 1, got {growth_interval!r}")
        self._init_scale = _check_positive_float("init_scale", init_scale)
        self._growth_factor = _check_positive_float("growth_factor", growth_factor, low=1.0)
        self._backoff_factor = _check_positive_float("backoff_factor", backoff_factor, high=1.0)
        self._min_scale = _check_positive_float("min_scale", min_scale)
        if self._min_scale > self._init_scale:
            raise ValueError(f"LossScaler: argument 'min_scale' ({min_scale}) must be <= init_scale ({init_scale})")
        self._growth_interval = growth_interval
        self._enabled = enabled
        self._scale_value = self._init_scale  # the host copy: every change is decided on the host
        self._scale_tensors: dict[torch.device, torch.Tensor] = {}
        self._growth_tracker = 0
        self.num_steps = 0
        self.num_skipped_steps = 0
        self.num_fp8_skipped_steps = 0
        self._per_optimizer: defaultdict[int, _OptimizerState] = defaultdict(_OptimizerState)
        # This iteration's FP8 cast flags: gathered at its first unscale_, synced with the first step.
        self._fp8_check: fp8_cast_check.PendingCheck | None = None
        self._fp8_found: list[NonfiniteCast] | None = None
        self._last_fp8_found: list[NonfiniteCast] = []
        if enabled:
            fp8_cast_check.forget()

    # ----------------------------------------------------------------------------- scale
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled). No device sync."""
        return self._scale_value if self._enabled else 1.0

    def get_growth_tracker(self) -> int:
        """Clean steps in a row since the scale last changed."""
        return self._growth_tracker

    def _scale_on(self, device: torch.device) -> torch.Tensor:
        """The scale as a 0-dim float32 tensor on `device`, refreshed without a sync when it changes."""
        tensor = self._scale_tensors.get(device)
        if tensor is None:
            tensor = self._scale_tensors[device] = torch.empty((), dtype=torch.float32, device=device)
            tensor.fill_(self._scale_value)
        return tensor

    def _set_scale(self, value: float) -> None:
        self._scale_value = value
        for tensor in self._scale_tensors.values():
            tensor.fill_(value)  # a kernel launch, not a sync

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss * scale` (the loss unchanged when disabled)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"LossScaler.scale: argument 'loss' must be a torch.Tensor, got {type(loss).__name__}")
        if not self._enabled:
            return loss
        return loss * self._scale_on(loss.device)

    # ----------------------------------------------------------------------------- unscale, step
    def unscale_(self, optimizer) -> None:
        """Divide `optimizer`'s gradients by the scale, in place, recording whether any is Inf/NaN.

        Call it at most once per optimizer between `update()`s, and before `step` if you need the
        true gradients (gradient clipping in FP32, logging). No device->host sync.
        """
        if not self._enabled:
            return
        state = self._per_optimizer[id(optimizer)]
        if state.unscaled:
            raise RuntimeError("LossScaler.unscale_: already called for this optimizer since the last update()")
        if state.stepped:
            raise RuntimeError("LossScaler.unscale_: called after step(); call update() first")
        if self._fp8_check is None and self._fp8_found is None:
            self._fp8_check = fp8_cast_check.gather()
            if self._fp8_check is None:
                self._fp8_found = []
        state.found_inf = self._unscale_grads(_grads_of(optimizer))
        state.unscaled = True

    def _sync(self, found_inf: torch.Tensor | bool) -> bool:
        """The iteration's one device->host sync: this optimizer's gradient flag and, the first
        time, the FP8 cast flags with it. True when either found an Inf/NaN."""
        check = self._fp8_check
        if check is not None:
            grad_flag = found_inf if isinstance(found_inf, torch.Tensor) else torch.tensor(found_inf)
            values = torch.cat([grad_flag.reshape(1).to(check.flags.device, torch.bool), check.flags]).tolist()
            found_inf, self._fp8_found, self._fp8_check = values[0], check.findings(values[1:]), None
        elif isinstance(found_inf, torch.Tensor):
            found_inf = found_inf.item()
        return bool(found_inf) or bool(self._fp8_found)

    def _unscale_grads(self, grads: list[torch.Tensor]) -> torch.Tensor | bool:
        """Unscale `grads` with one fused op per (device, dtype); a 1-element 'found Inf/NaN' tensor."""
        groups: defaultdict[tuple, list[torch.Tensor]] = defaultdict(list)
        for grad in grads:
            groups[(grad.device, grad.dtype)].append(grad)
        found_per_device: dict[torch.device, torch.Tensor] = {}
        for (device, _), group in groups.items():
            found = found_per_device.setdefault(device, torch.zeros(1, dtype=torch.float32, device=device))
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, self.inv_scale_on(device))
        if not found_per_device:
            return False
        found = list(found_per_device.values())
        return torch.stack([f.to(found[0].device, non_blocking=True) for f in found]).sum() > 0

    def inv_scale_on(self, device: torch.device) -> torch.Tensor:
        """1 / scale as the 0-dim float32 on `device` that unscaling multiplies the gradients by."""
        return self._scale_on(device).double().reciprocal().float()

    def record_checked_step(self, optimizer, found_inf: torch.Tensor) -> bool:
        """For a step whose gradients were unscaled and checked for Inf/NaN elsewhere (fp8mp.step_in_backward,
        which never holds them all at once): record `found_inf` (a 1-element device flag, nonzero when a
        gradient held an Inf/NaN) as `optimizer`'s, sync it with the FP8 casts' flags (the iteration's one
        sync) and mark the optimizer stepped, as `step` would. Returns True when the step must be skipped;
        `update()` then backs off as after a skipped `step`."""
        if not self._enabled:
            return bool(found_inf.item())
        state = self._per_optimizer[id(optimizer)]
        if state.unscaled or state.stepped:
            raise RuntimeError("LossScaler.record_checked_step: the optimizer was already unscaled or stepped since "
                               "the last update()")
        if self._fp8_check is None and self._fp8_found is None:
            self._fp8_check = fp8_cast_check.gather()
            if self._fp8_check is None:
                self._fp8_found = []
        state.found_inf = self._sync(found_inf)
        state.unscaled = state.stepped = True
        return state.found_inf

    def step(self, optimizer, *args: Any, **kwargs: Any):
        """Unscale (unless `unscale_` already did) and call `optimizer.step(*args, **kwargs)` only if
        every gradient is finite. Returns what `optimizer.step` returned, or None when skipped.

        The one device->host sync of the iteration happens here.
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("LossScaler.step: argument 'closure' is not supported (the scaler must see the "
                               "gradients before the optimizer steps)")
        state = self._per_optimizer[id(optimizer)]
        if state.stepped:
            raise RuntimeError("LossScaler.step: already called for this optimizer since the last update()")
        if not state.unscaled:
            self.unscale_(optimizer)
        state.found_inf = self._sync(state.found_inf)  # the sync
        state.stepped = True
        if state.found_inf:
            return None
        return optimizer.step(*args, **kwargs)

    # ----------------------------------------------------------------------------- update
    def update(self) -> None:
        """Adjust the scale after this iteration's `step`(s): back off on overflow, grow after
        `growth_interval` clean steps in a row. Counts the iteration, and it as skipped on overflow."""
        if not self._enabled:
            return
        if not self._per_optimizer:
            raise RuntimeError("LossScaler.update: no unscale_() or step() was recorded since the last update()")
        found_inf = any([self._sync(s.found_inf) for s in self._per_optimizer.values()])  # bools after step()
        self._last_fp8_found, self._fp8_found, self._fp8_check = self._fp8_found or [], None, None
        self._per_optimizer.clear()
        self.num_steps += 1
        if found_inf:
            self.num_skipped_steps += 1
            self.num_fp8_skipped_steps += bool(self._last_fp8_found)
            self._growth_tracker = 0
            self._set_scale(max(self._scale_value * self._backoff_factor, self._min_scale))
            return
        self._growth_tracker += 1
        if self._growth_tracker >= self._growth_interval:
            self._growth_tracker = 0
            grown = self._scale_value * self._growth_factor
            if math.isfinite(grown) and grown <= torch.finfo(torch.float32).max:
                self._set_scale(grown)

    @property
    def nonfinite_fp8_casts(self) -> list[NonfiniteCast]:
        """The fp8mp modules whose FP8 casts met an Inf/NaN in the last iteration closed by `update()` (empty if
        none did, or when disabled), each with the tensors concerned ("input", "weight", "grad_output")."""
        return list(self._last_fp8_found)

    # ----------------------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        """Scale, factors, growth tracker and counters (empty when disabled, as GradScaler)."""
        if not self._enabled:
            return {}
        return {"scale": self._scale_value, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "min_scale": self._min_scale, "growth_tracker": self._growth_tracker,
                "num_steps": self.num_steps, "num_skipped_steps": self.num_skipped_steps,
                "num_fp8_skipped_steps": self.num_fp8_skipped_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what `state_dict()` returned; ValueError naming the missing key otherwise."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"LossScaler.load_state_dict: argument 'state_dict' must be a dict, got {type(state_dict).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state_dict]
        if missing:
            raise ValueError(f"LossScaler.load_state_dict: argument 'state_dict' lacks keys {missing} "
                             "(was it saved by a disabled scaler?)")
        checked = LossScaler(state_dict["scale"], state_dict["growth_factor"], state_dict["backoff_factor"],
                             state_dict["growth_interval"], min(state_dict["min_scale"], state_dict["scale"]))
        self._growth_factor, self._backoff_factor = checked._growth_factor, checked._backoff_factor
        self._growth_interval, self._min_scale = checked._growth_interval, float(state_dict["min_scale"])
        self._set_scale(checked._init_scale)
        self._growth_tracker = int(state_dict["growth_tracker"])
        self.num_steps = int(state_dict["num_steps"])
        self.num_skipped_steps = int(state_dict["num_skipped_steps"])
        self.num_fp8_skipped_steps = int(state_dict.get("num_fp8_skipped_steps", 0))
        self._per_optimizer.clear()
        self._fp8_check = self._fp8_found = None


def _grads_of(optimizer) -> list[torch.Tensor]:
    """Every gradient of `optimizer`'s parameters (sparse ones by their values), each once."""
    if not hasattr(optimizer, "param_groups"):
        raise TypeError(f"argument 'optimizer' must have param_groups (a torch.optim.Optimizer), got {type(optimizer).__name__}")
    grads, seen = [], set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None or id(param) in seen:
                continue
            seen.add(id(param))
            grad = param.grad
            if grad.is_sparse:  # unscaling the values of the coalesced gradient unscales it
                param.grad = grad.coalesce()
                grad = param.grad._values()
            grads.append(grad)
    return grads
