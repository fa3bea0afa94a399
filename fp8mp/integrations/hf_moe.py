"""transformers' mixture-of-experts layers in FP8: an "fp8mp" experts implementation.

transformers 5 routes the experts of its MoE architectures (Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss, OLMoE, ...)
through one registry, ``transformers.integrations.moe.ExpertsInterface``; a model selects an entry with
``model.set_experts_implementation(name)``. :func:`fp8_experts_forward` is registered there as ``"fp8mp"``: it
runs transformers' own ``grouped_mm`` calling convention (tokens sorted by expert, int32 cumulative offsets, one
grouped linear for gate_up and one for down) with fp8mp's FP8 grouped linear (fp8mp.functions.grouped_linear)
in place of torch._grouped_mm. The expert weights stay the model's own 3-D parameters, so a checkpoint is the
model's usual one. The experts class's flags are honoured: ``is_transposed`` (weights [E, in, out]),
``has_bias`` (per-expert biases, added inside the GEMM's epilogue), ``has_gate`` (gate_up or up), and
``is_concatenated`` / the gating through the class's own ``_apply_gate``; ``has_post_expert_norm`` too.

Scaling: fp8_autocast's recipe, as fp8mp.nn.GroupedLinear runs it (fp8mp.functions.grouped_linear's
meta_grouped_linear): under the per-tensor recipes one scale for the tokens and one for the gradient from the
projection's Fp8Meta, one current scale per expert's weight; under the fine-grained ones (RowwiseScaling,
BlockScaling, MXFP8Scaling) block scales, each group as fp8mp.nn.Linear's block path computes it. Each grouped
projection (gate_up or up, and down) owns an :class:`ExpertsProjectionFp8` child, an fp8mp.nn.Fp8Module holding
that Fp8Meta: the casts record their amaxes and Inf/NaN there, so LossScaler's FP8 check, FallbackPolicy and the
monitor see the experts as every other FP8 layer (a projection in fallback computes in the model's precision), and
its state is FP8 state in the state_dict (split off by fp8mp.integrations.hf's save_pretrained; the weights stay
the model's). The FP8 path runs inside an enabled fp8_autocast (which fp8mp.integrations.hf.prepare puts around
every forward); elsewhere, and for experts whose dimensions are not multiples of 16 (cuBLASLt's FP8 alignment) or
that run expert-parallel (sentinel rows past the offsets), transformers' ``grouped_mm`` implementation runs
instead, in the model's precision.

Nothing here imports transformers at import time: :func:`register` does, and fp8mp.integrations.hf calls it
only where transformers is already imported or when ``prepare`` meets a transformers model.
"""
from __future__ import annotations

import sys
import warnings

import torch

from fp8mp.functions.grouped_linear import group_sizes_of, meta_grouped_linear
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.nn.grouped_linear import GroupedLinear
from fp8mp.scaling.autocast import is_fp8_enabled

__all__ = ["EXPERTS_IMPLEMENTATION", "ExpertsProjectionFp8", "fp8_experts_forward", "register", "select_fp8_experts",
           "supports_experts_implementation"]

EXPERTS_IMPLEMENTATION = "fp8mp"
_ALIGN = 16


class ExpertsProjectionFp8(Fp8Module):
    """The FP8 state of one grouped projection of a transformers experts module (its ``gate_up_proj``,
    ``up_proj`` or ``down_proj``): an Fp8Meta with GroupedLinear's columns (input, weight, output gradient), the
    recipe and fallback flag fp8mp's training tools set. It holds no weight: :meth:`project` takes the experts'
    own 3-D parameter."""

    def __init__(self, device=None):
        super().__init__()
        self.init_fp8_state(device)

    def project(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, offs: torch.Tensor,
                weight_in_out: bool) -> torch.Tensor:
        """x [T, K] sorted by expert, offs [E] int32 cumulative ends; weight [E, N, K] ([E, K, N] with
        weight_in_out), bias [E, N] or None. Inside fp8_autocast: run_fp8's prologue (record, fallback, lock,
        recipe) around meta_grouped_linear."""
        def fp8_forward(x2d, ran_before):
            return meta_grouped_linear(self.fp8_meta, x2d, weight, bias, offs, None, weight_in_out, ran_before)

        def fallback_forward(x2d):
            w = weight.transpose(1, 2) if weight_in_out else weight
            return GroupedLinear._per_group_linear(x2d, group_sizes_of(offs), w.to(x2d.dtype),
                                                   bias.to(x2d.dtype) if bias is not None else None)

        return self.run_fp8(x, fp8_forward, fallback_forward)

    def check_input(self, input: torch.Tensor) -> None:
        """Nothing: fp8_experts_forward runs the projection only on shapes the FP8 path takes."""

    def high_precision_forward(self, input: torch.Tensor) -> torch.Tensor:
        raise TypeError("ExpertsProjectionFp8 runs through its project method, called by fp8_experts_forward")

    fallback_forward = fp8_forward = high_precision_forward

    def to_torch(self) -> "ExpertsProjectionFp8":
        """This module itself: the experts module it belongs to is transformers' own."""
        return self


