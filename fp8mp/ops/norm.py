"""LayerNorm / RMSNorm ops: fake kernels, autograd, and documented wrappers.

The six ops are declared in csrc/ops.cpp and implemented in csrc/norm/norm_cpu_kernels.cpp
and csrc/norm/norm_cuda_kernels.cu. All normalize over the last dimension H of ``x``, with
statistics (mean, rstd) in fp32 whatever x's dtype (float32, bfloat16, float16):

* ``layernorm_fwd``:  out = (x - mean) * rstd * g + bias
* ``rmsnorm_fwd``:    out = x * rstd * g,  rstd = 1 / sqrt(mean(x^2) + eps)

where g = weight, or 1 + weight with ``zero_centered_gamma`` (g = 1 without a
weight). ``out`` has x's dtype; mean / rstd are fp32 of shape x.shape[:-1].

The ``*_fwd_fp8`` variants compute the same out (rounded to x's dtype), then
cast it to FP8 with ``scale`` in the same kernel, writing max|out| into
``amax`` (NaN-propagating). They mutate amax, so they have no autograd
formula; their callers (fp8mp.nn.LayerNormLinear) call the ``*_bwd`` ops
themselves. ``norm_fwd_block_fp8`` (CPU only) writes the out of either norm as block-scaled
FP8 in both layouts instead (``norm_block_fp8``). Autograd is registered on the functional ``layernorm_fwd`` and
``rmsnorm_fwd`` only: gradients flow into x, weight and bias through ``out``;
gradients arriving at the returned mean / rstd are ignored (treat them as
non-differentiable statistics).
"""
from __future__ import annotations

from typing import Optional

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops import checks
from fp8mp.ops.blockwise import block_quantize_transpose, refuse_cuda

NORM_BLOCK_FP8_CUDA_MISSING = ("fp8mp has no fused CUDA kernel for it (CPU only); on CUDA, fp8mp.ops.norm.norm_to_block_fp8 "
                               "(what fp8mp.nn.LayerNormLinear calls) runs the norm, then fp8mp.ops.block_quantize_transpose")
from fp8mp.ops.errors import raising_value_errors
from fp8mp.ops.format import FP8_DTYPES

__all__ = [
    "layer_norm",
    "layer_norm_fp8",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_backward",
    "norm_block_fp8",
    "norm_to_block_fp8",
]


# ---------------------------------------------------------------- fake kernels


def _stats_like(x):
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


def _out_like(x, dtype=None):
    return torch.empty_like(x, dtype=dtype or x.dtype, memory_format=torch.contiguous_format)


def _param_grad_like(weight, x):
    if weight is None:
        return x.new_empty((0,), dtype=torch.float32)
    return torch.empty_like(weight, memory_format=torch.contiguous_format)


@torch.library.register_fake("fp8mp::layernorm_fwd")
def _layernorm_fwd_fake(x, weight, bias, eps, zero_centered_gamma):
    checks.check_norm_fwd_args(x, weight, bias, eps, "fp8mp::layernorm_fwd")
    return _out_like(x), _stats_like(x), _stats_like(x)


@torch.library.register_fake("fp8mp::layernorm_fwd_fp8")
def _layernorm_fwd_fp8_fake(x, weight, bias, eps, zero_centered_gamma, scale, amax, fmt):
    fmt = checks.check_norm_fwd_fp8_args(x, weight, bias, eps, scale, amax, fmt, "fp8mp::layernorm_fwd_fp8")
    return _out_like(x, FP8_DTYPES[fmt]), _stats_like(x), _stats_like(x)


