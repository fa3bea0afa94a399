"""LayerNorm and RMSNorm modules: drop-in replacements for torch.nn.LayerNorm / torch.nn.RMSNorm.

Same constructor arguments, parameters and state_dict keys (``weight``,
``bias``), so torch checkpoints load as they are. Differences:

* only the last dimension is normalized (normalized_shape is an int or a
  1-element shape);
* statistics are computed in fp32 for float32, bfloat16 and float16 inputs
  (other dtypes are rejected), and the output has the input's dtype whatever
  the parameters' dtype;
* ``zero_centered_gamma=True`` stores the gain as ``weight`` around 0 (the
  effective gain is ``1 + weight``; it initializes to zeros). Loading a torch
  checkpoint into such a module would need ``weight - 1``.
* :meth:`forward_fp8` returns the output already cast to FP8 (no autograd;
  used by fp8mp.nn.LayerNormLinear together with fp8mp.norm_ops' backward ops).
"""
from __future__ import annotations

import ctypes
import math
import numbers
from typing import Optional, Union

import torch
from torch import nn

from fp8mp.ops import norm as norm_ops

_ShapeArg = Union[int, tuple, list, torch.Size]


def _last_dim_shape(normalized_shape: _ShapeArg, cls: str) -> tuple[int]:
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(int(d) for d in normalized_shape)
        except TypeError:
            raise ValueError(f"{cls}: normalized_shape must be an int or a 1-element shape, got {normalized_shape!r}") from None
    if len(shape) != 1:
        raise ValueError(
            f"{cls}: fp8mp normalizes over the last dimension only, so normalized_shape must be an int or a "
            f"1-element shape, got {tuple(shape)}"
        )
    if shape[0] <= 0:
        raise ValueError(f"{cls}: normalized_shape must be positive, got {shape}")
    return shape


def check_eps(eps, cls: str) -> float:
    """`eps` as a float, or an error naming it (TypeError: not a real number, or a bool; ValueError: not
    finite and > 0 as a float32, the precision the norm kernels add it in). csrc/norm/norm_checks.cpp refuses the non-finite ones
    at the first forward but takes True as 1.0; refusing at construction names the module and keeps a bad
    value out of its state."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{cls}: argument 'eps' must be a real number, got {eps!r} of type {type(eps).__name__}")
    as_float32 = ctypes.c_float(float(eps)).value
    if not (math.isfinite(as_float32) and as_float32 > 0.0):
        raise ValueError(f"{cls}: argument 'eps' must be > 0 and finite (as a float32), got {eps!r}")
    return float(eps)


def _check_input(x: torch.Tensor, normalized_shape: tuple[int], cls: str) -> None:
    if x.dim() < 1 or x.shape[-1] != normalized_shape[0]:
        raise ValueError(
            f"{cls}: argument 'input' must have last dimension {normalized_shape[0]} (normalized_shape "
            f"{list(normalized_shape)}), got input of shape {list(x.shape)}"
        )


def _to_torch_check(module: nn.Module) -> None:
    if module.zero_centered_gamma:
        raise ValueError(f"{type(module).__name__} with zero_centered_gamma=True has no torch twin (its gain is 1 + weight)")


def _share_parameters(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Make `dst` use `src`'s weight and bias tensors (no copy); returns `dst`."""
    dst.weight = src.weight
    if hasattr(src, "bias") and hasattr(dst, "bias"):
        dst.bias = src.bias
    return dst


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension; see the module docstring for the differences from torch's."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "zero_centered_gamma"]

    def __init__(
        self,
        normalized_shape: _ShapeArg,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _last_dim_shape(normalized_shape, "LayerNorm")
        self.eps = check_eps(eps, "LayerNorm")
        self.elementwise_affine = elementwise_affine
        self.zero_centered_gamma = zero_centered_gamma
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            (nn.init.zeros_ if self.zero_centered_gamma else nn.init.ones_)(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input(input, self.normalized_shape, "LayerNorm")
        return norm_ops.layer_norm(input, self.weight, self.bias, self.eps, self.zero_centered_gamma)

    @classmethod
    def from_torch(cls, module: nn.LayerNorm) -> "LayerNorm":
        """An fp8mp LayerNorm sharing `module`'s parameters (normalized_shape must be 1-D)."""
        new = cls(module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine,
                  bias=module.bias is not None, device="meta")
        return _share_parameters(module, new)

    def to_torch(self) -> nn.LayerNorm:
        _to_torch_check(self)
        new = nn.LayerNorm(self.normalized_shape, eps=self.eps, elementwise_affine=self.elementwise_affine,
                           bias=self.bias is not None, device="meta")
        return _share_parameters(self, new)

    def forward_fp8(
        self, input: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str = "e4m3"
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(out_fp8, mean, rstd): the forward cast to FP8 with `scale`, amax overwritten with
        max|out|. Not differentiable: backward goes through fp8mp.norm_ops.layer_norm_backward."""
        _check_input(input, self.normalized_shape, "LayerNorm")
        return norm_ops.layer_norm_fp8(
            input, self.weight, self.bias, self.eps, scale, amax, fmt, zero_centered_gamma=self.zero_centered_gamma
        )

    def extra_repr(self) -> str:
        text = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        return text + (", zero_centered_gamma=True" if self.zero_centered_gamma else "")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension; ``eps=None`` means ``torch.finfo(input.dtype).eps``, as in torch."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "zero_centered_gamma"]

    def __init__(
        self,
        normalized_shape: _ShapeArg,
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        zero_centered_gamma: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _last_dim_shape(normalized_shape, "RMSNorm")
        self.eps = None if eps is None else check_eps(eps, "RMSNorm")
        self.elementwise_affine = elementwise_affine
        self.zero_centered_gamma = zero_centered_gamma
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            (nn.init.zeros_ if self.zero_centered_gamma else nn.init.ones_)(self.weight)

    def _eps_for(self, x: torch.Tensor) -> float:
        if self.eps is not None:
            return self.eps
        return torch.finfo(x.dtype).eps if x.is_floating_point() else torch.finfo(torch.float32).eps

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input(input, self.normalized_shape, "RMSNorm")
        return norm_ops.rms_norm(input, self.weight, self._eps_for(input), self.zero_centered_gamma)

    @classmethod
    def from_torch(cls, module: nn.RMSNorm) -> "RMSNorm":
        """An fp8mp RMSNorm sharing `module`'s weight (normalized_shape must be 1-D)."""
        new = cls(module.normalized_shape, eps=module.eps, elementwise_affine=module.elementwise_affine, device="meta")
        return _share_parameters(module, new)

    def to_torch(self) -> nn.RMSNorm:
        _to_torch_check(self)
        new = nn.RMSNorm(self.normalized_shape, eps=self.eps, elementwise_affine=self.elementwise_affine, device="meta")
        return _share_parameters(self, new)

    def forward_fp8(
        self, input: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str = "e4m3"
    ) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(out_fp8, None, rstd): as :meth:`LayerNorm.forward_fp8` (RMSNorm has no mean);
        backward goes through fp8mp.norm_ops.rms_norm_backward."""
        _check_input(input, self.normalized_shape, "RMSNorm")
        out, rstd = norm_ops.rms_norm_fp8(
            input, self.weight, self._eps_for(input), scale, amax, fmt, zero_centered_gamma=self.zero_centered_gamma
        )
        return out, None, rstd

    def extra_repr(self) -> str:
        text = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        return text + (", zero_centered_gamma=True" if self.zero_centered_gamma else "")
