"""fp8mp LayerNorm / RMSNorm backward ops against torch in float64; opcheck and bad arguments of every norm op."""
from __future__ import annotations

import math

import pytest
import torch

from fp8mp.ops.errors import raising_value_errors

from opcheck_util import opcheck_fp8_aware
from norm_reference import (backward_case_params, MANTISSA_BITS, BACKWARD_CASES, HIDDEN, assert_grad_close, make_params, make_rows, ours_grads, torch_grads)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("norm,case", BACKWARD_CASES)
def test_backward_matches_torch_float64(norm, case, hidden):
    shape = (37, hidden) if hidden < 1000 else (3, 5, hidden)
    x = make_rows("random", shape, torch.float32, seed=hidden)
    go = make_rows("random", shape, torch.float32, seed=hidden + 7)
    w, b = backward_case_params(hidden, norm, case)
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


# ---------------------------------------------------------------- bad op arguments


def _op(name):
    return raising_value_errors(getattr(torch.ops.fp8mp, name))


def test_op_bad_arguments_name_the_argument():
    # Through fp8mp's error contract (fp8mp/ops/errors.py): shape and value errors are ValueError.
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"'weight'.*normalized_shape \[6\] vs x's last dimension 8"):
        _op("layernorm_fwd")(x, torch.ones(6), None, 1e-5, False)
    with pytest.raises(ValueError, match=r"'bias'.*normalized_shape \[2, 4\] vs x's last dimension 8"):
        _op("layernorm_fwd")(x, None, torch.ones(2, 4), 1e-5, False)
    with pytest.raises(RuntimeError, match="'weight' and 'bias' must have the same dtype"):
        _op("layernorm_fwd")(x, torch.ones(8), torch.ones(8, dtype=torch.bfloat16), 1e-5, False)
    with pytest.raises(RuntimeError, match="'weight' must be float32"):
        _op("rmsnorm_fwd")(x, torch.ones(8, dtype=torch.float64), 1e-5, False)
    for eps in (0.0, -1.0, math.inf, math.nan, 1e-60):
        with pytest.raises(ValueError, match="'eps'"):
            _op("rmsnorm_fwd")(x, None, eps, False)
    with pytest.raises(RuntimeError, match="'x'"):
        _op("layernorm_fwd")(torch.ones(4, 8, dtype=torch.int32), None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'x'"):
        _op("layernorm_fwd")(torch.ones(()), None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'fmt'"):
        _op("layernorm_fwd_fp8")(x, None, None, 1e-5, False, torch.ones(1), torch.zeros(1), "e3m4")
    with pytest.raises(ValueError, match="'amax'"):
        _op("rmsnorm_fwd_fp8")(x, None, 1e-5, False, torch.ones(1), torch.zeros(2), "e4m3")
    with pytest.raises(RuntimeError, match="'scale'"):
        _op("rmsnorm_fwd_fp8")(x, None, 1e-5, False, torch.ones(1, dtype=torch.float64), torch.zeros(1), "e4m3")
    _, mean, rstd = _op("layernorm_fwd")(x, None, None, 1e-5, False)
    with pytest.raises(ValueError, match="'grad_out'"):
        _op("layernorm_bwd")(torch.randn(4, 7), x, mean, rstd, None, False)
    with pytest.raises(RuntimeError, match="'grad_out'"):
        _op("layernorm_bwd")(x.half(), x, mean, rstd, None, False)
    with pytest.raises(ValueError, match="'mean'"):
        _op("layernorm_bwd")(x, x, mean[:3], rstd, None, False)
    with pytest.raises(RuntimeError, match="'rstd'"):
        _op("rmsnorm_bwd")(x, x, rstd.double(), None, False)
