"""What a measurement needs to know of a device: its name, and how to wait for the work queued on it.

The one place above the ops where a device's type is asked: timing is device-specific by nature (a CUDA kernel
returns before it has run), so the layers above call these instead of testing a tensor for CUDA.
"""
from __future__ import annotations

import platform

import torch

__all__ = ["device_label", "synchronize"]


def device_label(device: torch.device) -> str:
    """The device's name: a GPU's as its driver gives it, else "cpu (<processor>, <threads> threads)"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on `device` has run (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