@torch.library.register_fake("fp8mp::norm_fwd_block_fp8")
def _norm_fwd_block_fp8_fake(x, weight, bias, eps, is_layernorm, zero_centered_gamma, row_block, col_block, fmt,
                             scale_mode):
    refuse_cuda("fp8mp.ops.norm_block_fp8", NORM_BLOCK_FP8_CUDA_MISSING, x)
    fmt, scale_mode = checks.check_norm_block_fp8_args(x, weight, bias, eps, is_layernorm, row_block, col_block, fmt,
                                                       scale_mode)
    rows, cols = x.shape
    data_dtype = FP8_DTYPES[fmt]
    scale_dtype = torch.float8_e8m0fnu if scale_mode.startswith("e8m0") else torch.float32
    return (x.new_empty((rows, cols), dtype=data_dtype), x.new_empty((rows, -(-cols // row_block)), dtype=scale_dtype),
            x.new_empty((cols, rows), dtype=data_dtype), x.new_empty((cols, -(-rows // col_block)), dtype=scale_dtype),
            x.new_empty((rows if is_layernorm else 0,), dtype=torch.float32), x.new_empty((rows,), dtype=torch.float32))


@torch.library.register_fake("fp8mp::layernorm_bwd")
def _layernorm_bwd_fake(grad_out, x, mean, rstd, weight, zero_centered_gamma):
    checks.check_norm_bwd_args(grad_out, x, mean, rstd, weight, "fp8mp::layernorm_bwd")
    return _out_like(x), _param_grad_like(weight, x), _param_grad_like(weight, x)


@torch.library.register_fake("fp8mp::rmsnorm_fwd")
def _rmsnorm_fwd_fake(x, weight, eps, zero_centered_gamma):
    checks.check_norm_fwd_args(x, weight, None, eps, "fp8mp::rmsnorm_fwd")
    return _out_like(x), _stats_like(x)


@torch.library.register_fake("fp8mp::rmsnorm_fwd_fp8")
def _rmsnorm_fwd_fp8_fake(x, weight, eps, zero_centered_gamma, scale, amax, fmt):
    fmt = checks.check_norm_fwd_fp8_args(x, weight, None, eps, scale, amax, fmt, "fp8mp::rmsnorm_fwd_fp8")
    return _out_like(x, FP8_DTYPES[fmt]), _stats_like(x)


@torch.library.register_fake("fp8mp::rmsnorm_bwd")
def _rmsnorm_bwd_fake(grad_out, x, rstd, weight, zero_centered_gamma):
    checks.check_norm_bwd_args(grad_out, x, None, rstd, weight, "fp8mp::rmsnorm_bwd")
    return _out_like(x), _param_grad_like(weight, x)


# ---------------------------------------------------------------- autograd


def _layernorm_setup_context(ctx, inputs, output):
    x, weight, bias, _eps, zero_centered_gamma = inputs
    _out, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _layernorm_backward(ctx, grad_out, _grad_mean, _grad_rstd):
    x, weight, mean, rstd = ctx.saved_tensors
    grad_x, grad_weight, grad_bias = torch.ops.fp8mp.layernorm_bwd(
        grad_out.contiguous(), x, mean, rstd, weight, ctx.zero_centered_gamma
    )
    if weight is None:
        grad_weight = None
        # layernorm_bwd returns an empty grad_bias without a weight; a bias without a
        # weight is unusual but allowed, and its gradient is sum(grad_out) over rows.
        grad_bias = grad_out.float().reshape(-1, grad_out.shape[-1]).sum(0) if ctx.bias_dtype is not None else None
    if ctx.bias_dtype is None:
        grad_bias = None
    elif grad_bias is not None:
        grad_bias = grad_bias.to(ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias, None, None


def _rmsnorm_setup_context(ctx, inputs, output):
    x, weight, _eps, zero_centered_gamma = inputs
    _out, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.zero_centered_gamma = zero_centered_gamma


def _rmsnorm_backward(ctx, grad_out, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    grad_x, grad_weight = torch.ops.fp8mp.rmsnorm_bwd(grad_out.contiguous(), x, rstd, weight, ctx.zero_centered_gamma)
    return grad_x, grad_weight if weight is not None else None, None, None


torch.library.register_autograd("fp8mp::layernorm_fwd", _layernorm_backward, setup_context=_layernorm_setup_context)
torch.library.register_autograd("fp8mp::rmsnorm_fwd", _rmsnorm_backward, setup_context=_rmsnorm_setup_context)


# ---------------------------------------------------------------- wrappers


@raising_value_errors
def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """LayerNorm over the last dimension, differentiable in x, weight and bias.

    Like ``torch.nn.functional.layer_norm(x, (H,), weight, bias, eps)``, with
    fp32 statistics for any input dtype. With ``zero_centered_gamma`` the gain
    is ``1 + weight`` (weights stored around 0, which keeps them precise in
    low-precision storage and under weight decay).

    Args:
        x: float32, bfloat16 or float16 tensor [..., H].
        weight, bias: optional [H] tensors (one high-precision dtype, x's device).
        eps: added to the variance; > 0.

    Returns:
        out, with x's shape and dtype.
    """
    return torch.ops.fp8mp.layernorm_fwd(x, weight, bias, eps, zero_centered_gamma)[0]


@raising_value_errors
def layer_norm_fp8(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    fmt: str = "e4m3",
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm with the FP8 cast fused: returns (out_fp8, mean, rstd); not differentiable.

    ``out_fp8`` equals ``cast_to_fp8(layer_norm(x, ...), scale, amax, fmt)`` bit for bit
    (the normalized value is rounded to x's dtype first), and ``amax`` (1-element
    float32) is overwritten with max|layer_norm(x, ...)|. For the backward pass call
    :func:`layer_norm_backward` with the returned mean and rstd.
    """
    return torch.ops.fp8mp.layernorm_fwd_fp8(x, weight, bias, eps, zero_centered_gamma, scale, amax, fmt)


@raising_value_errors
def layer_norm_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight, grad_bias) of layer_norm; grad_weight / grad_bias are in weight's
    dtype, and empty float32 tensors (``torch.empty(0)``) when ``weight`` is None."""
    return torch.ops.fp8mp.layernorm_bwd(grad_out, x, mean, rstd, weight, zero_centered_gamma)


@raising_value_errors
def rms_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    zero_centered_gamma: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dimension, differentiable in x and weight.

    Like ``torch.nn.functional.rms_norm(x, (H,), weight, eps)``: ``x * rstd * g`` with
    ``rstd = 1 / sqrt(mean(x^2) + eps)`` in fp32; g = weight, or 1 + weight with
    ``zero_centered_gamma``.
    """
    return torch.ops.fp8mp.rmsnorm_fwd(x, weight, eps, zero_centered_gamma)[0]


@raising_value_errors
def rms_norm_fp8(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    scale: torch.Tensor,
    amax: torch.Tensor,
    fmt: str = "e4m3",
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm with the FP8 cast fused: returns (out_fp8, rstd); not differentiable.
    See :func:`layer_norm_fp8`; use :func:`rms_norm_backward` for the gradients."""
    return torch.ops.fp8mp.rmsnorm_fwd_fp8(x, weight, eps, zero_centered_gamma, scale, amax, fmt)


@raising_value_errors
def rms_norm_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    zero_centered_gamma: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) of rms_norm; grad_weight is in weight's dtype, an empty
    float32 tensor when ``weight`` is None."""
    return torch.ops.fp8mp.rmsnorm_bwd(grad_out, x, rstd, weight, zero_centered_gamma)


@raising_value_errors
def norm_block_fp8(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                   is_layernorm: bool, row_block: int, col_block: int, fmt: str = "e4m3", scale_mode: str = "fp32",
                   zero_centered_gamma: bool = False):
    """LayerNorm / RMSNorm of a 2-D x writing block-scaled FP8 directly; not differentiable.

    Returns (data, scale_inv, data_t, scale_inv_t, mean, rstd): the first four bit for bit
    ``block_quantize_transpose(norm(x), row_block, col_block, fmt, scale_mode)`` with norm(x) the
    layer_norm / rms_norm output in x's dtype (never materialized: the kernel normalizes strips of
    col_block rows into a buffer and quantizes them both ways); mean (LayerNorm; [0] for RMSNorm)
    and rstd for :func:`layer_norm_backward` / :func:`rms_norm_backward`. CPU only.
    """
    refuse_cuda("fp8mp.ops.norm_block_fp8", NORM_BLOCK_FP8_CUDA_MISSING, x)
    return torch.ops.fp8mp.norm_fwd_block_fp8(x, weight, bias, eps, is_layernorm, zero_centered_gamma, row_block,
                                              col_block, fmt, scale_mode)


def norm_to_block_fp8(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                      is_layernorm: bool, row_block: int, col_block: int, fmt: str = "e4m3", scale_mode: str = "fp32",
                      zero_centered_gamma: bool = False):
    """:func:`norm_block_fp8`'s results on any device: its fused kernel where there is one (CPU), else the norm op
    followed by ``block_quantize_transpose`` of its output (CUDA), the computation the fused kernel equals bit for
    bit, at the cost of one more write and read of the normalized activation."""
    if not x.is_cuda:
        return norm_block_fp8(x, weight, bias, eps, is_layernorm, row_block, col_block, fmt, scale_mode,
                              zero_centered_gamma)
    if is_layernorm:
        out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, weight, bias, eps, zero_centered_gamma)
    else:
        (out, rstd), mean = torch.ops.fp8mp.rmsnorm_fwd(x, weight, eps, zero_centered_gamma), x.new_empty(0, dtype=torch.float32)
    return (*block_quantize_transpose(out, row_block, col_block, fmt, scale_mode), mean, rstd)
