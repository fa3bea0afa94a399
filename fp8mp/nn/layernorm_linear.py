"""`fp8mp.nn.LayerNormLinear`: a norm feeding an FP8 Linear, the norm writing FP8 itself."""
from __future__ import annotations

import torch

from fp8mp.scaling import autocast as autocast_state
from fp8mp.functions.norm_linear import norm_fp8_linear
from fp8mp.nn.linear import Linear
from fp8mp.nn.normalization import LayerNorm, RMSNorm, check_eps

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


class LayerNormLinear(torch.nn.Module):
    """linear(norm(x)) where, under delayed scaling in `fp8_autocast`, the norm kernel casts its
    output to FP8 and records its amax in the same pass, so the Linear reads FP8 with no extra cast.
    Under BlockScaling and MXFP8Scaling the norm kernel writes the block-scaled FP8 input in both
    layouts the GEMMs read (x along K for fprop, x.T along M for wgrad), bit for bit the unfused
    result (on CPU; fp8mp has no CUDA kernel for this fused norm, so on CUDA tensors it runs the
    norm, then block_quantize_transpose of its output: the unfused computation, same numbers).
    RowwiseScaling stays unfused: its x.T scales span all M rows, so no strip of rows can be
    quantized before the whole norm output exists.

    Submodules `norm` (fp8mp.nn.LayerNorm or RMSNorm) and `linear` (fp8mp.nn.Linear) hold the
    parameters: state_dict keys norm.weight, norm.bias, linear.weight, linear.bias (+ linear's FP8
    state). Outside fp8_autocast, under CurrentScaling or RowwiseScaling (which need the amax before
    the cast), on the first step of delayed scaling, with an FP8-stored weight (per-tensor storage)
    or a precision fallback, it runs the two modules one after the other: the same numbers, without
    the fusion.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 normalization: str = "LayerNorm", zero_centered_gamma: bool = False, device=None, dtype=None):
        super().__init__()
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"fp8mp.nn.LayerNormLinear: argument 'normalization' must be one of {NORMALIZATIONS}, "
                             f"got {normalization!r}")
        eps = check_eps(eps, "fp8mp.nn.LayerNormLinear")
        factory = dict(device=device, dtype=dtype)
        norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
        self.norm = norm_cls(in_features, eps=eps, zero_centered_gamma=zero_centered_gamma, **factory)
        self.linear = Linear(in_features, out_features, bias=bias, **factory)
        self.eps = eps

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        linear = self.linear
        if not autocast_state.is_fp8_enabled():
            return linear(self.norm(input))
        linear.check_input(input)  # before the norm, so that a bad input's error names this module's argument
        if not self._runs_fused(linear.fp8_recipe or autocast_state.get_fp8_recipe()):
            return linear(self.norm(input))
        # The fused computation inside the linear's own FP8 prologue (its record, fallback, lock, configure).
        return linear.run_fp8(input, self._fused_forward, lambda x: linear.fallback_forward(self.norm(x)))

    def _runs_fused(self, recipe) -> bool:
        """Whether the norm writes FP8 itself under `recipe`: where its quantizer says it may (block-scaled
        recipes but rowwise; delayed scaling from its second step on, with a weight not stored in FP8)."""
        linear = self.linear
        if linear.fp8_fallback:
            return False
        meta = linear.fp8_meta
        with meta.lock():
            meta.configure(recipe)
            return meta.quantizer.fuses_norm(meta, linear.stores_fp8_weight)

    def _fused_forward(self, input: torch.Tensor, ran_before: bool) -> torch.Tensor:
        linear = self.linear
        meta = linear.fp8_meta
        weight, stored = linear.fp8_weight_operands(meta.quantizer)
        return norm_fp8_linear(input, self.norm, weight, linear.bias, meta, self.eps, isinstance(self.norm, LayerNorm),
                               stored=stored, group=autocast_state.get_fp8_group(), ran_before=ran_before)
