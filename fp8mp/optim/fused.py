"""The machinery every fused optimizer of fp8mp shares: state creation, argument checks, the on-device
non-finite check, and a bit-exact state_dict round trip.

A subclass names its states (``state_names``) and runs its op on one parameter (``_step_parameter``); the
states are created here in the optimizer's `state_dtype`: float32, bfloat16, or float8_e4m3fn with one
float32 scale per 128 elements (state ``<name>_scale``); the ops round bfloat16 and FP8 values stochastically
(fp8mp/ops/optim.py). Every state entry is a tensor, so
``torch.save(optimizer.state_dict())`` loads back with ``torch.load(weights_only=True)``:

* ``step``: 1-element int64 on the parameter's device, the steps taken; the op increments it, and it is the
  counter of the stochastic rounding (the bits of step t are hashed from (seed, t, element));
* ``seed``: 1-element int64 on the CPU, this parameter's stochastic-rounding stream (the optimizer's `seed`
  plus the parameter's position when the state is created).

A step whose gradients hold an Inf or a NaN changes nothing (per step: no parameter, state or step count of
any parameter moves), decided on the device without a host sync: the min and max of every gradient (a read of
each, ``torch.aminmax``) gives the flag each op reads. ``skip_nonfinite=False`` leaves that read out
for callers that have skipped such steps themselves (fp8mp's LossScaler does).
"""
from __future__ import annotations

import torch

from fp8mp.ops import optim as optim_ops

__all__ = ["FusedOptimizer"]

STATE_DTYPES = optim_ops.STATE_DTYPES
PARAM_DTYPES = optim_ops.PARAM_DTYPES


class FusedOptimizer(torch.optim.Optimizer):
    """Base of fp8mp's fused optimizers (see the module docstring). Not used directly."""

    state_names: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict, *, state_dtype: torch.dtype, seed: int, skip_nonfinite: bool):
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"{type(self).__name__}: argument 'state_dtype' must be one of "
                             f"{', '.join(map(str, STATE_DTYPES))}, got {state_dtype!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"{type(self).__name__}: argument 'seed' must be an int, got {type(seed).__name__}")
        self.state_dtype = state_dtype
        self.seed = seed
        self.skip_nonfinite = bool(skip_nonfinite)
        super().__init__(params, defaults)

    # --------------------------------------------------------------------------------- checks
    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group, refusing parameters these kernels cannot update: non-float ones (TypeError)
        and parameters on more than one device within the optimizer (ValueError)."""
        params = param_group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        name = type(self).__name__
        for i, p in enumerate(params):
            if isinstance(p, torch.Tensor) and p.dtype not in PARAM_DTYPES:
                raise TypeError(f"{name}: argument 'params' holds a {p.dtype} parameter (index {i} of its group, "
                                f"shape {list(p.shape)}); it updates float32 and bfloat16 parameters")
        devices = {p.device for group in self.param_groups for p in group["params"]}
        devices |= {p.device for p in params if isinstance(p, torch.Tensor)}
        if len(devices) > 1:
            raise ValueError(f"{name}: argument 'params' holds parameters on mixed devices "
                             f"({', '.join(sorted(map(str, devices)))}); use one optimizer per device")
        super().add_param_group(param_group)

    def _check_group_hyper(self, group: dict) -> None:
        """Subclasses: raise ValueError naming a hyperparameter out of its range."""

    # --------------------------------------------------------------------------------- state
    def _parameter_index(self, p: torch.Tensor) -> int:
        for index, q in enumerate(q for group in self.param_groups for q in group["params"]):
            if q is p:
                return index
        raise KeyError("parameter not in this optimizer")

    def _state_of(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros(1, dtype=torch.int64, device=p.device)
            state["seed"] = torch.tensor([self.seed + self._parameter_index(p)], dtype=torch.int64)
            for name in self.state_names:
                state[name] = torch.zeros(p.shape, dtype=self.state_dtype, device=p.device)
                if self.state_dtype == torch.float8_e4m3fn:
                    state[name + "_scale"] = torch.zeros(optim_ops.state_scale_numel(p.numel()), dtype=torch.float32,
                                                         device=p.device)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, keeping every state tensor's dtype and bits (torch's would cast them to the
        parameter's dtype); a state saved with another state_dtype is refused (ValueError)."""
        saved = state_dict["state"]
        for values in saved.values():
            for name in self.state_names:
                if name in values and values[name].dtype != self.state_dtype:
                    raise ValueError(f"{type(self).__name__}.load_state_dict: argument 'state_dict' holds '{name}' "
                                     f"in {values[name].dtype}, this optimizer's state_dtype is {self.state_dtype}")
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, values in saved.items():
            p = params[index]
            self.state[p] = {key: value.to(device=torch.device("cpu") if key == "seed" else p.device, copy=True)
                             for key, value in values.items()}

    def state_bytes(self) -> int:
        """Bytes of optimizer state held now (moments, scales, counters)."""
        return sum(v.numel() * v.element_size() for s in self.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor))

    # --------------------------------------------------------------------------------- step
    @staticmethod
    def _found_nonfinite(grads: list[torch.Tensor]) -> torch.Tensor:
        """1-element float32 on the gradients' device: 1 when any gradient holds an Inf or a NaN (min and max
        propagate NaN and show -Inf and +Inf), without a host sync. torch.aminmax rather than
        torch._foreach_norm(grads, inf): half the time on CPU (22 against 52 ms on a 2048x2048 fp32 gradient)."""
        extremes = [value.float() for g in grads for value in torch.aminmax(g)]
        return torch.stack(extremes).isfinite().all().logical_not().float().reshape(1)

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every parameter with a gradient; returns closure's loss if a closure is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            self._check_group_hyper(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__}: a parameter of shape {list(p.shape)} has a sparse "
                                       "gradient; fp8mp's fused optimizers take dense gradients only")
                work.append((group, p))
        if not work:
            return loss
        found_inf = self._found_nonfinite([p.grad for _, p in work]) if self.skip_nonfinite else None
        for group, p in work:
            self._step_parameter(group, p, p.grad, self._state_of(p), found_inf)
        return loss

    def _step_parameter(self, group: dict, p: torch.Tensor, grad: torch.Tensor, state: dict,
                        found_inf: torch.Tensor | None) -> None:
        raise NotImplementedError

    def _scale(self, state: dict, name: str) -> torch.Tensor | None:
        return state.get(name + "_scale")

    @staticmethod
    def _float(value) -> float:
        """A hyperparameter as a Python float (an LR scheduler may have put a tensor in the group)."""
        return float(value.item()) if isinstance(value, torch.Tensor) else float(value)
