"""`bf16_matmul_via_fp32()`: bf16 matmuls computed as fp32 GEMMs of their bf16 operands, for CPUs without bf16 units.

A bf16 GEMM with fp32 accumulation (torch's CPU and CUDA bf16 matmuls) forms each product of two bf16 values, sums
the products in fp32 and rounds the sum to bf16 once. Each product is exact in fp32 (8 + 8 significant bits fit
fp32's 24), so an fp32 GEMM of the same bf16 values, widened to fp32 without loss, computes the same thing: the
same products, fp32 sums (only their order may differ, as it differs between any two GEMM kernels), one rounding
to bf16. On a CPU without bf16 units torch's bf16 matmul is oneDNN's emulation, about 100x slower than its fp32
GEMM on an AVX2-only EPYC; this computes BF16's numbers at the fp32 GEMM's speed there.

Inside ``with bf16_matmul_via_fp32():`` every ``F.linear``, ``matmul`` (``@``), ``mm`` and ``bmm`` on CPU tensors
that would compute in bf16 -- under ``torch.autocast("cpu", dtype=torch.bfloat16)``, or with bf16 operands -- runs
so: its operands are cast to bf16 as autocast casts them, the product is an fp32 GEMM of their fp32 widenings, and
the result is rounded to bf16. Backward computes each gradient the same way (an fp32 GEMM of the bf16 gradient and
the bf16 operand, rounded to bf16), as torch's bf16 matmul's backward does in bf16; the operands are saved in bf16,
as torch saves them. Everything else, CUDA tensors, other dtypes and the other autocast ops (attention, convolution)
stays torch's own. The mode lives on the calling thread's torch-function mode stack only: no global torch state
changes, and other threads run torch's kernels.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from fp8mp.ops.gemm import cpu_gemm_path

__all__ = ["bf16_matmul_via_fp32", "cpu_has_bf16_matmul_units", "Bf16ViaFp32State"]

_BF16 = torch.bfloat16
# Autocast casts the floating-point operands of these ops to its dtype (not fp64); without autocast they compute in
# bf16 only when their operands are bf16.
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
_LINEAR = {F.linear}
_MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}
_MM = {torch.mm, torch.Tensor.mm}
_BMM = {torch.bmm, torch.Tensor.bmm}


def cpu_has_bf16_matmul_units() -> bool:
    """Whether this CPU has bf16 matrix units that fp8mp's own GEMM uses: AMX-BF16 tiles, or AVX512-BF16 on a
    CPU whose cores run it faster than fp32 FMAs (fp8mp.ops.cpu_gemm_path() is "amx" or "avx512bf16").

    False on AVX2-only CPUs, on AVX-512 CPUs without BF16, on Intel CPUs with AVX512-BF16 but no usable AMX (their
    bf16 dot products run at half the fp32 FMAs' rate), and under FP8MP_CPU_ISA=avx2 or baseline, which makes one
    machine run what such a CPU runs (and FP8MP_CPU_GEMM=fp32). There an fp32 GEMM is the faster way to BF16's
    numbers."""
    return cpu_gemm_path() != "fp32"


@dataclass
class Bf16ViaFp32State:
    """What `bf16_matmul_via_fp32` did: `enabled`, whether its mode was on; `calls`, how many matmuls (forward)
    it computed as fp32 GEMMs of bf16 operands so far."""

    enabled: bool
    calls: int = 0

    @property
    def kernel(self) -> str:
        """The matmul kernel the bf16 matmuls ran on, in words."""
        return "fp32 GEMM of bf16 operands" if self.enabled and self.calls else "torch bf16 matmul"


def _widened(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


class _LinearViaFp32(torch.autograd.Function):
    """F.linear of bf16 x, weight and bias as an fp32 GEMM, rounded to bf16 once; backward likewise."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.autocast("cpu", enabled=False):
            return F.linear(_widened(x), _widened(weight), None if bias is None else _widened(bias)).to(_BF16)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        with torch.autocast("cpu", enabled=False):
            g = _widened(grad)
            if ctx.needs_input_grad[0]:
                grad_x = (g @ _widened(weight)).to(_BF16)
            rows = g.reshape(-1, g.shape[-1])
            if ctx.needs_input_grad[1]:
                grad_weight = (rows.t() @ _widened(x).reshape(-1, x.shape[-1])).to(_BF16)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = rows.sum(0).to(_BF16)
        return grad_x, grad_weight, grad_bias


class _MatmulViaFp32(torch.autograd.Function):
    """torch.matmul of bf16 operands of at least 2 dimensions as an fp32 GEMM, rounded to bf16 once; backward
    likewise, a broadcast operand's gradient summed in fp32 over the broadcast dimensions before its rounding."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        with torch.autocast("cpu", enabled=False):
            return torch.matmul(_widened(a), _widened(b)).to(_BF16)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        with torch.autocast("cpu", enabled=False):
            g = _widened(grad)
            if ctx.needs_input_grad[0]:
                grad_a = (g @ _widened(b).transpose(-1, -2)).sum_to_size(a.shape).to(_BF16)
            if ctx.needs_input_grad[1]:
                grad_b = (_widened(a).transpose(-1, -2) @ g).sum_to_size(b.shape).to(_BF16)
        return grad_a, grad_b


class _Bf16ViaFp32Mode(TorchFunctionMode):
    def __init__(self, state: Bf16ViaFp32State):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        routed = _route(func, args, kwargs)
        if routed is None:
            return func(*args, **kwargs)
        function, operands = routed
        self.state.calls += 1
        return function.apply(*operands)


def _operands_in_bf16(tensors) -> list | None:
    """The operands cast as the op computes them in bf16 on CPU (autocast's cast, or already bf16), or None where it
    would not compute in bf16 there."""
    present = [t for t in tensors if t is not None]
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in present):
        return None
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == _BF16:
        if not all(t.dtype in _CASTABLE for t in present):
            return None
        return [None if t is None else t.to(_BF16) for t in tensors]
    if all(t.dtype == _BF16 for t in present):
        return list(tensors)
    return None


def _route(func, args, kwargs):
    """(the autograd function, its operands) for a call this mode computes, or None for torch's own."""
    if func in _LINEAR:
        if len(args) + len(kwargs) > 3 or set(kwargs) - {"input", "weight", "bias"}:
            return None
        names = ("input", "weight", "bias")
        values = dict(zip(names, args)) | kwargs
        if "input" not in values or "weight" not in values:
            return None
        x, weight, bias = values["input"], values["weight"], values.get("bias")
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not isinstance(x, torch.Tensor) or x.dim() < 1:
            return None
        operands = _operands_in_bf16([x, weight, bias])
        return None if operands is None else (_LinearViaFp32, operands)
    if func in _MATMUL or func in _MM or func in _BMM:
        if kwargs or len(args) != 2:
            return None  # out=: torch's own
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return None
        if func in _MM and not (a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]):
            return None  # torch's own, with its own error for bad shapes
        if func in _BMM and not (a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]):
            return None
        if a.dim() < 2 or b.dim() < 2:
            return None  # vector products: torch's own
        operands = _operands_in_bf16([a, b])
        return None if operands is None else (_MatmulViaFp32, operands)
    return None


@contextlib.contextmanager
def bf16_matmul_via_fp32(enabled: bool | None = None) -> Iterator[Bf16ViaFp32State]:
    """Inside, CPU matmuls that compute in bf16 (F.linear, matmul, mm, bmm under torch.autocast("cpu",
    dtype=torch.bfloat16), or with bf16 operands) run as fp32 GEMMs of their bf16 operands, rounded to bf16: the
    numbers of a bf16 GEMM with fp32 accumulation, at the fp32 GEMM's speed (module docstring).

    Args:
        enabled: True turns it on, False leaves torch's bf16 matmul; None (default) turns it on only where the CPU
            has no bf16 matrix units fp8mp would use (``not cpu_has_bf16_matmul_units()``).

    Yields a Bf16ViaFp32State: whether it is on, how many matmuls it computed, and the kernel in words. Only the
    calling thread is affected, only until the block ends; CUDA tensors always take torch's kernels.
    """
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"bf16_matmul_via_fp32: argument 'enabled' must be True, False or None, got {enabled!r}")
    on = (not cpu_has_bf16_matmul_units()) if enabled is None else enabled
    state = Bf16ViaFp32State(enabled=on)
    if not on:
        yield state
        return
    with _Bf16ViaFp32Mode(state):
        yield state
