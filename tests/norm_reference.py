"""References and inputs for the norm tests: torch's own norms in float64 / fp32 and error bounds."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fp8mp.ops import norm as norm_ops

FORMATS = ["e4m3", "e5m2"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HIDDEN = [1, 7, 64, 1000, 4096]
EPS32 = torch.finfo(torch.float32).eps
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
MIN_EXPONENT = {torch.bfloat16: -126, torch.float16: -14}


def make_rows(kind: str, shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    if kind == "random":
        x = x * 3 - 1
    elif kind == "large":  # |x| ~ 1e4, spread ~ 1: one-pass E[x^2] - E[x]^2 cancels every digit
        x = 1e4 + x * (1.0 if dtype == torch.float32 else 64.0)
    elif kind == "tiny_variance":  # equal up to ~1e-6 relative
        x = 3.0 * (1 + 1e-6 * x) if dtype == torch.float32 else torch.full(shape, 3.0) + (x > 1.5) * 2e-2
    return x.to(dtype)


def make_params(hidden, case, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(hidden, generator=gen) * 0.5 + (0 if case == "zero_centered" else 1)).to(dtype)
    b = (torch.randn(hidden, generator=gen) * 0.2).to(dtype)
    if case == "none":
        return None, None
    if case == "no_bias":
        return w, None
    return w, b


def gain64(w, hidden, zero_centered):
    if w is None:
        return None
    return w.double() + 1 if zero_centered else w.double()


def ulp(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of dtype at |v| (v float): 2^(exponent - mantissa bits), floored at the subnormal step."""
    _, e = torch.frexp(v.abs())
    exponent = torch.clamp(e - 1, min=MIN_EXPONENT[dtype])
    return torch.ldexp(torch.ones_like(v), exponent - MANTISSA_BITS[dtype])


def fp32_row_bound(x, rstd64, g64):
    """Absolute error an fp32 evaluation may make per row: a few fp32 ulps of the inputs, normalized."""
    gmax = 1.0 if g64 is None else g64.abs().max().item()
    return (8 * EPS32 * x.double().abs().amax(-1, keepdim=True) * rstd64.unsqueeze(-1) + 1e-6) * gmax


def check_forward(out, ref64, ref32, x, rstd64, g64, dtype):
    bound = fp32_row_bound(x, rstd64, g64)
    if dtype == torch.float32:
        err = (out.double() - ref64).abs()
        allowed = 1e-5 * ref64.abs() + bound
    else:
        # 1 ulp of the dtype against torch's fp32 result rounded to the dtype; near zero,
        # where a bf16/fp16 ulp is below fp32 noise, the fp32 bound applies.
        expected = ref32.to(dtype).float()
        err = (out.float() - expected).abs().double()
        allowed = torch.maximum(ulp(torch.maximum(out.float().abs(), expected.abs()), dtype).double(), bound)
    bad = err > allowed
    assert not bad.any(), f"{int(bad.sum())} elements off, worst excess {(err - allowed).max().item():.3g}"


def backward_case_params(hidden, norm, case, dtype=torch.float32):
    """The weight and bias (None where the case has none) of one of BACKWARD_CASES."""
    w, b = make_params(hidden, "zero_centered" if case == "zero_centered" else "affine", dtype)
    if case in ("no_bias", "none") or norm == "rmsnorm":
        b = None
    if case in ("none", "bias_only"):
        w = None
    return w, b


def torch_grads(x, w, b, go, hidden, zc, norm, eps):
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    b64 = None if b is None else b.double().requires_grad_()
    g64 = None if w64 is None else (w64 + 1 if zc else w64)
    if norm == "layernorm":
        out = F.layer_norm(x64, (hidden,), g64, b64, eps)
    else:
        out = F.rms_norm(x64, (hidden,), g64, eps)
    out.backward(go.double())
    return x64.grad, None if w64 is None else w64.grad, None if b64 is None else b64.grad


def ours_grads(x, w, b, go, zc, norm, eps):
    xr = x.clone().requires_grad_()
    wr = None if w is None else w.clone().requires_grad_()
    br = None if b is None else b.clone().requires_grad_()
    if norm == "layernorm":
        out = norm_ops.layer_norm(xr, wr, br, eps, zc)
    else:
        out = norm_ops.rms_norm(xr, wr, eps, zc)
    out.backward(go)
    return xr.grad, None if wr is None else wr.grad, None if br is None else br.grad


def assert_grad_close(ours, ref, what, rel, term_scale=0.0):
    """max error <= rel * the largest |grad|, or the largest term summed into it (term_scale) when
    the gradient is a cancellation (H = 1: LayerNorm's grad_x is 0, RMSNorm's is rstd * dy * (1 - xhat^2))."""
    assert ours is not None and ours.shape == ref.shape, what
    scale = max(ref.abs().max().item(), term_scale, 1e-6)
    err = (ours.double() - ref).abs().max().item()
    assert err <= rel * scale, f"{what}: max error {err:.3g} vs max |grad| {scale:.3g}"


BACKWARD_CASES = [("layernorm", c) for c in ("affine", "no_bias", "none", "zero_centered", "bias_only")] + [
    ("rmsnorm", c) for c in ("affine", "none", "zero_centered")
]
