"""fp8mp.nn.GroupedLinear against a float64 per-expert reference, with a bound derived from the formats."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.nn import Fp8Module, GroupedLinear
from fp8mp.recipe import CurrentScaling, DelayedScaling
from fp8mp.training import fp8_cast_check
from fp8mp.training.fallback import FallbackPolicy

# (unit roundoff, half the smallest subnormal, largest finite) of the formats, from the OCP FP8 spec
FORMATS = {"e4m3": (2.0 ** -4, 2.0 ** -10, 448.0), "e5m2": (2.0 ** -3, 2.0 ** -17, 57344.0)}
SPLITS = [0, 5, 0, 11, 1, 0]  # empty first, middle and last groups


def cast_error(t64: torch.Tensor, amax: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(relative, absolute) bound of a current-scaled cast of t64: |q - t| <= u|t| + eta / scale per element.
    The scale fp8_max / amax and its reciprocal are fp32 roundings: 2^-22 relative covers them."""
    u, eta, fp8_max = FORMATS[fmt]
    scale = fp8_max / amax if amax > 0 else 1.0
    return torch.full_like(t64, u + 2.0 ** -22), torch.full_like(t64, eta / scale)


def product_bound(a64, rel_a, abs_a, b64, rel_b, abs_b, k: int) -> torch.Tensor:
    """Bound on |qa @ qb.T - a @ b.T| for casts within (rel, abs) of a [M, K], b [N, K], fp32 accumulation."""
    ea = rel_a * a64.abs() + abs_a
    eb = rel_b * b64.abs() + abs_b
    qa, qb = a64.abs() + ea, b64.abs() + eb
    return ea @ qb.T + a64.abs() @ eb.T + k * 2.0 ** -24 * (qa @ qb.T)


def groups(sizes):
    start = 0
    for g, size in enumerate(sizes):
        yield g, slice(start, start + size)
        start += size


def make(splits=SPLITS, in_f=32, out_f=48, bias=True, seed=0):
    torch.manual_seed(seed)
    module = GroupedLinear(len(splits), in_f, out_f, bias=bias)
    x = (torch.randn(sum(splits), in_f) * 3).requires_grad_()
    return module, x


def test_outside_fp8_is_a_per_expert_torch_linear_loop_exactly():
    for dtype in (torch.float32, torch.bfloat16):
        module, x = make()
        module.to(dtype)
        x = x.detach().to(dtype)
        want = torch.cat([F.linear(x[rows], module.weight[g], module.bias[g]) for g, rows in groups(SPLITS)])
        assert torch.equal(module(x, SPLITS), want)
        assert torch.equal(module(x, torch.tensor(SPLITS)), want)
        assert torch.equal(module(x, offs=torch.tensor(SPLITS).cumsum(0).int()), want)


@pytest.mark.parametrize("recipe", [CurrentScaling(), DelayedScaling()], ids=["current", "delayed"])
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_forward_and_backward_within_the_derived_bound_of_an_fp64_reference(recipe, bias):
    module, x = make(bias=bias)
    grad_out = torch.randn(sum(SPLITS), module.out_features, dtype=torch.float64)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = module(x, SPLITS)
    out.backward(grad_out.float())
    x64, w64, g64 = x.detach().double(), module.weight.detach().double(), grad_out
    rel_x, abs_x = cast_error(x64, x64.abs().max(), "e4m3")
    rel_g, abs_g = cast_error(g64, g64.abs().max(), "e5m2")
    k, n = module.in_features, module.out_features
    for g, rows in groups(SPLITS):
        rel_w, abs_w = cast_error(w64[g], w64[g].abs().max(), "e4m3")
        want = x64[rows] @ w64[g].T + (module.bias.detach()[g].double() if bias else 0)
        tol = product_bound(x64[rows], rel_x[rows], abs_x[rows], w64[g], rel_w, abs_w, k) + 2.0 ** -24 * want.abs()
        assert ((out[rows].double() - want).abs() <= tol).all(), f"forward, group {g}"
        want_dx = g64[rows] @ w64[g]
        tol_dx = product_bound(g64[rows], rel_g[rows], abs_g[rows], w64[g].T, rel_w.T, abs_w.T, n) + 2.0 ** -24 * want_dx.abs()
        assert ((x.grad[rows].double() - want_dx).abs() <= tol_dx).all(), f"dgrad, group {g}"
        want_dw = g64[rows].T @ x64[rows]
        tol_dw = (product_bound(g64[rows].T, rel_g[rows].T, abs_g[rows].T, x64[rows].T, rel_x[rows].T, abs_x[rows].T,
                                rows.stop - rows.start) + 2.0 ** -24 * want_dw.abs())
        assert ((module.weight.grad[g].double() - want_dw).abs() <= tol_dw).all(), f"wgrad, group {g}"
        if bias:  # fp32 sums of the exact gradient rows
            want_db = g64[rows].float().double().sum(0)
            assert torch.allclose(module.bias.grad[g].double(), want_db, rtol=1e-6, atol=1e-6)
    assert (out[: sum(SPLITS)] != 0).any() and module.weight.grad[0].abs().sum() == 0  # an empty group gets dW = 0


