"""Every random number generator a training step may draw from, captured and restored (checkpoints).

torch's CPU generator, every initialized CUDA device's, Python's `random` and NumPy's global
generator. The captured state holds only tensors, ints, floats, strings and lists, so it loads with
`torch.load(weights_only=True)`.
"""
from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["capture", "restore"]


def capture() -> dict:
    numpy_state = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()),
             "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
