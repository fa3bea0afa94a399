"""fp8mp.optim.AdamW: AdamW (decoupled weight decay) on the fused ``fp8mp::adamw_step`` op."""
from __future__ import annotations

import torch

from fp8mp.ops import optim as optim_ops
from fp8mp.optim.fused import FusedOptimizer

__all__ = ["AdamW"]


class AdamW(FusedOptimizer):
    """AdamW whose step reads each parameter, gradient and state once and writes them once (one op per parameter).

    Args:
        params: float32 or bfloat16 parameters (or param groups), all on one device.
        lr, betas, eps, weight_decay: as torch.optim.AdamW (lr may be changed by LR schedulers between steps).
        state_dtype: torch.float8_e4m3fn (default: m and sqrt(v) in E4M3 with one float32 scale per 128
            elements, 2.06 bytes of state per parameter), torch.bfloat16 (4 bytes) or torch.float32 (8 bytes,
            torch.optim.AdamW's arithmetic). FP8 and bf16 states are rounded stochastically (an EMA step below
            the format's spacing would otherwise freeze them).
        seed: the stochastic rounding's seed (bfloat16 parameters and states); parameter i draws stream seed + i.
        skip_nonfinite: skip a step (change nothing) when any gradient holds an Inf or a NaN; see
            fp8mp.optim.fused.

    bfloat16 parameters are rounded stochastically (unbiased, counter-based: bit-identical on CPU and CUDA and
    after a resume); float32 parameters take the fp32 update. State: ``step``, ``seed``, ``exp_avg``,
    ``exp_avg_sq`` (sqrt(v) when FP8; benchmarks/sqnr_optimizer_states.py measured why) and, for FP8,
    ``exp_avg_scale`` / ``exp_avg_sq_scale``.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, state_dtype: torch.dtype = torch.float8_e4m3fn, seed: int = 0,
                 skip_nonfinite: bool = True):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults, state_dtype=state_dtype, seed=seed, skip_nonfinite=skip_nonfinite)
        for group in self.param_groups:
            self._check_group_hyper(group)

    def _check_group_hyper(self, group: dict) -> None:
        lr, (beta1, beta2), eps, wd = self._float(group["lr"]), group["betas"], group["eps"], group["weight_decay"]
        for name, value, ok in (("lr", lr, 0 <= lr < float("inf")), ("betas[0]", beta1, 0 <= beta1 < 1),
                                ("betas[1]", beta2, 0 <= beta2 < 1), ("eps", eps, 0 < eps < float("inf")),
                                ("weight_decay", wd, 0 <= wd < float("inf"))):
            if not ok:
                raise ValueError(f"AdamW: argument '{name}' is out of range: {value}")

    def _step_parameter(self, group, p, grad, state, found_inf, element_offset):
        beta1, beta2 = group["betas"]
        optim_ops.adamw_step(p, grad, state["exp_avg"], self._scale(state, "exp_avg"), state["exp_avg_sq"],
                             self._scale(state, "exp_avg_sq"), state["step"], found_inf, lr=self._float(group["lr"]),
                             beta1=float(beta1), beta2=float(beta2), eps=float(group["eps"]),
                             weight_decay=float(group["weight_decay"]), seed=int(state["seed"]),
                             element_offset=element_offset)
