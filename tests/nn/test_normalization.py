"""fp8mp.nn.LayerNorm / RMSNorm modules: state dicts, training like torch, FP8 output, compile, bad inputs."""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
import fp8mp.nn as fnn
from norm_reference import MANTISSA_BITS, DTYPES


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


BAD_EPS = [(True, TypeError), (False, TypeError), ("1e-5", TypeError), (torch.tensor(1e-5), TypeError),
           (math.inf, ValueError), (-math.inf, ValueError), (math.nan, ValueError), (0, ValueError), (-1e-6, ValueError),
           (1e-50, ValueError),  # 0 as a float32
           (1e39, ValueError)]   # Inf as a float32
EPS_MODULES = {"LayerNorm": lambda eps: fnn.LayerNorm(8, eps=eps), "RMSNorm": lambda eps: fnn.RMSNorm(8, eps=eps),
               "LayerNormLinear": lambda eps: fnn.LayerNormLinear(8, 4, eps=eps),
               "LayerNormLinear(RMSNorm)": lambda eps: fnn.LayerNormLinear(8, 4, eps=eps, normalization="RMSNorm")}


@pytest.mark.parametrize("module", EPS_MODULES)
@pytest.mark.parametrize(("eps", "error"), BAD_EPS, ids=[repr(e) for e, _ in BAD_EPS])
def test_a_bad_eps_is_refused_at_construction_naming_it(module, eps, error):
    with pytest.raises(error, match=f"{module.split('(')[0]}: argument 'eps' must be"):
        EPS_MODULES[module](eps)


@pytest.mark.parametrize("module", EPS_MODULES)
def test_a_good_eps_is_kept_as_a_float(module):
    import numpy as np

    for eps in (1, 1e-5, np.float32(1e-6), 1e-45):  # 1e-45: the smallest float32 subnormal, still > 0
        built = EPS_MODULES[module](eps)
        assert type(built.eps) is float and built.eps == float(eps)
    if module == "RMSNorm":
        assert fnn.RMSNorm(8, eps=None).eps is None  # torch's default: finfo(input.dtype).eps
