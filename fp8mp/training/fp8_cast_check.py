"""The FP8 half of LossScaler's step check: did an FP8 cast of this step meet an Inf or a NaN?

E4M3 has no Inf: a cast saturates ±Inf to ±448. One Inf in the input of an FP8 layer therefore gives
finite outputs, a finite loss and finite gradients, and a scaler that looks at gradients only would let
the optimizer step on that batch (in BF16 the same batch gives an Inf loss and is skipped). The casts
record their tensor's amax NaN/Inf-propagating, and each module folds every amax of the step into
`Fp8Meta.step_amax`, so the information is on the device. `gather` collects it, without a sync, for
the fp8mp modules that ran in FP8 in this thread since the last check, as one flag tensor that
LossScaler syncs together with its gradient check (still one device->host sync per step).

With `fp8_autocast(fp8_group=...)` the flags are max-reduced over the group first (one small
all_reduce), so every rank skips the same steps: a rank's finite gradients after DDP's reduction would
otherwise step on some ranks and not others.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mp.scaling.autocast import take_unchecked_modules
from fp8mp.scaling.fp8_meta import LinearTensor

__all__ = ["PendingCheck", "NonfiniteCast", "gather", "forget"]


@dataclass(frozen=True)
class NonfiniteCast:
    """An fp8mp module whose FP8 casts met an Inf/NaN in a step, and in which of its tensors."""

    module: torch.nn.Module
    tensors: tuple[str, ...]  # "input", "weight", "grad_output"


def _tensor_name(module: torch.nn.Module, index: int) -> str:
    if module.fp8_meta.num_tensors == len(LinearTensor):
        return LinearTensor(index).name.lower()
    return f"tensor {index}"


@dataclass
class PendingCheck:
    """The flags of one step's FP8 casts, still on the device."""

    modules: list[torch.nn.Module]
    flags: torch.Tensor  # 1-D bool, every module's Fp8Meta columns one after the other

    def findings(self, synced: list) -> list[NonfiniteCast]:
        """The modules whose flags (`synced`: `flags` as host values, in order) are set."""
        found, offset = [], 0
        for module in self.modules:
            columns = synced[offset: offset + module.fp8_meta.num_tensors]
            offset += len(columns)
            if any(columns):
                found.append(NonfiniteCast(module, tuple(_tensor_name(module, i) for i, c in enumerate(columns) if c)))
        return found


def gather() -> PendingCheck | None:
    """Take the Inf/NaN flags of the FP8 casts this thread ran since the last call (resetting them);
    None when no fp8mp module ran in FP8. No device->host sync."""
    entries = take_unchecked_modules()  # (every module recorded is an FP8 module: it has an fp8_meta)
    if not entries:
        return None
    modules = [m for m, _ in entries]
    device = modules[0].fp8_meta.step_amax.device
    flags = torch.cat([m.fp8_meta.take_nonfinite().to(device, non_blocking=True) for m in modules])
    groups = {id(group): group for _, group in entries if group is not None}
    if groups:
        reduced = flags.to(torch.int32)
        for group in groups.values():
            torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MAX, group=group)
        flags = reduced.bool()
    return PendingCheck(modules, flags)


def forget() -> None:
    """Drop this thread's pending modules unchecked (a new LossScaler: casts before it are not its steps')."""
    take_unchecked_modules()
