"""Amax reduction across a process group: every rank computes the same FP8 scales.

Usage::

    with fp8mp.fp8_autocast(fp8_group=group):      # group: a torch.distributed ProcessGroup
        loss = model(x_shard).sum()
    loss.backward()

Without a reduction each rank would scale its FP8 casts from its own data shard,
so replicas of one layer would quantize with different scales and drift apart.
With `fp8_group`, the amax every scale comes from is the max over the group:

Delayed scaling (the default recipe). The amaxes recorded in step t (forward
input and weight casts, and the gradient casts of step t's backward) are used
by the scale update at the start of step t+1's forward. So the reduction runs
at the *entry* of the next `fp8_autocast` with the same group, before any
forward: the amaxes of every fp8mp module that ran in the previous context
with that group are concatenated into one flat buffer, reduced with ONE
``all_reduce(MAX)``, and copied back (`reduce_pending_amaxes`). A per-group
registry (`_PENDING`) remembers those modules from one context's exit to the
next one's entry.

First step of delayed scaling, and CurrentScaling. Scales come from the
tensor about to be cast (`Fp8Meta.set_scale_from`), so its amax is reduced
right there, one ``all_reduce(MAX)`` per tensor (`all_reduce_amax_`). For
delayed scaling that happens on step 0 only; under CurrentScaling on every
cast, forward and backward: unavoidable, since the scale must be known before
the cast and depends on every rank's data.

A module that runs several times in one context pushes its amaxes into its
history on every call, so from its second call on its amax is reduced (one
collective per repeated call) before that update; see `fp8mp.nn.Linear`.

NaN: a rank whose amax is NaN would make ``MAX`` order-dependent, so NaN is
replaced by +Inf before reducing: every rank then records Inf (non-finite:
the scale is kept, and `fp8mp.fallback` sees the overflow on every rank).

Every rank must run the same fp8mp modules in the same order (as DDP and FSDP
need anyway): the collectives are matched by order.

torch.compile: the entry reduction runs in eager when `fp8_autocast` is
entered outside the compiled function (the supported way: compile the model,
enter the context around the call). See README "Multi-GPU with torchrun".
"""
from __future__ import annotations

import math
import weakref

import torch
import torch.distributed as dist


__all__ = ["reduce_pending_amaxes", "reduce_every_pending_amax", "remember_modules", "all_reduce_amax_",
           "ranks_missing_from", "reduce_module_amaxes", "require_group_covering"]

# group -> {id(module): weakref(module)} of the fp8mp modules that ran in the last context with that group
_PENDING: dict[object, dict[int, weakref.ref]] = {}


def _check_group(group) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fp8_autocast: argument 'fp8_group' needs torch.distributed to be initialized "
                           "(torch.distributed.init_process_group) before use")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"fp8_autocast: argument 'fp8_group' must be a torch.distributed.ProcessGroup "
                        f"(e.g. torch.distributed.group.WORLD), got {type(group).__name__}")


def all_reduce_amax_(amax: torch.Tensor, group) -> torch.Tensor:
    """amax <- max of amax over `group`, in place (NaN counts as +Inf). Returns amax."""
    amax.copy_(torch.nan_to_num(amax, nan=math.inf, posinf=math.inf, neginf=-math.inf))
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def reduce_module_amaxes(modules, group) -> None:
    """Reduce the `fp8_meta.amax` buffers of `modules` over `group` with one all_reduce."""
    amaxes = [m.fp8_meta.amax for m in modules]
    if not amaxes:
        return
    flat = all_reduce_amax_(torch.cat(amaxes), group)
    with torch.no_grad():
        for amax, reduced in zip(amaxes, flat.split([a.numel() for a in amaxes])):
            amax.copy_(reduced)


def remember_modules(group, modules) -> None:
    """At a context's exit: its fp8mp modules' amaxes are to be reduced at the next entry with `group`."""
    pending = _PENDING.setdefault(group, {})
    for m in modules:
        # The fine-grained recipes scale each block from its own values: no amax to agree on (recipe.py).
        quantizer = m.fp8_meta.quantizer  # (None: a module that fell back, never configured)
        if quantizer is None or quantizer.reduces_amaxes:
            pending[id(m)] = weakref.ref(m)


def reduce_pending_amaxes(group) -> None:
    """At a context's entry: reduce, in one all_reduce, the amaxes left by the last context with `group`.

    Every rank must call this (entering fp8_autocast with the group) the same number of times.
    """
    _check_group(group)
    pending = _PENDING.pop(group, {})
    modules = [m for m in (ref() for ref in pending.values()) if m is not None]
    reduce_module_amaxes(modules, group)


def reduce_every_pending_amax() -> None:
    """Run now every reduction the next fp8_autocast entries would run (one all_reduce per group with modules
    pending), so that the amax buffers hold the same values on every rank, as before a checkpoint: a
    torch.distributed.checkpoint keeps one copy of the unsharded buffers. Reducing twice changes nothing
    (the max of equal values), so the next entries find nothing left and the scales are those of a run
    without the checkpoint. Every rank must call it at the same point."""
    for group in list(_PENDING):
        reduce_pending_amaxes(group)


def ranks_missing_from(fp8_group, ranks) -> list[int]:
    """The ranks of `ranks` that the process group `fp8_group` leaves out (ascending; empty when it covers them):
    a rank left out of the amax reduction would scale its shard of a tensor from other amaxes than the rest."""
    _check_group(fp8_group)
    have = set(dist.get_process_group_ranks(fp8_group))
    return sorted(r for r in ranks if r not in have)


def require_group_covering(fp8_group, shard_group, what: str) -> None:
    """Refuse an `fp8_group` whose amax reduction does not reach every rank of `shard_group`.

    A weight all-gathered in FP8 is cast shard by shard, each rank recording its shard's amax; the whole
    weight's amax (and so one scale on every rank) exists only after a reduction over the ranks holding the
    shards, which delayed scaling leaves to the next `fp8_autocast(fp8_group=...)` entry. `what` names the
    weight in the message. The check is local (no collective), so it fails on every rank alike.
    """
    wanted = dist.get_process_group_ranks(shard_group)
    if fp8_group is None:
        raise ValueError(f"{what}: FP8 all-gather under delayed scaling needs fp8_autocast(fp8_group=...) set to the "
                         f"data-parallel group the weight is sharded over (ranks {wanted}), e.g. "
                         "torch.distributed.group.WORLD; got fp8_group=None")
    if ranks_missing_from(fp8_group, wanted):
        have = dist.get_process_group_ranks(fp8_group)
        raise ValueError(f"{what}: fp8_autocast's fp8_group (ranks {have}) is not the data-parallel group the weight is "
                         f"sharded over (ranks {wanted}): FP8 all-gather needs the weight's amax reduced over every "
                         "rank holding a shard; pass that group (or one containing it) as fp8_group")
