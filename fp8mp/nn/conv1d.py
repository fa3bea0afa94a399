"""`fp8mp.nn.Conv1D`: transformers' Conv1D (GPT-2's projections, weight [in, out]) in FP8.

transformers is not needed to use this module; only `to_torch()` (which gives back
transformers' own Conv1D, for `fp8mp.unconvert`) imports it.
"""
from __future__ import annotations

import torch

from fp8mp.nn.fp8_linear_function import check_input, fp8_linear
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.fp8_meta import Fp8Meta, LinearTensor


def _addmm(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D forward: bias + x @ W over the last dimension."""
    out = torch.addmm(bias, input.reshape(-1, input.shape[-1]), weight)
    return out.view(*input.shape[:-1], weight.shape[1])


class Conv1D(torch.nn.Module):
    """y = x @ W + b with W of shape [nx, nf] = [in, out], in FP8 inside `fp8mp.fp8_autocast`.

    Same constructor (`Conv1D(nf, nx)`), parameters and state_dict keys as
    `transformers.pytorch_utils.Conv1D`, plus the FP8 scaling state (`fp8_meta.*`). Outside
    fp8_autocast it computes exactly as transformers' Conv1D. In FP8 it runs the three GEMMs of
    `fp8mp.nn.Linear` on the weight as stored: the FP8 cast writes both layouts the GEMMs need,
    so there is no transpose copy of the weight per step (see fp8mp/nn/fp8_linear_function.py).
    `fp8_recipe` and `fp8_fallback` work as on fp8mp.nn.Linear; the weight stays high precision
    (no FP8 weight storage).
    """

    def __init__(self, nf: int, nx: int, device=None, dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        torch.nn.init.normal_(self.weight, std=0.02)
        self.fp8_meta = Fp8Meta(len(LinearTensor), backward_tensors=(LinearTensor.GRAD_OUTPUT,), device=device)
        self.fp8_recipe = None  # a recipe for this module alone; None follows fp8_autocast's
        self.fp8_fallback = False

    @property
    def in_features(self) -> int:
        return self.nx

    @property
    def out_features(self) -> int:
        return self.nf

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not autocast_state.is_fp8_enabled():
            return _addmm(input, self.weight, self.bias)
        check_input("fp8mp.nn.Conv1D", input, self.nx, self.weight)
        ran_before = autocast_state.record_module(self)
        if self.fp8_fallback:
            return _addmm(input, self.weight.to(input.dtype), self.bias.to(input.dtype))
        meta = self.fp8_meta
        with meta.lock():  # threads sharing this layer take turns from the scale update to the casts, as Linear
            meta.configure(self.fp8_recipe or autocast_state.get_fp8_recipe())
            return fp8_linear(input, self.weight, self.bias, meta, group=autocast_state.get_fp8_group(),
                              ran_before=ran_before, weight_in_out=True)

    @classmethod
    def from_hf(cls, module: torch.nn.Module) -> "Conv1D":
        """An fp8mp Conv1D sharing the parameters of `module`, a transformers Conv1D (no copy)."""
        new = cls(module.nf, module.nx, device="meta")
        new.weight, new.bias = module.weight, module.bias
        new.fp8_meta = Fp8Meta(len(LinearTensor), backward_tensors=(LinearTensor.GRAD_OUTPUT,), device=module.weight.device)
        return new

    def to_torch(self) -> torch.nn.Module:
        """transformers' Conv1D sharing this module's parameters (the FP8 scaling state is dropped)."""
        try:
            from transformers.pytorch_utils import Conv1D as HfConv1D
        except ImportError as error:
            raise ImportError("fp8mp.nn.Conv1D.to_torch returns transformers' Conv1D: pip install transformers") from error
        with torch.device("meta"):
            module = HfConv1D(self.nf, self.nx)
        module.weight, module.bias = self.weight, self.bias
        return module

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}"
