"""Shared by the framework tests (Lightning, accelerate): a tiny regression task, a count of the fp8mp ops that ran,
and bit-for-bit comparison of checkpoint state."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

IN, HIDDEN = 32, 64
BATCH = 16


class Fp8OpCount(TorchDispatchMode):
    """Counts, by name, the fp8mp ops (torch.ops.fp8mp.*) dispatched inside the block."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name.startswith("fp8mp."):
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def mlp(seed: int = 0) -> torch.nn.Sequential:
    """Two Linear layers whose dims are multiples of 16 (both become FP8 layers)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, IN))


def regression_data(batches: int, seed: int = 1) -> torch.utils.data.TensorDataset:
    """y = x @ W for a fixed random W: an MLP learns it, its MSE falls from about 1."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batches * BATCH, IN, generator=gen)
    w = torch.randn(IN, IN, generator=gen) / IN ** 0.5
    return torch.utils.data.TensorDataset(x, x @ w)


def fp8_gemms_per_step(linears: int) -> int:
    """FP8 GEMMs of one training step: forward, input gradient and weight gradient of each Linear, but the input
    gradient of the first one (its input needs none)."""
    return 3 * linears - 1


def same_bits(a, b) -> bool:
    """a and b hold the same bits (tensors, in dicts and lists; other values equal)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_bits(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    return a == b


def fp8_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The FP8 scaling buffers of `model`'s state_dict (amax, amax history, scales)."""
    return {k: v.clone() for k, v in model.state_dict().items() if ".fp8_meta." in k}
