"""`fp8mp.nn.Conv1D`: transformers' Conv1D (GPT-2's projections, weight [in, out]) in FP8.

transformers is not needed to use this module; only `to_torch()` (which gives back
transformers' own Conv1D, for `fp8mp.unconvert`) imports it.
"""
from __future__ import annotations

import torch

from fp8mp.functions.linear import check_input, fp8_linear
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.scaling import autocast as autocast_state


def _addmm(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """transformers' Conv1D forward: bias + x @ W over the last dimension."""
    out = torch.addmm(bias, input.reshape(-1, input.shape[-1]), weight)
    return out.view(*input.shape[:-1], weight.shape[1])


class Conv1D(Fp8Module):
    """y = x @ W + b with W of shape [nx, nf] = [in, out], in FP8 inside `fp8mp.fp8_autocast`.

    Same constructor (`Conv1D(nf, nx)`), parameters and state_dict keys as
    `transformers.pytorch_utils.Conv1D`, plus the FP8 scaling state (`fp8_meta.*`). Outside
    fp8_autocast it computes exactly as transformers' Conv1D. In FP8 it runs the three GEMMs of
    `fp8mp.nn.Linear` on the weight as stored: the FP8 cast writes both layouts the GEMMs need,
    so there is no transpose copy of the weight per step (see fp8mp/functions/linear.py).
    `fp8_recipe` and `fp8_fallback` work as on fp8mp.nn.Linear; the weight stays high precision
    (no FP8 weight storage).
    """

    def __init__(self, nf: int, nx: int, device=None, dtype=None):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = torch.nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        torch.nn.init.normal_(self.weight, std=0.02)
        self.init_fp8_state(device)

    @property
    def in_features(self) -> int:
        return self.nx

    @property
    def out_features(self) -> int:
        return self.nf

    # ----------------------------------------------------------------------------- Fp8Module's hooks
    def check_input(self, input: torch.Tensor) -> None:
        check_input("fp8mp.nn.Conv1D", input, self.nx, self.weight)

    def high_precision_forward(self, input: torch.Tensor) -> torch.Tensor:
        return _addmm(input, self.weight, self.bias)

    def fallback_forward(self, input: torch.Tensor) -> torch.Tensor:
        return _addmm(input, self.weight.to(input.dtype), self.bias.to(input.dtype))

    def fp8_forward(self, input: torch.Tensor, ran_before: bool) -> torch.Tensor:
        return fp8_linear(input, self.weight, self.bias, self.fp8_meta, group=autocast_state.get_fp8_group(),
                          ran_before=ran_before, weight_in_out=True)

    @classmethod
    def from_hf(cls, module: torch.nn.Module) -> "Conv1D":
        """An fp8mp Conv1D sharing the parameters of `module`, a transformers Conv1D (no copy)."""
        new = cls(module.nf, module.nx, device="meta")
        new.weight, new.bias = module.weight, module.bias
        new.fp8_meta = new.new_fp8_meta(module.weight.device)
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
