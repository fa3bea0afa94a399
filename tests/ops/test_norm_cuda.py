"""fp8mp norm ops: CUDA against CPU and torch."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8_reference import torch_reference_bits
from norm_reference import (backward_case_params, BACKWARD_CASES, DTYPES, EPS32, FORMATS, MANTISSA_BITS, assert_grad_close, check_forward,
                            make_params, make_rows, ours_grads, torch_grads)


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


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("norm,case", BACKWARD_CASES)
def test_cuda_backward_every_case_and_dtype_matches_torch_float64(norm, case, dtype):
    """The CUDA backward kernels' instantiations the fp32 test above does not reach: bf16 / fp16 x, dy and weight,
    zero_centered_gamma, no weight (RMSNorm and LayerNorm), no bias, bias only. Against torch's float64 autograd,
    to the bound the CPU kernels are held to (tests/ops/test_norm_backward.py): both devices sum in fp32, so the
    error is fp32's over the row (2e-5 of the largest gradient or summed term) or the output's rounding
    (2^-mantissa bits of a 16-bit type)."""
    hidden = 1000  # not a multiple of the kernels' vector width: the tails too
    x = make_rows("random", (67, hidden), torch.float32, seed=hidden).to(dtype)
    go = make_rows("random", (67, hidden), torch.float32, seed=hidden + 7).to(dtype)
    w, b = backward_case_params(hidden, norm, case, dtype)
    zc = case == "zero_centered"
    ref = torch_grads(x, w, b, go, hidden, zc, norm, 1e-5)
    cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    ours = ours_grads(cuda(x), cuda(w), cuda(b), cuda(go), zc, norm, 1e-5)
    g = torch.ones(hidden) if w is None else (w.double() + 1 if zc else w.double())
    x64 = x.double()
    rstd64 = 1 / ((x64.var(-1, unbiased=False) if norm == "layernorm" else x64.square().mean(-1)) + 1e-5).sqrt()
    term = (go.double().abs() * g.abs() * rstd64.unsqueeze(-1)).max().item()
    rel = 2e-5 if dtype == torch.float32 else 2.0 ** -MANTISSA_BITS[dtype]
    for name, o, r in zip(("x", "weight", "bias"), ours, ref):
        if r is not None:
            assert o is not None and o.is_cuda and o.dtype == dtype, name
            assert_grad_close(o.cpu(), r, f"grad {name}", rel, term if name == "x" else 0.0)