def test_an_fp8_error_bound_that_fails_when_the_weights_are_not_cast_per_expert():
    # One expert 1000x larger than the others: a single weight scale would flush the small experts' weights.
    module, x = make(splits=[4, 4], bias=False)
    with torch.no_grad():
        module.weight[0] *= 1000
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        out = module(x.detach(), [4, 4])
    want = x.detach().double()[4:] @ module.weight.detach().double()[1].T
    assert torch.allclose(out[4:].double(), want, rtol=0.15, atol=0.05 * want.abs().max().item())


def test_delayed_scaling_casts_the_tokens_with_the_scale_of_the_history():
    module, x = make(bias=False)
    x = x.detach()
    recipe = DelayedScaling(amax_history_len=4)
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        first = module(x, SPLITS)
        second = module(x, SPLITS)
        module(x * 4, SPLITS)
    assert torch.equal(first, second)  # the history holds amax(x): the same scale as from the data
    assert module.fp8_meta.scale[0].item() == pytest.approx(448.0 / x.abs().max().item(), rel=1e-6)
    assert module.fp8_meta.amax_history[:, 0].max().item() == x.abs().max().item()
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        current = GroupedLinear(len(SPLITS), 32, 48, bias=False)
        current.load_state_dict({"weight": module.weight}, strict=False)
        assert torch.equal(current(x, SPLITS), first)


def test_all_rows_in_one_group_and_no_rows_at_all():
    module, _ = make(splits=[0, 0, 7])
    x = torch.randn(7, 32)
    with fp8mp.fp8_autocast():
        assert module(x, [0, 0, 7]).shape == (7, 48)
        empty = module(torch.zeros(0, 32, requires_grad=True), [0, 0, 0])
    assert empty.shape == (0, 48)
    empty.sum().backward()
    assert module.weight.grad.abs().sum() == 0


def test_leading_dimensions_are_flattened():
    module, _ = make(splits=[3, 3])
    x = torch.randn(2, 3, 32)
    assert torch.equal(module(x, [3, 3]), module(x.reshape(6, 32), [3, 3]).reshape(2, 3, 48))


@pytest.mark.parametrize("args, match", [
    (([1, 2, 3, 4, 5, 6],), "'m_splits' must sum to the input's row count 17"),
    (([5, -1, 0, 11, 2, 0],), "'m_splits' must hold row counts >= 0, got -1 at index 1"),
    (([5, 12],), "'m_splits' must have num_gemms = 6 entries, got 2"),
    (([5.0, 0, 0, 11, 1, 0],), "'m_splits' must be a sequence of ints"),
    ((torch.tensor([5.0, 0, 0, 11, 1, 0]),), "'m_splits' must be a 1-D integer tensor"),
    ((), "exactly one of the arguments 'm_splits'"),
])
def test_bad_m_splits_are_refused_naming_the_argument(args, match):
    module, x = make()
    for fp8 in (False, True):
        with pytest.raises(ValueError, match=match), fp8mp.fp8_autocast(enabled=fp8):
            module(x, *args)


@pytest.mark.parametrize("offs, match", [
    ([5, 0, 16, 16, 17, 17], "'offs' must be non-decreasing"),
    ([0, 5, 5, 16, 17, 18], "'offs' must end at the input's row count 17"),
])
def test_bad_offs_are_refused_naming_the_argument(offs, match):
    module, x = make()
    with pytest.raises(ValueError, match=match):
        module(x, offs=torch.tensor(offs, dtype=torch.int32))
    with pytest.raises(ValueError, match="exactly one"):
        module(x, SPLITS, offs=torch.tensor(offs, dtype=torch.int32))


def test_dimensions_not_multiples_of_16_are_refused_in_fp8_only():
    module = GroupedLinear(2, 24, 32)
    x = torch.randn(4, 24)
    module(x, [2, 2])
    with pytest.raises(ValueError, match="in_features must be a multiple of 16"), fp8mp.fp8_autocast():
        module(x, [2, 2])


