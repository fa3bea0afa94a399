"""FP8 all-gather under FSDP2: trainable Linear weights gathered as E4M3 codes, one byte an element.

    model = fp8mp.convert(model, fp8_all_gather=True)   # before fully_shard
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    for x, y in data:
        with fp8mp.fp8_autocast(fp8_group=dist.group.WORLD):     # the group fully_shard shards over
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        fp8mp.precompute_fp8_weight_scales(model)   # CurrentScaling: one all-reduce of every weight's amax

Without it FSDP2 all-gathers each weight in its parameter dtype (bf16: 2 bytes an element) and the fp8mp
Linear casts the gathered weight to FP8. With it the weight of each fp8mp.nn.Linear is an
`Fp8AllGatherWeight`: a tensor subclass that reports the parameter's dtype and shape and holds the
parameter's values (optimizers, init functions and checkpoints see an ordinary parameter), and that
implements FSDP2's extension points:

- `fsdp_pre_all_gather`: each rank casts its shard to E4M3 with the scale every rank shares, and FSDP2
  all-gathers the codes (as bytes: gloo has no float8 dtypes);
- `fsdp_post_all_gather`: the gathered codes and their scale become the unsharded parameter, an
  `Fp8GatheredWeight` (codes + scale_inv reporting the parameter's dtype and shape), which the Linear's FP8
  GEMMs take as they are: forward uses it, backward transposes it for dgrad (FSDP2 gathers it again
  for backward after freeing it, cast with the forward's scale, so the bits are the forward's).

The scale is the one the Linear's own cast of the unsharded weight would use, so the FP8 weight the GEMMs
see is bit for bit the cast of the unsharded weight, and a run with FP8 all-gather gives the losses and
weights of the run without it:

- DelayedScaling: the scale comes from the amax history. The scale update the forward would run (one
  op for the input, weight and gradient columns) runs just before the gather instead, and the forward
  in the same fp8_autocast context skips it. Each rank's cast records the amax of its shard; the next
  `fp8_autocast(fp8_group=...)` entry max-reduces every amax over the group (as it always does), which
  gives the unsharded weight's amax. So `fp8_group` must contain every rank the weight is sharded over:
  None or another group raises, naming the weight. The first step (scales from the data) reduces the
  shards' amaxes over the shard group before the cast.
- CurrentScaling: the scale comes from the unsharded weight's amax, the max of the shards' amaxes over
  the shard group. `precompute_fp8_weight_scales(model)` after the optimizer step reduces every weight's
  amax in one all-reduce; a weight changed since (or never precomputed) reduces its own amax at its
  gather (one all-reduce per weight).
- With FSDP2's MixedPrecisionPolicy(param_dtype=...) the shard is rounded to param_dtype first, as the
  weight FSDP2 would gather.

What it does not do: the fine-grained recipes (RowwiseScaling, BlockScaling, MXFP8Scaling) scale the
weight per block and raise (naming the recipe and the weight) rather than gather per-tensor codes;
transformers' Conv1D and LoRA layers keep gathering in their parameter dtype; FSDP2's
`reshard_after_forward=<int>` (resharding to a smaller mesh) is refused by FSDP2 itself for such
parameters. Outside fp8_autocast (and for a layer in precision fallback) the gathered weight decodes to
its dtype: the layer computes with the FP8-rounded weight, cast with the layer's last weight scale
(before any FP8 step: a current scale from the reduced amax).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_map_only

from fp8mp.ops.operand import Fp8Operand
from fp8mp.quantized.weight_operands import StoredOperands, WeightOperands
from fp8mp.quantized.frozen_weight import Fp8FrozenWeight, padded_shard_rows
from fp8mp.ops.cast import cast_to_fp8
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.distributed import all_reduce_amax_, require_group_covering
from fp8mp.scaling.current_scale import current_scale
from fp8mp.scaling.fp8_meta import WEIGHT, tensor_amax

__all__ = ["Fp8AllGatherWeight", "Fp8GatheredWeight", "precompute_fp8_weight_scales"]

GATHER_FORMAT = "e4m3"
_aten = torch.ops.aten
# Ops FSDP2 applies to a parameter to shard, pad and move it: their results are still this weight's.
_KEEP_OPS = {_aten.empty_like.default, _aten.new_zeros.default, _aten.slice.Tensor, _aten.copy_.default,
             _aten.view.default, _aten.as_strided.default, _aten._to_copy.default, _aten._pin_memory.default,
             _aten.split.Tensor, _aten.clone.default, _aten.detach.default, _aten.alias.default}


@dataclass(eq=False)
class _Owner:
    """What every tensor derived from one Linear's weight shares: the Linear, its name, the scale of the last
    forward gather (the backward gather reuses it) and the precomputed amax (CurrentScaling)."""

    linear: weakref.ref
    name: str
    forward_scale: tuple[torch.Tensor, torch.Tensor] | None = None  # (scale, scale_inv)
    precomputed: tuple[torch.Tensor, int] | None = field(default=None, repr=False)  # (amax [1], weight version)


class Fp8AllGatherWeight(torch.Tensor):
    """A trainable fp8mp.nn.Linear weight that FSDP2 all-gathers as E4M3 codes (see the module docstring).

    Reports and holds the parameter's values (`_tensor`); every op runs on them, and the ops FSDP2 uses to
    shard it keep the subclass.
    """

    _tensor: torch.Tensor
    _owner: _Owner

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, owner: _Owner):
        return cls._make_wrapper_subclass(cls, tensor.size(), strides=tensor.stride(),
                                          storage_offset=tensor.storage_offset(), dtype=tensor.dtype,
                                          device=tensor.device, requires_grad=tensor.requires_grad)

    def __init__(self, tensor: torch.Tensor, owner: _Owner):
        self._tensor = tensor
        self._owner = owner

    @classmethod
    def parameter_of(cls, linear: torch.nn.Module, name: str) -> torch.nn.Parameter:
        """A new parameter holding `linear.weight`'s values (no copy) that FSDP2 will all-gather in FP8 for
        `linear` (an fp8mp.nn.Linear); `name` names it in error messages."""
        owner = _Owner(weakref.ref(linear), name)
        if not getattr(linear, "_fp8_all_gather_hooks", False):
            linear.register_state_dict_post_hook(_plain_weights_in_state_dict)
            linear._fp8_all_gather_hooks = True
        return torch.nn.Parameter(cls(linear.weight.detach(), owner), requires_grad=True)

    def __repr__(self) -> str:
        return f"Fp8AllGatherWeight({self._owner.name}, {self._tensor!r})"

    def __tensor_flatten__(self):
        return ["_tensor"], self._owner

    @staticmethod
    def __tensor_unflatten__(inner_tensors, owner, outer_size, outer_stride):
        return Fp8AllGatherWeight(inner_tensors["_tensor"], owner)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        owners = []

        def unwrap(t):
            owners.append(t._owner)
            return t._tensor

        args, kwargs = tree_map_only(Fp8AllGatherWeight, unwrap, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _KEEP_OPS:
            return out
        return tree_map_only(torch.Tensor, lambda t: Fp8AllGatherWeight(t, owners[0]), out)

    # ----------------------------------------------------------------------------- FSDP2's extension points
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """This rank's shard cast to E4M3 (as bytes, padded to FSDP2's padded shard rows), and its scale_inv."""
        owner = self._owner
        shard = self._tensor
        if mp_policy is not None and mp_policy.param_dtype is not None and mp_policy.param_dtype != shard.dtype:
            shard = shard.to(mp_policy.param_dtype)
        self._fsdp_whole_rows = outer_size[0]
        codes, scale_inv = self._cast_shard(shard, mesh.get_group())
        return (padded_shard_rows(codes, outer_size[0], mesh.size()).view(torch.uint8),), (scale_inv,)

    # The unsharded weight: an Fp8GatheredWeight over the gathered codes (FSDP2 frees and refills them), made
    # as a frozen FP8 weight's is.
    fsdp_post_all_gather = Fp8FrozenWeight.fsdp_post_all_gather

    @staticmethod
    def gathered_type() -> type:
        return Fp8GatheredWeight

    def _cast_shard(self, shard: torch.Tensor, shard_group) -> tuple[torch.Tensor, torch.Tensor]:
        owner = self._owner
        linear = owner.linear()
        if linear is None:
            raise RuntimeError(f"{owner.name}: FP8 all-gather of a weight whose fp8mp.nn.Linear is gone")
        scratch = torch.empty(1, dtype=torch.float32, device=shard.device)
        if torch._C._current_graph_task_id() != -1:  # FSDP2 gathers again for backward: the forward's scale
            if owner.forward_scale is None:
                raise RuntimeError(f"{owner.name}: FP8 all-gather for backward without a forward gather")
            scale, scale_inv = owner.forward_scale
            return cast_to_fp8(shard, scale, scratch, GATHER_FORMAT), scale_inv
        if autocast_state.is_fp8_enabled() and not linear.fp8_fallback:
            codes, scale, scale_inv = self._cast_for_fp8_forward(shard, shard_group, linear)
        else:
            meta = linear.fp8_meta
            if meta.is_initialized():  # the layer's last weight scale
                scale, scale_inv = meta.scale[WEIGHT:WEIGHT + 1].clone(), meta.scale_inv[WEIGHT:WEIGHT + 1].clone()
            else:
                amax = self._whole_amax(shard, shard_group)
                scale = current_scale(amax, GATHER_FORMAT)
                scale_inv = scale.reciprocal()
            codes = cast_to_fp8(shard, scale, scratch, GATHER_FORMAT)
        owner.forward_scale = (scale, scale_inv)
        return codes, scale_inv

    def _cast_for_fp8_forward(self, shard, shard_group, linear):
        """Inside fp8_autocast: the scale the Linear's own cast of the unsharded weight would use this step."""
        owner = self._owner
        recipe = linear.fp8_recipe or autocast_state.get_fp8_recipe()
        group = autocast_state.get_fp8_group()
        meta = linear.fp8_meta
        with meta.lock():
            meta.configure(recipe)
            quantizer = meta.quantizer
            if quantizer.per_tensor_format is None:
                raise ValueError(
                    f"{owner.name}: FP8 all-gather gathers per-tensor scaled E4M3 codes, but this layer runs under "
                    f"{quantizer.name}, which scales the weight per block; use DelayedScaling or CurrentScaling, "
                    "or convert without fp8_all_gather (FSDP2 then gathers the weight in its dtype)")
            if quantizer.amax_history_len is not None:  # delayed scaling: the next entry reduces the shards' amaxes
                require_group_covering(group, shard_group, owner.name)
            whole_amax = quantizer.prepare_gathered_weight_scale(
                meta, lambda: self._whole_amax(shard, shard_group), group,
                autocast_state.ran_in_current_context(linear))
            scale = meta.scale[WEIGHT:WEIGHT + 1].clone()
            scale_inv = meta.scale_inv[WEIGHT:WEIGHT + 1].clone()
            amax = meta.amax[WEIGHT:WEIGHT + 1]
            codes = cast_to_fp8(shard, scale, amax, GATHER_FORMAT)  # records the shard's amax
            if whole_amax is not None:  # known already: record the unsharded weight's, as its own cast would
                amax.copy_(whole_amax)
        return codes, scale, scale_inv

    def _whole_amax(self, shard: torch.Tensor, shard_group) -> torch.Tensor:
        """The unsharded weight's amax: the precomputed one while the weight is unchanged, else the max of the
        shards' (one all-reduce). Rounded to the shard's dtype, as max |w| of the rounded weight is."""
        precomputed = self._owner.precomputed
        if precomputed is not None and precomputed[1] == self._tensor._version:
            return precomputed[0].to(shard.dtype).float()
        return all_reduce_amax_(tensor_amax(shard), shard_group)


