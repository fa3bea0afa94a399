"""Tensor-parallel styles for fp8mp Linear: torch's ColwiseParallel / RowwiseParallel, keeping the FP8 state local.

    from torch.distributed.tensor.parallel import parallelize_module, SequenceParallel
    from fp8mp.parallel.tensor_parallel import Fp8ColwiseParallel, Fp8RowwiseParallel

    parallelize_module(block, tp_mesh, {"attention.wq": Fp8ColwiseParallel(), "attention.wo": Fp8RowwiseParallel(),
                                        "ffn_norm": SequenceParallel(), ...})
    with fp8mp.fp8_autocast(fp8_group=torch.distributed.group.WORLD):   # a group covering data x tensor parallel
        loss = model(x)

They take the arguments of torch's styles and shard weight and bias as those do; the layer then runs its FP8
GEMMs on the local shards (fp8mp/parallel/sharded_linear.py). Why not torch's own styles: they distribute every
submodule of the layer they shard, and an fp8mp Linear holds its FP8 scaling state in a submodule
(`fp8_meta`): RowwiseParallel then looks for a `weight` on it and fails, and ColwiseParallel turns its amax and
scale buffers into DTensors, which the FP8 casts cannot take (fp8mp raises naming these styles). Here only the
layer's own weight and bias are distributed; the scaling buffers stay plain tensors, equal on every rank
because the amaxes are reduced over `fp8_group`.

Any other module these styles are given (a plain nn.Linear or nn.Embedding left in high precision) is
sharded exactly as torch's styles shard it.

Sequence parallel: `Fp8ColwiseParallel(input_layouts=Shard(1))` all-gathers the layer's input as FP8 codes (one
byte an element, where torch's ColwiseParallel gathers 2 in bf16 or 4 in fp32), as torchao's
Float8ColwiseParallel does: each rank casts its shard with the input scale every rank shares (delayed scaling:
from the amax history; current scaling: after one all-reduce of the shards' amaxes), so the gathered codes are
those of casting the gathered input. The input gradient is reduce-scattered in its own dtype.
"""
from __future__ import annotations

import copy

import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from fp8mp.utils.dtensor import is_dtensor
from fp8mp.scaling.fp8_meta import Fp8Meta

__all__ = ["Fp8ColwiseParallel", "Fp8RowwiseParallel"]


def _keep_scaling_buffers_local(module: torch.nn.Module) -> None:
    """Undo distribute_module's replication of the Fp8Meta buffers: each becomes its local tensor (the whole
    buffer, the same on every rank)."""
    for meta in module.modules():
        if isinstance(meta, Fp8Meta):
            meta._column_cache = None  # views of the replaced buffers
            for name, buffer in meta._buffers.items():
                if is_dtensor(buffer):
                    meta._buffers[name] = buffer.to_local().detach()


class _LocalFp8State:
    """What both styles change in torch's: distribute the layer's own parameters only, then keep its FP8
    scaling buffers plain tensors."""

    def _partition_linear_fn(self, name, module, device_mesh):
        if name == "":  # the layer itself; not its fp8_meta
            super()._partition_linear_fn(name, module, device_mesh)

    def _apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        module = super()._apply(module, device_mesh)
        _keep_scaling_buffers_local(module)
        return module


class Fp8ColwiseParallel(_LocalFp8State, ColwiseParallel):
    """torch's ColwiseParallel (weight and bias `Shard(0)`, output `Shard(-1)`) for fp8mp Linear layers: only the
    layer's own parameters are distributed, its FP8 scaling buffers stay plain tensors (module docstring).

    fp8_all_gather: with a sequence-parallel input (`input_layouts=Shard(1)`), the layer gets the input as it
    is sharded and all-gathers it as FP8 codes, one byte an element, cast with the scale every rank shares;
    outside fp8_autocast (or falling back) it gathers it in its own dtype. False: the style gathers it in its own
    dtype before the layer runs, as torch's ColwiseParallel does.
    """

    def __init__(self, *, fp8_all_gather: bool = True, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(fp8_all_gather, bool):
            raise TypeError(f"Fp8ColwiseParallel: argument 'fp8_all_gather' must be a bool, got "
                            f"{type(fp8_all_gather).__name__}")
        layout = self.input_layouts[0]
        if fp8_all_gather and layout.is_shard() and layout.dim != -1:
            self.desired_input_layouts = self.input_layouts  # the layer gathers it, in FP8

    def _apply(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
        # An fp8mp module is one holding an Fp8Meta (checked so, not by class, so that this layer imports no nn).
        fp8_module = isinstance(getattr(module, "fp8_meta", None), Fp8Meta)
        if not fp8_module and self.desired_input_layouts != (Replicate(),):
            # a module that is not fp8mp's (a Linear kept in high precision) gets its input gathered by the style
            style = copy.copy(self)
            style.desired_input_layouts = (Replicate(),)
            return super(Fp8ColwiseParallel, style)._apply(module, device_mesh)
        return super()._apply(module, device_mesh)


class Fp8RowwiseParallel(_LocalFp8State, RowwiseParallel):
    """torch's RowwiseParallel (weight `Shard(1)`, bias replicated, input `Shard(-1)`, output summed) for fp8mp
    Linear layers: only the layer's own parameters are distributed, its FP8 scaling buffers stay plain tensors
    (module docstring)."""