def test_state_dict_is_plain_tensors_and_round_trips():
    module, x = make()
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
        module(x, SPLITS).sum().backward()
    state = module.state_dict()
    assert {"weight", "bias"} <= set(state) and all(type(v) is torch.Tensor for v in state.values())
    assert state["weight"].shape == (6, 48, 32) and state["bias"].shape == (6, 48)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = GroupedLinear(6, 32, 48)
    loaded.load_state_dict(torch.load(buffer, weights_only=True))
    with fp8mp.fp8_autocast(fp8_recipe=DelayedScaling()):
        assert torch.equal(loaded(x.detach(), SPLITS), module(x.detach(), SPLITS))


def test_fp8mp_training_finds_it_monitor_fallback_and_the_nonfinite_check():
    module, x = make()
    model = torch.nn.ModuleDict({"experts": module})
    assert isinstance(module, Fp8Module)
    monitor = fp8mp.monitor.attach(model)
    fp8_cast_check.forget()
    bad = x.detach().clone()
    bad[3, 0] = float("nan")
    with fp8mp.fp8_autocast():
        module(bad, SPLITS).sum().backward()
    rows = monitor.record_step()
    assert [row.layer for row in rows] == ["experts"]
    pending = fp8_cast_check.gather()
    flags = pending.findings(pending.flags.tolist())
    assert [f.module for f in flags] == [module] and "input" in flags[0].tensors
    policy = FallbackPolicy(max_bad_steps=1)
    policy.step(model)
    assert module.fp8_fallback and policy.layers_in_fallback(model) == ["experts"]
    with fp8mp.fp8_autocast():  # in fallback: the per-expert loop in the input's dtype
        out = module(x.detach(), SPLITS)
    assert torch.equal(out, module.__class__._per_group_linear(x.detach(), SPLITS, module.weight, module.bias))


def test_bad_inputs_are_refused_naming_inp():
    module, x = make()
    with pytest.raises(ValueError, match="'inp' must have last dimension 32"):
        module(x[:, :-1], SPLITS)
    with pytest.raises(TypeError, match="'inp' must be float32"), fp8mp.fp8_autocast():
        module(x.detach().to(torch.int64), SPLITS)


def test_transformer_engine_per_gemm_checkpoints_load_stacked():
    module, x = make(splits=[2, 3])
    te_style = {f"weight{g}": module.weight.detach()[g].clone() for g in range(2)}
    te_style.update({f"bias{g}": module.bias.detach()[g].clone() for g in range(2)})
    loaded = GroupedLinear(2, 32, 48)
    loaded.load_state_dict(te_style)  # strict; no fp8_meta.* keys: the scaling state starts fresh
    assert torch.equal(loaded.weight, module.weight) and torch.equal(loaded.bias, module.bias)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        GroupedLinear(3, 32, 48).load_state_dict(te_style)  # 2 per-GEMM weights do not make 3 experts


def test_unconvert_keeps_it():
    model = torch.nn.Sequential(GroupedLinear(2, 32, 16), torch.nn.Linear(16, 16))
    fp8mp.nn.convert(model)
    fp8mp.nn.unconvert(model)
    assert isinstance(model[0], GroupedLinear) and type(model[1]) is torch.nn.Linear


def test_bf16_parameters_and_torch_autocast_give_the_dtypes_of_torch_linear():
    module, x = make(bias=True)
    with fp8mp.fp8_autocast():
        want = module(x.detach(), SPLITS)
    module_bf16 = GroupedLinear(len(SPLITS), 32, 48).bfloat16()
    module_bf16.load_state_dict(module.state_dict())
    xb = x.detach().bfloat16().requires_grad_()
    with fp8mp.fp8_autocast():
        out = module_bf16(xb, SPLITS)
    out.float().sum().backward()
    assert out.dtype == xb.grad.dtype == module_bf16.weight.grad.dtype == torch.bfloat16
    # bf16 rounding of x and W before their E4M3 casts moves a code by at most one E4M3 step (2^-3 relative)
    assert torch.allclose(out.float(), want, rtol=0.25, atol=0.05 * want.abs().max().item())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module(x.detach(), SPLITS).dtype == torch.bfloat16  # outside FP8: torch's own autocast of F.linear
        with fp8mp.fp8_autocast():
            assert module(x.detach(), SPLITS).dtype == torch.bfloat16  # in FP8: autocast's dtype, as Linear's
