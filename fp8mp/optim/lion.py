"""fp8mp.optim.Lion: Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023) on the fused
``fp8mp::lion_step`` op: the same state encodings, stochastic rounding and skipping as fp8mp.optim.AdamW,
with one state."""
from __future__ import annotations

import torch

from fp8mp.ops import optim as optim_ops
from fp8mp.optim.fused import FusedOptimizer

__all__ = ["Lion"]


class Lion(FusedOptimizer):
    """Lion: ``p -= lr (sign(b1 m + (1 - b1) g) + wd p)``, ``m = b2 m + (1 - b2) g``, fused in one op per parameter.

    Args as fp8mp.optim.AdamW, without eps; the paper's defaults betas=(0.9, 0.99), with a learning rate
    3-10x smaller than AdamW's. State: ``step``, ``seed``, ``exp_avg`` (and ``exp_avg_scale`` for FP8,
    1.03 bytes of state per parameter).
    """

    state_names = ("exp_avg",)

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 *, state_dtype: torch.dtype = torch.float8_e4m3fn, seed: int = 0, skip_nonfinite: bool = True):
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        super().__init__(params, defaults, state_dtype=state_dtype, seed=seed, skip_nonfinite=skip_nonfinite)
        for group in self.param_groups:
            self._check_group_hyper(group)

    def _check_group_hyper(self, group: dict) -> None:
        lr, (beta1, beta2), wd = self._float(group["lr"]), group["betas"], group["weight_decay"]
        for name, value, ok in (("lr", lr, 0 <= lr < float("inf")), ("betas[0]", beta1, 0 <= beta1 <= 1),
                                ("betas[1]", beta2, 0 <= beta2 <= 1), ("weight_decay", wd, 0 <= wd < float("inf"))):
            if not ok:
                raise ValueError(f"Lion: argument '{name}' is out of range: {value}")

    def _step_parameter(self, group, p, grad, state, found_inf, element_offset):
        beta1, beta2 = group["betas"]
        optim_ops.lion_step(p, grad, state["exp_avg"], self._scale(state, "exp_avg"), state["step"], found_inf,
                            lr=self._float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                            weight_decay=float(group["weight_decay"]), seed=int(state["seed"]),
                            element_offset=element_offset)