def _projection_state(self, name: str) -> ExpertsProjectionFp8:
    """The experts module's ExpertsProjectionFp8 for its parameter `name` (created on first use, on its device)."""
    attr = f"fp8mp_{name}"
    state = getattr(self, attr, None)
    if state is None:
        state = ExpertsProjectionFp8(getattr(self, name).device)
        setattr(self, attr, state)
    return state


def _grouped_linear(self, x, name, bias, offs):
    return _projection_state(self, name).project(x, getattr(self, name), bias, offs, self.is_transposed)


def attach_fp8_state(model: torch.nn.Module, recipe=None) -> None:
    """Give every experts module of `model` its ExpertsProjectionFp8 children now (prepare's time), so that
    optimizers, the monitor and checkpoints see them before the first forward; with a `recipe`, pinned on each
    (its state shaped for it before any load), as convert pins it on the Linear layers."""
    for module in model.modules():
        if hasattr(module, "is_concatenated") and hasattr(module, "has_gate"):
            for name in ("gate_up_proj", "down_proj") if module.has_gate else ("up_proj", "down_proj"):
                state = _projection_state(module, name)
                if recipe is not None:
                    state.fp8_recipe = recipe
                    state.fp8_meta.configure(recipe)


def _fp8_shapes(self) -> bool:
    """Whether every expert GEMM of `self` has K and N multiples of 16."""
    names = ("gate_up_proj", "down_proj") if self.has_gate else ("up_proj", "down_proj")
    return all(getattr(self, name).shape[1] % _ALIGN == 0 and getattr(self, name).shape[2] % _ALIGN == 0
               for name in names)


def fp8_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                        top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' forward of transformers' ``grouped_mm`` implementation with FP8 grouped GEMMs.

    hidden_states [T, H], top_k_index / top_k_weights [T, k]; returns [T, H] in hidden_states' dtype.
    """
    from transformers.integrations.moe import grouped_mm_experts_forward

    if not is_fp8_enabled() or getattr(self, "_is_expert_parallel", False) or not _fp8_shapes(self):
        if is_fp8_enabled() and not getattr(self, "_fp8mp_warned", False):
            warnings.warn(f"fp8mp experts: {type(self).__name__} runs in high precision (expert parallel, or "
                          "dimensions that are not multiples of 16)", stacklevel=2)
            self._fp8mp_warned = True
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    num_tokens, hidden_dim = hidden_states.shape
    num_top_k = top_k_index.size(-1)
    expert_ids = top_k_index.reshape(-1)
    # Tokens sorted by expert (a stable sort, so each expert's rows keep the token order), as grouped_mm's.
    expert_ids_sorted, perm = torch.sort(expert_ids, stable=True)
    # index_select, not indexing: its backward (index_add_) is 4-8x faster on CPU than indexing's (index_put_).
    x = hidden_states.index_select(0, perm // num_top_k)
    offs = torch.bincount(expert_ids_sorted, minlength=self.num_experts).cumsum(0).to(torch.int32)

    def bias(name):
        return getattr(self, name) if self.has_bias else None

    if self.has_gate:
        proj = self._apply_gate(_grouped_linear(self, x, "gate_up_proj", bias("gate_up_proj_bias"), offs))
    else:
        proj = self.act_fn(_grouped_linear(self, x, "up_proj", bias("up_proj_bias"), offs))
    proj = _grouped_linear(self, proj, "down_proj", bias("down_proj_bias"), offs)
    if getattr(self, "has_post_expert_norm", False):
        proj = self.post_expert_norm(proj)
    weighted = proj * top_k_weights.reshape(-1)[perm].unsqueeze(-1)
    # Back to token order, then the sum over each token's k experts in fp32 (as grouped_mm's).
    out = torch.empty_like(weighted).index_copy_(0, perm, weighted)
    return out.view(num_tokens, num_top_k, hidden_dim).sum(dim=1, dtype=torch.float32).to(hidden_states.dtype)


def register() -> None:
    """Register "fp8mp" in transformers' ExpertsInterface (idempotent). Imports transformers."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, fp8_experts_forward)


def register_if_transformers_imported() -> None:
    """:func:`register` where the user's program has imported transformers already, else nothing."""
    if "transformers" in sys.modules:
        register()


def supports_experts_implementation(model: torch.nn.Module) -> bool:
    """Whether `model` is a transformers model with experts that take an experts implementation."""
    can_set = getattr(type(model), "_can_set_experts_implementation", None)
    if not callable(getattr(model, "set_experts_implementation", None)) or can_set is None:
        return False
    has_experts = any(hasattr(m, "is_concatenated") and hasattr(m, "has_gate") for m in model.modules())
    return has_experts and bool(can_set())


def select_fp8_experts(model: torch.nn.Module, recipe=None) -> bool:
    """Register "fp8mp" and select it on `model` where its experts support implementations; whether it did.
    recipe: pinned on the experts' projections (None: they follow fp8_autocast's)."""
    if not supports_experts_implementation(model):
        return False
    register()
    model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    attach_fp8_state(model, recipe)
    return True
