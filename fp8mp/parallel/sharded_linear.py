"""fp8mp Linear on the local shards of a tensor-parallel layer (see fp8mp/parallel/tensor_parallel.py for the styles).

Under `parallelize_module` with fp8mp's `Fp8ColwiseParallel` / `Fp8RowwiseParallel` the layer gets its weight
as a DTensor on the tensor-parallel mesh (`Shard(0)` column-wise, `Shard(1)` row-wise) and its input as a
DTensor in the style's layout (`Replicate` column-wise, `Shard(-1)` row-wise; a sequence-parallel `Shard(1)`
input is gathered by the style before the layer runs). fp8mp's casts and GEMMs take local tensors, so the
layer runs on the local shards and hands back the DTensor torch's own nn.Linear would:

    column-wise   y_r = x @ W_r.T + b_r        -> Shard(-1)     (input gradient: Partial, summed by the style)
    row-wise      y_r = x_r @ W_r.T            -> Partial, + b  (DTensor's own add, as nn.Linear's)

The FP8 scales must be every rank's: a column-wise weight shows each rank only its rows, a row-wise
input only its slice of K, and the output gradients of a column-wise layer are sharded likewise. So the
amaxes are max-reduced over `fp8_autocast(fp8_group=...)`, which must contain the tensor-parallel ranks:
a group covering data x tensor parallel (`torch.distributed.group.WORLD` on a mesh spanning every rank)
makes each amax that of the whole tensor on the global batch, as one process would compute it. A missing
group or one that leaves out tensor-parallel ranks raises (`check_fp8_group`).

Refused, with an error naming what is wrong: weights on a mesh of more than one dimension (FSDP2's
unsharded weight is on the tensor-parallel mesh, which is fine), placements other than the two above,
FP8-stored or frozen FP8 weights,
and the fine-grained recipes (their block scales would follow the shards, not the whole tensor; untested).
"""
from __future__ import annotations

import math
import torch

from fp8mp.functions.linear import fp8_linear, fp8_linear_gathered
from fp8mp.utils.dtensor import from_local, is_dtensor
from fp8mp.scaling.distributed import ranks_missing_from

__all__ = ["check_fp8_group", "gathered_input", "sharded_linear"]

# (group, mesh) -> None once checked: the ranks of a group never change, and the check costs a Python list
# per call that the forward of every layer would otherwise pay.
_CHECKED: dict[tuple[object, object], None] = {}


def check_fp8_group(module: str, group, mesh, quantizer) -> None:
    """Refuse a `fp8_group` that does not contain every rank of the tensor-parallel `mesh` (or no group), and
    the quantizers whose scales cannot follow the whole tensor (block scales: those without a per-tensor
    format); `module` names the layer in the message."""
    if quantizer.per_tensor_format is None:
        raise NotImplementedError(
            f"{module}: {quantizer.name} under tensor parallel is not supported (its block scales would "
            "follow each rank's shard, not the whole tensor); use DelayedScaling or CurrentScaling")
    if (group, mesh) in _CHECKED:
        return
    tp_ranks = mesh.mesh.flatten().tolist()
    if group is None:
        raise ValueError(
            f"{module}: the weight is sharded by tensor parallel over ranks {tp_ranks}, whose shards must be cast "
            "with the same FP8 scales: pass fp8_autocast(fp8_group=...) a ProcessGroup that contains them (e.g. "
            "torch.distributed.group.WORLD, covering data x tensor parallel)")
    missing = ranks_missing_from(group, tp_ranks)
    if missing:
        raise ValueError(
            f"{module}: argument 'fp8_group' of fp8_autocast holds ranks "
            f"{sorted(torch.distributed.get_process_group_ranks(group))}, but the weight is "
            f"sharded by tensor parallel over ranks {tp_ranks}: ranks {missing} would scale their shards from "
            "other amaxes. Pass a group covering data x tensor parallel (e.g. torch.distributed.group.WORLD)")
    _CHECKED[(group, mesh)] = None


class _GatheredRoute(torch.autograd.Function):
    """Stands for the input gathered along `dim` from every rank's shard: zeros never read (the GEMMs take the
    gathered FP8 codes). Backward reduce-scatters the input gradient (each rank's is its columns' share of the
    sum) back to the shards, as the style's high-precision gather would."""

    @staticmethod
    def forward(ctx, x_local, mesh, dim, rows_shape):
        ctx.mesh, ctx.dim, ctx.local_shape = mesh, dim, x_local.shape
        ctx.global_shape = (*x_local.shape[:dim], -1, *x_local.shape[dim + 1:])
        return x_local.new_zeros(()).expand(rows_shape)

    @staticmethod
    def backward(ctx, grad):
        from torch.distributed.tensor import DTensor, Partial, Shard
        full = grad.reshape(ctx.global_shape).contiguous()
        partial = DTensor.from_local(full, ctx.mesh, [Partial()], run_check=False)
        return partial.redistribute(ctx.mesh, [Shard(ctx.dim)]).to_local(), None, None, None


