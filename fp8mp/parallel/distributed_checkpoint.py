"""fp8mp's whole training state through torch.distributed.checkpoint (DCP): saved on N ranks, loaded on M.

    import torch.distributed.checkpoint as dcp

    fp8mp.training.save_checkpoint("ckpt/step-100", model, optimizer, scaler)   # every rank
    ...                                                                          # later, on any number of ranks:
    fp8mp.training.load_checkpoint("ckpt/step-100", model, optimizer, scaler)   # a freshly built model, optimizer

or, to save more with it, `TrainingState` (a DCP Stateful) in your own state dict:
``dcp.save({"train": TrainingState(model, optimizer, scaler), "data": ...}, checkpoint_id=...)``.

What is saved, every piece a tensor:

* the model's state dict as torch.distributed.checkpoint.state_dict.get_state_dict gives it: FSDP2's
  parameters as sharded DTensors (each rank writes its shard), the fp8mp modules' FP8 scaling buffers
  (scale, scale_inv, amax, amax_history, initialized) as plain tensors, of which DCP keeps one copy;
* the optimizer's state dict the same way: fp8mp.optim's states and FP8 block scales are DTensors whose
  global layout depends on the parameter's shape only (fp8mp/optim/sharding.py), so DCP hands each rank of
  any world size its shard's part of them; ``step``, ``seed`` and the param groups (with their
  ``state_dtype``) once;
* the LossScaler's state (its ``state_dict()``'s numbers as float64 and int64 tensors), when one is given.

Before saving, the amaxes the next ``fp8_autocast(fp8_group=...)`` entry would reduce are reduced now
(fp8mp.scaling.distributed.reduce_every_pending_amax: the same values, so the run goes on with the scales it
would have had), and the FP8 scaling buffers are compared bit for bit across the ranks (two all_reduces
of their int32 bits): buffers that differ, as they do when fp8_autocast ran without the data-parallel group as
``fp8_group``, raise ValueError naming the module, since the checkpoint would keep rank 0's alone.

A world size the FP8 states' blocks cannot follow (a shard not starting on a 128-element block of the
whole tensor) raises ValueError naming the parameter when the optimizer's state is built for the load
(get_state_dict steps a fresh optimizer once with zero gradients and lr 0) or at its first step; states saved
in another ``state_dtype`` than the optimizer's raise ValueError naming the parameter in set_state_dict.
"""
from __future__ import annotations

import os

import torch

from fp8mp.scaling import distributed as amax_reduction
from fp8mp.scaling.fp8_meta import Fp8Meta

__all__ = ["TrainingState", "save_checkpoint", "load_checkpoint"]


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_fp8_state_replicated(model: torch.nn.Module) -> None:
    """ValueError naming the first fp8mp module whose FP8 scaling buffers (the state_dict's) differ between
    ranks; nothing without torch.distributed or on one rank. Every rank must call it."""
    if not _distributed() or torch.distributed.get_world_size() == 1:
        return
    pieces = [(f"{name}.{key}", value) for name, module in model.named_modules() if isinstance(module, Fp8Meta)
              for key, value in module.state_dict().items()]
    if not pieces:
        return
    bits = torch.cat([value.detach().reshape(-1).to(torch.int32) if value.dtype == torch.bool
                      else value.detach().reshape(-1).float().view(torch.int32) for _, value in pieces])
    low, high = bits.clone(), bits.clone()
    torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
    torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
    differs = (low != high).nonzero()
    if differs.numel():
        first, end = int(differs[0]), 0
        for name, value in pieces:
            end += value.numel()
            if first < end:
                raise ValueError(
                    f"fp8mp: the FP8 scaling buffer {name} differs between ranks; a checkpoint keeps one copy of "
                    "it. Enter fp8_autocast(fp8_group=...) with the data-parallel process group (as FSDP2 and DDP "
                    "reduce gradients over), so that every rank computes the same scales")


def _scaler_tensors(scaler) -> dict[str, torch.Tensor]:
    return {key: torch.tensor([value], dtype=torch.float64 if isinstance(value, float) else torch.int64)
            for key, value in scaler.state_dict().items()}


class TrainingState:
    """The model's, the optimizer's and (optional) the LossScaler's state as one torch.distributed.checkpoint
    Stateful (see the module docstring): ``dcp.save({"train": TrainingState(...)})`` / ``dcp.load``."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TrainingState: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("TrainingState: argument 'optimizer' must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler

    def state_dict(self) -> dict:
        """What DCP saves, and (on load) the tensors it fills in place; collective (every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if _distributed():
            amax_reduction.reduce_every_pending_amax()
        check_fp8_state_replicated(self.model)
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        if self.scaler is not None:
            state["loss_scaler"] = _scaler_tensors(self.scaler)
        return state

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        if self.scaler is not None:
            self.scaler.load_state_dict({key: value.item() for key, value in state["loss_scaler"].items()})


def save_checkpoint(checkpoint_id: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scaler=None) -> None:
    """dcp.save of TrainingState(model, optimizer, scaler) into the folder `checkpoint_id` (every rank)."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"train": TrainingState(model, optimizer, scaler)}, checkpoint_id=checkpoint_id)


def load_checkpoint(checkpoint_id: str | os.PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scaler=None) -> None:
    """dcp.load of what save_checkpoint wrote into `model`, `optimizer` and `scaler` (every rank), resharded
    to this run's world size and sharding."""
    import torch.distributed.checkpoint as dcp

    dcp.load({"train": TrainingState(model, optimizer, scaler)}, checkpoint_id=checkpoint_id)
