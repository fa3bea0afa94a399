"""LoRA adapters: a frozen (optionally FP8-stored) Linear plus a trainable low-rank update.

    model = fp8mp.nn.lora.apply_lora(model, rank=8, alpha=16.0, targets=["attn.qkv"], fp8_base_weight=True)
    # only the adapters' A and B require grad; train them with any optimizer

    output = base(x) + (x @ A.T @ B.T) * alpha / rank

A [rank, in] starts as torch.nn.Linear initializes its weight (kaiming-uniform), B [out, rank] starts
at zero, so at initialization the output is the base's output exactly. The base runs as it would
alone (in FP8 inside `fp8_autocast` when it is an fp8mp.nn.Linear); the adapters compute in the
input's precision (bf16 under torch.autocast), never in FP8. With fp8_base_weight=True the base
weight is stored in FP8 (1 byte per element) and needs no FP32 master: it is frozen
(`fp8mp.nn.Linear.freeze_weight`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fp8mp.nn.conversion import _swap_in_place  # the one place that swaps modules in place
from fp8mp.nn.linear import Linear

__all__ = ["LoRALinear", "apply_lora"]


def _check_rank_alpha(rank, alpha) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA: argument 'rank' must be an int >= 1, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"LoRA: argument 'alpha' must be a finite number > 0, got {alpha!r}")


class LoRALinear(torch.nn.Module):
    """A frozen Linear `base` plus a trainable low-rank update (see the module docstring).

    Args:
        base: a torch.nn.Linear or fp8mp.nn.Linear; its parameters are frozen in place (requires_grad False).
        rank: int >= 1, the rank r of the update.
        alpha: number > 0; the update is scaled by alpha / rank.
        fp8_base_weight: store the base weight in FP8 (needs an fp8mp.nn.Linear base; convert a torch
            one with `fp8mp.nn.Linear.from_linear` or `fp8mp.convert` first).
        fp8_base_recipe: the recipe the FP8 base weight is quantized for (block scales for the
            fine-grained recipes, see fp8mp/quantized/stored_weight.py); default the base's fp8_recipe, else
            fp8_model_init's, else one per-tensor scale. Ignored when the base already stores FP8.
    """

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float, fp8_base_weight: bool = False,
                 fp8_base_recipe=None):
        super().__init__()
        if not isinstance(base, torch.nn.Linear):
            raise TypeError(f"LoRALinear: argument 'base' must be a torch.nn.Linear or fp8mp.nn.Linear, got {type(base).__name__}")
        _check_rank_alpha(rank, alpha)
        if not isinstance(fp8_base_weight, bool):
            raise ValueError(f"LoRALinear: argument 'fp8_base_weight' must be a bool, got {fp8_base_weight!r}")
        if fp8_base_weight and not isinstance(base, Linear):
            raise ValueError("LoRALinear: argument 'fp8_base_weight'=True needs an fp8mp.nn.Linear base, got a "
                             "torch.nn.Linear (convert it first: fp8mp.nn.Linear.from_linear(base))")
        if fp8_base_weight and not base.stores_fp8_weight:
            base.store_weight_in_fp8(fp8_base_recipe)
        if isinstance(base, Linear):
            base.freeze_weight()
        for param in base.parameters():
            param.requires_grad_(False)
        self.base, self.rank, self.alpha = base, rank, float(alpha)
        self.scaling = self.alpha / rank
        if base.weight is not None:
            factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        else:  # FP8 storage: adapters in fp32
            factory = dict(device=base.weight_fp8.device, dtype=torch.float32)
        self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as torch.nn.Linear's weight

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        base = self.base(input)  # first: in FP8 the base checks the input and names it in its error
        update = F.linear(F.linear(input, self.lora_A.to(input.dtype)), self.lora_B.to(input.dtype))
        return base + update * self.scaling

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def apply_lora(model: torch.nn.Module, rank: int, alpha: float, targets, fp8_base_weight: bool = False,
               fp8_base_recipe=None) -> torch.nn.Module:
    """Freeze every parameter of `model`, then wrap each Linear whose name contains a target in a LoRALinear.

    Args:
        model: any module (changed in place and returned).
        rank, alpha, fp8_base_weight, fp8_base_recipe: as LoRALinear's.
        targets: non-empty list of non-empty strings; a torch.nn.Linear / fp8mp.nn.Linear is wrapped when
            its fully qualified name contains any of them (e.g. ["qkv", "mlp.fc"]).

    Afterwards only the adapters' lora_A / lora_B require grad. ValueError naming the targets when
    none matches a Linear. Linears already inside a LoRALinear are not wrapped again.
    """

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"apply_lora: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"apply_lora: argument 'targets' must be a non-empty list of non-empty strings, got {targets!r}")
    _check_rank_alpha(rank, alpha)
    wrapped_bases = {id(m.base) for m in model.modules() if isinstance(m, LoRALinear)}

    def matches(name: str, module: torch.nn.Module) -> bool:
        return isinstance(module, torch.nn.Linear) and id(module) not in wrapped_bases and any(t in name for t in targets)

    if not any(matches(name, m) for name, m in model.named_modules()):
        linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        raise ValueError(f"apply_lora: argument 'targets' {list(targets)} matches no Linear layer; the model's Linear "
                         f"layers are {linears}")
    not_fp8 = [n for n, m in model.named_modules() if matches(n, m) and not isinstance(m, Linear)]
    if fp8_base_weight and not_fp8:
        raise ValueError(f"apply_lora: argument 'fp8_base_weight'=True needs fp8mp.nn.Linear targets, but {not_fp8} are "
                         "torch.nn.Linear (convert them first with fp8mp.convert, or narrow 'targets')")
    for param in model.parameters():
        param.requires_grad_(False)
    def wrap(name: str, module: torch.nn.Module):
        return LoRALinear(module, rank, alpha, fp8_base_weight, fp8_base_recipe) if matches(name, module) else None

    return _swap_in_place(model, wrap)
