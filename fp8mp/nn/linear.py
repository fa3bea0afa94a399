"""`fp8mp.nn.Linear`: a drop-in `torch.nn.Linear` that computes in FP8 inside `fp8_autocast`."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8mp import autocast as autocast_state
from fp8mp.fp8_format import HIGH_PRECISION_DTYPES
from fp8mp.fp8_meta import Fp8Meta, LinearTensor
from fp8mp.linear_function import fp8_linear


class Linear(torch.nn.Linear):
    """y = x @ W.T + b, in FP8 inside `fp8mp.fp8_autocast`, in the parameters' precision outside it.

    Same constructor, parameters and state_dict keys as `torch.nn.Linear`, so its checkpoints load
    as they are. In FP8, input and weight are cast to the recipe's forward format (E4M3), the
    gradient of the output to its backward format (E5M2 for Format.HYBRID), and all three GEMMs
    (fprop, dgrad, wgrad) run in FP8 with fp32 accumulation. The output has the input's dtype; the
    weight gradient has the weight's dtype.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.fp8_meta = Fp8Meta(len(LinearTensor), backward_tensors=(LinearTensor.GRAD_OUTPUT,), device=device)
        # A recipe for this module alone (e.g. set by fp8mp.convert); None follows fp8_autocast's.
        self.fp8_recipe = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not autocast_state.is_fp8_enabled():
            return F.linear(input, self.weight, self.bias)
        self._check_input(input)
        autocast_state.record_module(self)
        self.fp8_meta.configure(self.fp8_recipe or autocast_state.get_fp8_recipe())
        return fp8_linear(input, self.weight, self.bias, self.fp8_meta)

    def _check_input(self, input: torch.Tensor) -> None:
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise ValueError(f"fp8mp.nn.Linear: argument 'input' must have last dimension {self.in_features}, got shape {tuple(input.shape)}")
        if input.dtype not in HIGH_PRECISION_DTYPES:
            raise TypeError(f"fp8mp.nn.Linear: argument 'input' must be float32, bfloat16 or float16, got {input.dtype}")
        if input.device != self.weight.device:
            raise RuntimeError(f"fp8mp.nn.Linear: argument 'input' is on {input.device} but the weight is on {self.weight.device}")

    def to_torch(self) -> torch.nn.Linear:
        """A torch.nn.Linear sharing this module's parameters (the FP8 scaling state is dropped)."""
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight, linear.bias = self.weight, self.bias
        return linear

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Linear":
        """An fp8mp Linear sharing `linear`'s parameters (no copy)."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        new.weight, new.bias = linear.weight, linear.bias
        new.fp8_meta = Fp8Meta(len(LinearTensor), backward_tensors=(LinearTensor.GRAD_OUTPUT,), device=linear.weight.device)
        return new