def _is_sequence_sharded(x, weight) -> bool:
    """A column-wise layer's input sharded along a dimension other than K (Fp8ColwiseParallel's FP8 gather)."""
    from torch.distributed.tensor import Shard
    return (is_dtensor(x) and is_dtensor(weight) and weight.placements[0] == Shard(0) and x.placements[0].is_shard()
            and x.placements[0].dim % x.dim() != x.dim() - 1)


def gathered_input(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A column-wise layer's sequence-sharded input gathered in its own dtype (for the paths that do not run in
    FP8: outside fp8_autocast, fallback); any other input as it is."""
    if not _is_sequence_sharded(x, weight):
        return x
    from torch.distributed.tensor import Replicate
    return x.redistribute(x.device_mesh, [Replicate()])


def sharded_linear(module: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, meta, group,
                   ran_before: bool) -> torch.Tensor:
    """y = x @ weight.T + bias in FP8 for DTensor `weight` and `x` in a tensor-parallel layout (module docstring),
    on the local shards; a DTensor. A column-wise layer's input sharded along the sequence is gathered as FP8
    codes (`fp8_linear_gathered`).

    module: names the layer in errors; meta, group, ran_before: as fp8_linear takes them.
    """
    from torch.distributed.tensor import Partial, Replicate, Shard
    if not is_dtensor(weight) or not is_dtensor(x):
        raise TypeError(f"{module}: argument 'input' is {type(x).__name__} and the weight {type(weight).__name__}: "
                        "under tensor parallel both must be DTensors (parallelize_module's ColwiseParallel / "
                        "RowwiseParallel hand the layer DTensors), on the same mesh")
    mesh = weight.device_mesh
    if mesh.ndim != 1 or x.device_mesh != mesh:
        raise ValueError(f"{module}: the weight is a DTensor on a {mesh.ndim}-D mesh and the input on a "
                         f"{x.device_mesh.ndim}-D one; fp8mp runs tensor parallel on a 1-D mesh (the tensor-parallel "
                         "dimension of a larger one), weight and input on the same mesh")
    check_fp8_group(module, group, mesh, meta.quantizer)
    w_placement, x_placement = weight.placements[0], x.placements[0]
    out_shape = (*x.shape[:-1], weight.shape[0])
    last = x.dim() - 1

    def local_linear(x_local, w_local, b_local):
        return fp8_linear(x_local, w_local, b_local, meta, group=group, ran_before=ran_before)

    if w_placement == Shard(0) and (x_placement == Replicate() or _is_sequence_sharded(x, weight)):  # column-wise
        if bias is not None and (not is_dtensor(bias) or bias.placements[0] != Shard(0)):
            raise ValueError(f"{module}: a column-wise (Shard(0)) weight needs its bias sharded Shard(0) too, got "
                             f"{getattr(bias, 'placements', type(bias).__name__)}")
        w_local, b_local = weight.to_local(), bias.to_local() if bias is not None else None
        if x_placement == Replicate():
            # Each rank's input gradient is its columns' share of the sum: Partial, which the style's input
            # redistribution (or from_local) sums.
            out = local_linear(x.to_local(grad_placements=[Partial()]), w_local, b_local)
            return from_local(out, mesh, [Shard(last)], out_shape)
        x_local, dim = x.to_local(), x_placement.dim % x.dim()
        rows = (math.prod(x.shape[:-1]), x.shape[-1])

        def gather(codes):  # one all-gather of one byte an element (gloo has no float8: as uint8)
            local = codes.view(torch.uint8).reshape(x_local.shape)
            full = from_local(local, mesh, [Shard(dim)], tuple(x.shape)).full_tensor()
            return full.reshape(rows).view(codes.dtype), _GatheredRoute.apply(x_local, mesh, dim, rows)

        out = fp8_linear_gathered(x_local, gather, w_local, b_local, meta, group, ran_before)
        return from_local(out.reshape(*x.shape[:-1], out.shape[-1]), mesh, [Shard(last)], out_shape)
    if w_placement == Shard(1) and x_placement.is_shard() and x_placement.dim % x.dim() == last:  # row-wise
        out = from_local(local_linear(x.to_local(), weight.to_local(), None), mesh, [Partial()], out_shape)
        return out if bias is None else out + bias
    raise NotImplementedError(
        f"{module}: weight placements {tuple(weight.placements)} with input placements {tuple(x.placements)} are "
        "not supported under tensor parallel; fp8mp runs ColwiseParallel's (weight Shard(0), input Replicate or "
        "sharded along a dimension other than the last) and RowwiseParallel's (weight Shard(1), input Shard(-1))")
