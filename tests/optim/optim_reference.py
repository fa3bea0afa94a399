"""fp64 references of the fused optimizer steps and readers of their stored states, independent of the kernels:
the formulas of torch.optim.AdamW and of Lion (Chen et al. 2023) in fp64, the E4M3 decode from torch's own
float8 dtype, and the block layout (128 elements, value = code * scale) the ops document."""
from __future__ import annotations

import torch

BLOCK = 128
U32 = 2.0 ** -24  # unit roundoff of fp32
E4M3_STEP = 2.0 ** -3  # the spacing of E4M3's 3-bit mantissa relative to the value (stochastic rounding moves less)
E4M3_MIN_SUBNORMAL = 2.0 ** -9  # also the spacing of the subnormals
BF16_ULP = 2.0 ** -7  # one bf16 step, relative (stochastic rounding moves less than one step)


def new_state(shape, state_dtype, names, device="cpu"):
    """Zero states as fp8mp.optim creates them: the states, their FP8 scales (or None) and step."""
    numel = torch.Size(shape).numel()
    state = {"step": torch.zeros(1, dtype=torch.int64, device=device)}
    for name in names:
        state[name] = torch.zeros(shape, dtype=state_dtype, device=device)
        state[name + "_scale"] = (torch.zeros((numel + BLOCK - 1) // BLOCK, dtype=torch.float32, device=device)
                                  if state_dtype == torch.float8_e4m3fn else None)
    return state


def dequantize(state: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A stored state as fp64 values (FP8: torch's E4M3 decode times its block's scale)."""
    values = state.double().reshape(-1)
    if scale is not None:
        values = values * scale.double().repeat_interleave(BLOCK)[: values.numel()]
    return values.view(state.shape)


def block_scale_of(scale: torch.Tensor | None, numel: int) -> torch.Tensor:
    """Each element's block scale (zeros without FP8)."""
    if scale is None:
        return torch.zeros(numel, dtype=torch.float64)
    return scale.double().repeat_interleave(BLOCK)[:numel]


def adamw_reference(p, g, m, v, t, lr, beta1, beta2, eps, wd):
    """One AdamW step in fp64 (torch.optim.AdamW's formula); all tensors fp64, t the step after the update."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bc1, bc2 = 1 - beta1 ** t, 1 - beta2 ** t
    denom = v.sqrt() / bc2 ** 0.5 + eps
    return p * (1 - lr * wd) - lr / bc1 * m / denom, m, v, denom


def lion_reference(p, g, m, lr, beta1, beta2, wd):
    """One Lion step in fp64; returns p, m and the interpolation whose sign is the update."""
    c = beta1 * m + (1 - beta1) * g
    return p * (1 - lr * wd) - lr * torch.sign(c), beta2 * m + (1 - beta2) * g, c
