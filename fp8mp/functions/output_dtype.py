"""The dtype an FP8 layer returns: torch.autocast's where it is on, as torch.nn.Linear's under autocast."""
from __future__ import annotations

import torch


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """torch.autocast's dtype for x's device type while autocast is enabled there, else x's dtype.

    Under `torch.autocast(dtype=torch.bfloat16)` a torch.nn.Linear returns bf16 whatever its input,
    so the ops after it (GELU, attention, residual adds) run in bf16; an FP8 layer that returned its
    fp32 input's dtype would keep the whole model's activations in fp32. Only the output (and so the
    gradient arriving at it) follows autocast: the input is cast to FP8 from its own dtype (one
    rounding, no bf16 copy) and its gradient has its own dtype, as autograd requires.
    """
    device_type = x.device.type
    if device_type == "meta":  # torch.autocast has no meta device (is_autocast_enabled("meta") raises)
        return x.dtype
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype
