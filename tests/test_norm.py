"""fp8mp LayerNorm / RMSNorm ops and modules, against torch's own norms in float64 / fp32."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fp8mp
import fp8mp.nn as fnn
from fp8mp import norm_ops
from fp8_reference import FP8_DTYPES, torch_reference_bits
from opcheck_util import opcheck_fp8_aware

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


# ---------------------------------------------------------------- forward vs torch


@pytest.mark.parametrize("case", ["affine", "no_bias", "none", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("kind", ["random", "large", "tiny_variance"])
def test_layernorm_matches_torch(kind, hidden, dtype, case):
    shape = (5, hidden) if hidden % 2 else (2, 3, hidden)
    x = make_rows(kind, shape, dtype)
    w, b = make_params(hidden, case)
    zc = case == "zero_centered"
    eps = 1e-5
    out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, b, eps, zc)
    assert out.dtype == dtype and out.shape == x.shape
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == shape[:-1]
    g64 = gain64(w, hidden, zc)
    x64 = x.double()
    ref64 = F.layer_norm(x64, (hidden,), g64, None if b is None else b.double(), eps)
    g32 = None if g64 is None else g64.float()
    ref32 = F.layer_norm(x.float(), (hidden,), g32, b, eps)
    mean64 = x64.mean(-1)
    rstd64 = 1 / (x64.var(-1, unbiased=False) + eps).sqrt()
    assert torch.all((mean.double() - mean64).abs() <= EPS32 * mean64.abs() + 1e-6 / rstd64)
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-5, atol=0)
    check_forward(out, ref64, ref32, x, rstd64, g64, dtype)


@pytest.mark.parametrize("case", ["affine", "none", "zero_centered"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("kind", ["random", "large", "tiny_variance"])
def test_rmsnorm_matches_torch(kind, hidden, dtype, case):
    shape = (5, hidden) if hidden % 2 else (2, 3, hidden)
    x = make_rows(kind, shape, dtype)
    w, _ = make_params(hidden, case)
    zc = case == "zero_centered"
    eps = 1e-6
    out, rstd = torch.ops.fp8mp.rmsnorm_fwd(x, w, eps, zc)
    assert out.dtype == dtype and out.shape == x.shape and rstd.shape == shape[:-1] and rstd.dtype == torch.float32
    g64 = gain64(w, hidden, zc)
    x64 = x.double()
    ref64 = F.rms_norm(x64, (hidden,), g64, eps)
    ref32 = F.rms_norm(x.float(), (hidden,), None if g64 is None else g64.float(), eps)
    rstd64 = 1 / (x64.square().mean(-1) + eps).sqrt()
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-5, atol=0)
    check_forward(out, ref64, ref32, x, rstd64, g64, dtype)


def test_large_magnitude_rows_beat_one_pass_variance():
    x = make_rows("large", (64, 4096), torch.float32, seed=3)
    _, _, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    x64 = x.double()
    rstd64 = 1 / (x64.var(-1, unbiased=False) + 1e-5).sqrt()
    one_pass_var = (x.square().mean(-1) - x.mean(-1).square()).clamp_min(0)  # what a naive fp32 kernel gets
    one_pass_rstd = 1 / (one_pass_var.double() + 1e-5).sqrt()
    assert ((one_pass_rstd - rstd64).abs() / rstd64).max() > 1e-2  # the case really is hard
    assert ((rstd.double() - rstd64).abs() / rstd64).max() < 1e-5


def test_constant_rows_and_nan_rows():
    x = torch.full((3, 16), 7.25)
    x[2, 5] = math.nan
    out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    assert torch.equal(out[:2], torch.zeros(2, 16)) and mean[:2].tolist() == [7.25, 7.25]
    assert rstd[0].item() == pytest.approx(1 / math.sqrt(1e-5), rel=1e-6)
    assert out[2].isnan().all() and mean[2].isnan() and rstd[2].isnan()


def test_non_contiguous_input_and_empty_batch():
    base = torch.randn(40, 24)
    x = base.t()  # [24, 40], rows not contiguous
    w = torch.randn(40)
    out = norm_ops.layer_norm(x, w, None)
    torch.testing.assert_close(out, F.layer_norm(x, (40,), w), rtol=1e-5, atol=1e-5)
    out, rstd = torch.ops.fp8mp.rmsnorm_fwd(torch.empty(0, 8), None, 1e-6, False)
    assert out.shape == (0, 8) and rstd.shape == (0,)
    amax = torch.tensor([5.0])
    y, _, _ = torch.ops.fp8mp.layernorm_fwd_fp8(torch.empty(0, 3, 8), None, None, 1e-5, False, torch.ones(1), amax, "e4m3")
    assert y.shape == (0, 3, 8) and amax.item() == 0.0


def test_weight_dtype_may_differ_from_input_dtype():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w, b = torch.randn(64), torch.randn(64)
    out = norm_ops.layer_norm(x, w, b)
    assert out.dtype == torch.bfloat16
    out_bf16w = norm_ops.layer_norm(x, w.bfloat16(), b.bfloat16())
    ref = F.layer_norm(x.float(), (64,), w.bfloat16().float(), b.bfloat16().float()).bfloat16()
    assert (out_bf16w.float() - ref.float()).abs().max() <= 2 ** -6 * ref.float().abs().max()


# ---------------------------------------------------------------- FP8 output


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 1000, 4096])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_fp8_output_is_cast_of_high_precision_output(norm, hidden, dtype, fmt):
    shape = (9, hidden) if hidden < 4096 else (2, 2, hidden)
    x = make_rows("random", shape, dtype, seed=hidden)
    w, b = make_params(hidden, "affine")
    for scale in (1.0, 37.5, 2.0**-3, 600.0):
        scale_t = torch.tensor([scale])
        amax = torch.full((1,), -1.0)
        if norm == "layernorm":
            out, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, True)
            y, mean8, rstd8 = torch.ops.fp8mp.layernorm_fwd_fp8(x, w, b, 1e-5, True, scale_t, amax, fmt)
            assert torch.equal(mean8, mean)
        else:
            out, rstd = torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, False)
            y, rstd8 = torch.ops.fp8mp.rmsnorm_fwd_fp8(x, w, 1e-6, False, scale_t, amax, fmt)
        assert torch.equal(rstd8, rstd)
        assert y.dtype == FP8_DTYPES[fmt] and y.shape == x.shape
        cast_amax = torch.zeros(1)
        expected = fp8mp.cast_to_fp8(out, scale_t, cast_amax, fmt)
        assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(y.view(torch.uint8), torch_reference_bits(out, scale, fmt))
        assert amax.item() == cast_amax.item() == out.float().abs().max().item()


def test_fp8_amax_propagates_nan_and_wrappers_match_ops():
    x = torch.randn(4, 32)
    x[3, 0] = math.nan
    amax = torch.zeros(1)
    y, _, _ = norm_ops.layer_norm_fp8(x, None, None, 1e-5, torch.ones(1), amax, "e4m3")
    assert math.isnan(amax.item())
    assert (y[3].view(torch.uint8).to(torch.int32) & 0x7F == 0x7F).all()
    amax2 = torch.zeros(1)
    y2, rstd = norm_ops.rms_norm_fp8(x[:3], torch.ones(32), 1e-6, torch.tensor([4.0]), amax2, "E5M2")
    assert y2.dtype == torch.float8_e5m2 and amax2.item() == norm_ops.rms_norm(x[:3], torch.ones(32)).abs().max().item()


# ---------------------------------------------------------------- backward


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


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("norm,case", BACKWARD_CASES)
def test_backward_matches_torch_float64(norm, case, hidden):
    shape = (37, hidden) if hidden < 1000 else (3, 5, hidden)
    x = make_rows("random", shape, torch.float32, seed=hidden)
    go = make_rows("random", shape, torch.float32, seed=hidden + 7)
    w, b = make_params(hidden, "zero_centered" if case == "zero_centered" else "affine")
    if case == "no_bias":
        b = None
    if case == "none":
        w, b = None, None
    if case == "bias_only":
        w = None
    if norm == "rmsnorm":
        b = None
    zc = case == "zero_centered"
    eps = 1e-5
    ref = torch_grads(x, w, b, go, hidden, zc, norm, eps)
    ours = ours_grads(x, w, b, go, zc, norm, eps)
    g = torch.ones(hidden) if w is None else (w + 1 if zc else w)
    x64 = x.double()
    rstd64 = 1 / ((x64.var(-1, unbiased=False) if norm == "layernorm" else x64.square().mean(-1)) + eps).sqrt()
    term = (go.double().abs() * g.double().abs() * rstd64.unsqueeze(-1)).max().item()  # |dy| * rstd
    for name, o, r in zip(("x", "weight", "bias"), ours, ref):
        if r is None:
            assert o is None, name
        else:
            assert_grad_close(o, r, f"grad {name}", 2e-5, term if name == "x" else 0.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_backward_low_precision_inputs(norm, dtype):
    hidden = 256
    x = make_rows("random", (16, hidden), dtype)
    go = make_rows("random", (16, hidden), dtype, seed=5)
    w, b = make_params(hidden, "affine", dtype)
    if norm == "rmsnorm":
        b = None
    ref = torch_grads(x, w, b, go, hidden, False, norm, 1e-5)
    ours = ours_grads(x, w, b, go, False, norm, 1e-5)
    assert ours[0].dtype == dtype and ours[1].dtype == dtype
    for name, o, r in zip(("x", "weight", "bias"), ours, ref):
        if r is not None:
            assert_grad_close(o, r, f"grad {name}", 2.0 ** -MANTISSA_BITS[dtype])


def test_bwd_ops_without_weight_return_empty_and_are_deterministic():
    x = torch.randn(300, 64)
    go = torch.randn(300, 64)
    _, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    gx, gw, gb = torch.ops.fp8mp.layernorm_bwd(go, x, mean, rstd, None, False)
    assert gw.shape == gb.shape == (0,) and gx.shape == x.shape
    _, rstd_r = torch.ops.fp8mp.rmsnorm_fwd(x, None, 1e-6, False)
    assert torch.ops.fp8mp.rmsnorm_bwd(go, x, rstd_r, None, False)[1].shape == (0,)
    w = torch.randn(64)
    first = torch.ops.fp8mp.layernorm_bwd(go, x, mean, rstd, w, False)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            again = torch.ops.fp8mp.layernorm_bwd(go, x, mean, rstd, w, False)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- opcheck


OPCHECK_CASES = [
    ("layernorm_fwd", lambda: (torch.randn(6, 32), torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True), 1e-5, False)),
    ("layernorm_fwd", lambda: (torch.randn(2, 3, 7, dtype=torch.bfloat16, requires_grad=True), None, None, 1e-5, True)),
    ("layernorm_fwd_fp8", lambda: (torch.randn(5, 48), torch.randn(48), torch.randn(48), 1e-5, False, torch.tensor([2.0]), torch.zeros(1), "e4m3")),
    ("layernorm_fwd_fp8", lambda: (torch.randn(3, 4, 16, dtype=torch.float16), None, None, 1e-5, True, torch.tensor([0.5]), torch.zeros(1), "e5m2")),
    ("layernorm_bwd", lambda: (torch.randn(4, 32), *_ln_saved(torch.randn(4, 32), torch.randn(32)), False)),
    ("layernorm_bwd", lambda: (torch.randn(4, 8), *_ln_saved(torch.randn(4, 8), None), False)),
    ("rmsnorm_fwd", lambda: (torch.randn(6, 32, requires_grad=True), torch.randn(32, requires_grad=True), 1e-6, False)),
    ("rmsnorm_fwd", lambda: (torch.randn(2, 3, 7, dtype=torch.bfloat16), None, 1e-6, True)),
    ("rmsnorm_fwd_fp8", lambda: (torch.randn(5, 48), torch.randn(48), 1e-6, False, torch.tensor([2.0]), torch.zeros(1), "e4m3")),
    ("rmsnorm_bwd", lambda: (torch.randn(4, 32), *_rms_saved(torch.randn(4, 32), torch.randn(32)), True)),
]


def _ln_saved(x, w):
    _, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, None, 1e-5, False)
    return x, mean, rstd, w


def _rms_saved(x, w):
    _, rstd = torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, True)
    return x, rstd, w


@pytest.mark.parametrize("name,make_args", OPCHECK_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPCHECK_CASES)])
def test_opcheck(name, make_args):
    opcheck_fp8_aware(getattr(torch.ops.fp8mp, name).default, make_args())


# ---------------------------------------------------------------- modules


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_module_state_dict_and_torch_checkpoints(affine, bias):
    ref = torch.nn.LayerNorm(96, eps=1e-5, elementwise_affine=affine, bias=bias)
    ours = fnn.LayerNorm(96, eps=1e-5, elementwise_affine=affine, bias=bias)
    assert list(ours.state_dict().keys()) == list(ref.state_dict().keys())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p))
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 96)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    assert ours.normalized_shape == ref.normalized_shape and ours.eps == ref.eps


@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("affine", [True, False])
def test_rmsnorm_module_state_dict_and_torch_checkpoints(affine, eps):
    ref = torch.nn.RMSNorm([64], eps=eps, elementwise_affine=affine)
    ours = fnn.RMSNorm([64], eps=eps, elementwise_affine=affine)
    assert list(ours.state_dict().keys()) == list(ref.state_dict().keys())
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p))
    ours.load_state_dict(ref.state_dict())
    for dtype in DTYPES:  # module and input in dtype, as torch's module requires
        x = torch.randn(7, 64).to(dtype)
        tol = 1e-5 if dtype == torch.float32 else 2.0 ** (1 - MANTISSA_BITS[dtype])  # torch rounds in dtype too
        torch.testing.assert_close(ours.to(dtype)(x).float(), ref.to(dtype)(x).float(), rtol=tol, atol=tol)


def test_modules_train_like_torch():
    torch.manual_seed(0)
    ref, ours = torch.nn.LayerNorm(32), fnn.LayerNorm(32)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(8, 32)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ref(x1) ** 2).sum().backward()
    (ours(x2) ** 2).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [fnn.LayerNorm, fnn.RMSNorm])
def test_zero_centered_gamma_modules(cls):
    m = cls(48, zero_centered_gamma=True)
    assert torch.equal(m.weight, torch.zeros(48))
    x = torch.randn(4, 48)
    plain = cls(48)
    torch.testing.assert_close(m(x), plain(x), rtol=0, atol=0)
    with torch.no_grad():
        m.weight.fill_(0.5)
        plain.weight.fill_(1.5)
    torch.testing.assert_close(m(x), plain(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cls", [fnn.LayerNorm, fnn.RMSNorm])
def test_module_forward_fp8(cls):
    m = cls(64)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    scale, amax, cast_amax = torch.tensor([8.0]), torch.zeros(1), torch.zeros(1)
    y, mean, rstd = m.forward_fp8(x, scale, amax, "e4m3")
    assert (mean is None) == (cls is fnn.RMSNorm) and rstd.shape == (2, 3)
    with torch.no_grad():
        expected = fp8mp.cast_to_fp8(m(x), scale, cast_amax, "e4m3")
    assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8)) and amax.item() == cast_amax.item()


def test_modules_under_torch_compile():
    ln, rms = fnn.LayerNorm(32), fnn.RMSNorm(32, zero_centered_gamma=True)
    with torch.no_grad():
        ln.weight.normal_()
        rms.weight.normal_()
    loss = lambda x: rms(ln(x)).square().sum()  # noqa: E731
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    x1, x2 = torch.randn(4, 32, requires_grad=True), None
    x2 = x1.detach().clone().requires_grad_()
    compiled(x1).backward()
    loss(x2).backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=0)


def test_module_bad_inputs():
    with pytest.raises(ValueError, match="normalized_shape"):
        fnn.LayerNorm((4, 8))
    with pytest.raises(ValueError, match="normalized_shape"):
        fnn.RMSNorm([])
    with pytest.raises(ValueError, match="'input'.*last dimension 8"):
        fnn.LayerNorm(8)(torch.randn(3, 9))
    with pytest.raises(ValueError, match="'input'"):
        fnn.RMSNorm(8)(torch.randn(8, 3))
    with pytest.raises(RuntimeError, match="'x' must be float32, bfloat16 or float16"):
        fnn.LayerNorm(8)(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="'eps'"):
        fnn.LayerNorm(8, eps=0.0)(torch.randn(3, 8))
    with pytest.raises(ValueError, match="'eps'"):
        fnn.RMSNorm(8, eps=-1e-6)(torch.randn(3, 8))


# ---------------------------------------------------------------- bad op arguments


def test_op_bad_arguments_name_the_argument():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"'weight'.*normalized_shape \[6\] vs x's last dimension 8"):
        torch.ops.fp8mp.layernorm_fwd(x, torch.ones(6), None, 1e-5, False)
    with pytest.raises(ValueError, match=r"'bias'.*normalized_shape \[2, 4\] vs x's last dimension 8"):
        torch.ops.fp8mp.layernorm_fwd(x, None, torch.ones(2, 4), 1e-5, False)
    with pytest.raises(RuntimeError, match="'weight' and 'bias' must have the same dtype"):
        torch.ops.fp8mp.layernorm_fwd(x, torch.ones(8), torch.ones(8, dtype=torch.bfloat16), 1e-5, False)
    with pytest.raises(RuntimeError, match="'weight' must be float32"):
        torch.ops.fp8mp.rmsnorm_fwd(x, torch.ones(8, dtype=torch.float64), 1e-5, False)
    for eps in (0.0, -1.0, math.inf, math.nan, 1e-60):
        with pytest.raises(ValueError, match="'eps'"):
            torch.ops.fp8mp.rmsnorm_fwd(x, None, eps, False)
    with pytest.raises(RuntimeError, match="'x'"):
        torch.ops.fp8mp.layernorm_fwd(torch.ones(4, 8, dtype=torch.int32), None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'x'"):
        torch.ops.fp8mp.layernorm_fwd(torch.ones(()), None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'fmt'"):
        torch.ops.fp8mp.layernorm_fwd_fp8(x, None, None, 1e-5, False, torch.ones(1), torch.zeros(1), "e3m4")
    with pytest.raises(ValueError, match="'amax'"):
        torch.ops.fp8mp.rmsnorm_fwd_fp8(x, None, 1e-5, False, torch.ones(1), torch.zeros(2), "e4m3")
    with pytest.raises(RuntimeError, match="'scale'"):
        torch.ops.fp8mp.rmsnorm_fwd_fp8(x, None, 1e-5, False, torch.ones(1, dtype=torch.float64), torch.zeros(1), "e4m3")
    _, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'grad_out'"):
        torch.ops.fp8mp.layernorm_bwd(torch.randn(4, 7), x, mean, rstd, None, False)
    with pytest.raises(RuntimeError, match="'grad_out'"):
        torch.ops.fp8mp.layernorm_bwd(x.half(), x, mean, rstd, None, False)
    with pytest.raises(ValueError, match="'mean'"):
        torch.ops.fp8mp.layernorm_bwd(x, x, mean[:3], rstd, None, False)
    with pytest.raises(RuntimeError, match="'rstd'"):
        torch.ops.fp8mp.rmsnorm_bwd(x, x, rstd.double(), None, False)


# ---------------------------------------------------------------- CUDA vs CPU

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 1000, 1025, 4096, 8192])
def test_cuda_forward_matches_cpu(hidden, dtype):
    w, b = make_params(hidden, "affine")
    for kind in ("random", "large"):
        x = make_rows(kind, (67, hidden), dtype, seed=hidden)
        out_c, mean_c, rstd_c = torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, False)
        out_g, mean_g, rstd_g = torch.ops.fp8mp.layernorm_fwd(x.cuda(), w.cuda(), b.cuda(), 1e-5, False)
        rstd64 = 1 / (x.double().var(-1, unbiased=False) + 1e-5).sqrt()
        check_forward(out_g.cpu(), out_c.double(), out_c.float(), x, rstd64, w.double(), dtype)
        torch.testing.assert_close(rstd_g.cpu(), rstd_c, rtol=1e-5, atol=0)
        torch.testing.assert_close(mean_g.cpu(), mean_c, rtol=2 * EPS32, atol=1e-6)
        r_out_c, r_rstd_c = torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, True)
        r_out_g, r_rstd_g = torch.ops.fp8mp.rmsnorm_fwd(x.cuda(), w.cuda(), 1e-6, True)
        torch.testing.assert_close(r_rstd_g.cpu(), r_rstd_c, rtol=1e-5, atol=0)
        check_forward(r_out_g.cpu(), r_out_c.double(), r_out_c.float(), x, r_rstd_c.double(), w.double() + 1, dtype)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("hidden", [7, 1000, 4096])
def test_cuda_fp8_output_is_cast_of_cuda_output(hidden, fmt):
    x = make_rows("random", (129, hidden), torch.bfloat16, seed=1).cuda()
    w, b = (p.cuda() for p in make_params(hidden, "affine"))
    x[5, 3] = 1e4  # a large amax
    scale = torch.tensor([3.0], device="cuda")
    for norm in ("layernorm", "rmsnorm"):
        amax, cast_amax = torch.full((1,), 7.0, device="cuda"), torch.zeros(1, device="cuda")
        if norm == "layernorm":
            out = torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, False)[0]
            y = torch.ops.fp8mp.layernorm_fwd_fp8(x, w, b, 1e-5, False, scale, amax, fmt)[0]
        else:
            out = torch.ops.fp8mp.rmsnorm_fwd(x, w, 1e-6, False)[0]
            y = torch.ops.fp8mp.rmsnorm_fwd_fp8(x, w, 1e-6, False, scale, amax, fmt)[0]
        expected = fp8mp.cast_to_fp8(out, scale, cast_amax, fmt)
        assert torch.equal(y.view(torch.uint8), expected.view(torch.uint8))
        assert torch.equal(y.cpu().view(torch.uint8), torch_reference_bits(out.cpu(), 3.0, fmt))
        assert amax.item() == cast_amax.item() == out.float().abs().max().item()


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("hidden", [7, 64, 1000, 4096])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_cuda_backward_matches_torch_and_is_deterministic(norm, hidden):
    x = make_rows("random", (301, hidden), torch.float32, seed=2)
    go = make_rows("random", (301, hidden), torch.float32, seed=3)
    w, b = make_params(hidden, "affine")
    if norm == "rmsnorm":
        b = None
    ref = torch_grads(x, w, b, go, hidden, False, norm, 1e-5)
    cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    ours = ours_grads(cuda(x), cuda(w), cuda(b), cuda(go), False, norm, 1e-5)
    again = ours_grads(cuda(x), cuda(w), cuda(b), cuda(go), False, norm, 1e-5)
    for name, o, a, r in zip(("x", "weight", "bias"), ours, again, ref):
        if r is not None:
            assert_grad_close(o.cpu(), r, f"grad {name}", 2e-5)
            assert torch.equal(o, a), f"grad {name} not deterministic"


@needs_cuda
@pytest.mark.cuda
def test_cuda_opcheck_and_device_errors():
    x = torch.randn(16, 64, device="cuda")
    w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    torch.library.opcheck(torch.ops.fp8mp.layernorm_fwd.default, (x, w, b, 1e-5, False))
    torch.library.opcheck(torch.ops.fp8mp.rmsnorm_fwd_fp8.default, (x, w, 1e-6, False, torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), "e4m3"))
    _, mean, rstd = torch.ops.fp8mp.layernorm_fwd(x, w, b, 1e-5, False)
    torch.library.opcheck(torch.ops.fp8mp.layernorm_bwd.default, (torch.randn_like(x), x, mean, rstd, w, False))
    with pytest.raises(RuntimeError, match="'weight' must be on the input's device"):
        torch.ops.fp8mp.layernorm_fwd(x, torch.ones(64), None, 1e-5, False)
    with pytest.raises(RuntimeError, match="'rstd' must be on the input's device"):
        torch.ops.fp8mp.rmsnorm_bwd(x, x, rstd.cpu(), None, False)
