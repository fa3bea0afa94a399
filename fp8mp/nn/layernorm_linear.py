"""`fp8mp.nn.LayerNormLinear`: a norm feeding an FP8 Linear, the norm writing FP8 itself."""
from __future__ import annotations

import torch

from fp8mp.scaling import autocast as autocast_state
from fp8mp.nn.norm_linear_function import norm_fp8_linear
from fp8mp.nn.linear import Linear
from fp8mp.nn.normalization import LayerNorm, RMSNorm

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


class LayerNormLinear(torch.nn.Module):
    """linear(norm(x)) where, under delayed scaling in `fp8_autocast`, the norm kernel casts its
    output to FP8 and records its amax in the same pass, so the Linear reads FP8 with no extra cast.

    Submodules `norm` (fp8mp.nn.LayerNorm or RMSNorm) and `linear` (fp8mp.nn.Linear) hold the
    parameters: state_dict keys norm.weight, norm.bias, linear.weight, linear.bias (+ linear's FP8
    state). Outside fp8_autocast, under CurrentScaling (which needs the amax before the cast), on the
    first step of delayed scaling, with an FP8-stored weight or a precision fallback, it runs the
    two modules one after the other: the same numbers, without the fusion.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 normalization: str = "LayerNorm", zero_centered_gamma: bool = False, device=None, dtype=None):
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"fp8mp.nn.LayerNormLinear: argument 'normalization' must be one of {NORMALIZATIONS}, "
                             f"got {normalization!r}")
        if not (isinstance(eps, (int, float)) and eps > 0):
            raise ValueError(f"fp8mp.nn.LayerNormLinear: argument 'eps' must be a positive number, got {eps!r}")
        factory = dict(device=device, dtype=dtype)
        norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
        self.norm = norm_cls(in_features, eps=eps, zero_centered_gamma=zero_centered_gamma, **factory)
        self.linear = Linear(in_features, out_features, bias=bias, **factory)
        self.eps = float(eps)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        linear = self.linear
        if not autocast_state.is_fp8_enabled():
            return linear(self.norm(input))
        linear._check_input(input)
        meta = linear.fp8_meta
        with meta.lock():
            meta.configure(linear.fp8_recipe or autocast_state.get_fp8_recipe())
            if linear.fp8_fallback or linear.stores_fp8_weight or meta.uses_current_scaling():
                return linear(self.norm(input))
            ran_before = autocast_state.record_module(linear)
            return norm_fp8_linear(input, self.norm, linear.weight, linear.bias, meta, self.eps,
                                   is_layernorm=isinstance(self.norm, LayerNorm), group=autocast_state.get_fp8_group(),
                                   ran_before=ran_before)