def plain_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` with an Fp8AllGatherWeight (FSDP2's local shard of a DTensor included) replaced by the plain
    tensor of its values, sharing their storage; any other tensor as it is."""
    if isinstance(weight, Fp8AllGatherWeight):
        return weight._tensor
    local = getattr(weight, "_local_tensor", None)
    if isinstance(local, Fp8AllGatherWeight):
        from torch.distributed.tensor import DTensor
        return DTensor.from_local(local._tensor, weight.device_mesh, weight.placements, run_check=False,
                                  shape=weight.shape, stride=weight.stride())
    return weight


def _plain_weights_in_state_dict(module, state_dict, prefix, local_metadata) -> None:
    """Checkpoints hold plain tensors: the weight's values (a DTensor of them under FSDP2), not the subclass.
    Loading copies into the parameter (copy_ writes its values), so any such checkpoint loads back."""
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = plain_weight(state_dict[key])


class Fp8GatheredWeight(Fp8FrozenWeight):
    """The unsharded weight FSDP2 all-gathered in FP8: E4M3 codes plus a [1] float32 scale_inv, reporting the
    parameter's dtype and shape. The autograd leaf of the layer's weight gradient while FSDP2 holds it
    unsharded; fp8mp.nn.Linear's FP8 GEMMs take its codes as they are, every other op reads it decoded
    (as an Fp8FrozenWeight)."""

    def fp8_operands_for(self, quantizer) -> WeightOperands:
        """The weight interface: its codes and scale as they are, and itself as the gradient leaf (it was gathered
        only under a per-tensor recipe: the gather refuses the others). The shards' casts wrote the layer's WEIGHT
        amax, which the forward's non-finite check folds as its own cast's."""
        return WeightOperands(self, StoredOperands(Fp8Operand(self.codes, self.scale_inv.clone()),
                                                   weight_amax_recorded=True))


@torch.no_grad()
def precompute_fp8_weight_scales(model: torch.nn.Module) -> None:
    """CurrentScaling with FP8 all-gather: reduce the amaxes of every `Fp8AllGatherWeight` shard of `model`
    in one all-reduce per process group (call it after the optimizer step), so that the next gathers need
    no collective of their own. Each weight's scale is made from its amax at its gather, by the rule of the
    Linear's own current scaling. A weight written after this call (its version changed) reduces its own
    amax at its gather instead. DelayedScaling needs nothing: its scales come from the amax history."""
    from torch.distributed.tensor import DTensor, Shard
    by_group: dict[object, list[Fp8AllGatherWeight]] = {}
    for param in model.parameters():
        if not isinstance(param, DTensor) or not isinstance(param._local_tensor, Fp8AllGatherWeight):
            continue
        sharded = [d for d, p in enumerate(param.placements) if isinstance(p, Shard)]
        if len(sharded) != 1:
            raise ValueError(f"precompute_fp8_weight_scales: {param._local_tensor._owner.name} is sharded over "
                             f"placements {param.placements}; FP8 all-gather takes one Shard mesh dimension")
        by_group.setdefault(param.device_mesh.get_group(sharded[0]), []).append(param._local_tensor)
    for group, shards in by_group.items():
        amaxes = all_reduce_amax_(torch.cat([tensor_amax(s._tensor) for s in shards]), group)
        for i, shard in enumerate(shards):
            shard._owner.precomputed = (amaxes[i:i + 1].clone(), shard._tensor._version)
