"""fp8mp.LossScaler: skipped steps leave weights and optimizer state untouched, scale dynamics, checkpoints."""
from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8mp
from fp8mp.training.loss_scaler import LossScaler

OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
}


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def backward(model, scaler, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()


def snapshot(model, optimizer) -> tuple[dict, dict]:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


def assert_same_state(before, after) -> None:
    (w0, s0), (w1, s1) = before, after
    for key in w0:
        assert torch.equal(w0[key], w1[key]), key
    assert s0["param_groups"] == s1["param_groups"]
    assert s0["state"].keys() == s1["state"].keys()
    for index, per_param in s0["state"].items():
        for name, value in per_param.items():
            other = s1["state"][index][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (index, name)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("call_unscale_first", [False, True])
def test_non_finite_gradient_skips_step(bad, opt_name, call_unscale_first):
    model = make_model()
    optimizer = OPTIMIZERS[opt_name](model.parameters())
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    for step in range(2):  # a clean step first, so the optimizer has state that must not change
        optimizer.zero_grad()
        backward(model, scaler, seed=step)
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad()
    backward(model, scaler, seed=5)
    model[2].weight.grad[1, 3] = bad  # one bad element in the last parameter
    before = snapshot(model, optimizer)
    if call_unscale_first:
        scaler.unscale_(optimizer)
    assert scaler.step(optimizer) is None
    scaler.update()
    assert_same_state(before, snapshot(model, optimizer))
    assert scaler.get_scale() == 512.0
    assert scaler.num_skipped_steps == 1 and scaler.num_steps == 3
    assert scaler.get_growth_tracker() == 0


def test_bad_gradient_in_any_group_and_dtype_is_seen():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4))
    b = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
    c = torch.nn.Parameter(torch.randn(3))
    optimizer = torch.optim.SGD([{"params": [a, b]}, {"params": [c], "lr": 0.5}], lr=0.1)
    scaler = LossScaler()
    for victim in (a, b, c):
        for p in (a, b, c):
            p.grad = torch.ones_like(p)
        victim.grad[0] = float("nan")
        before = [p.detach().clone() for p in (a, b, c)]
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        assert all(torch.equal(p0, p) for p0, p in zip(before, (a, b, c)))
        assert scaler.get_scale() == scale / 2


def test_clean_steps_match_unscaled_training_and_grow_after_interval():
    model, reference = make_model(), make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    scaler = LossScaler(init_scale=256.0, growth_interval=3)
    scales = []
    for step in range(7):
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
        backward(model, scaler, seed=step)
        backward(reference, LossScaler(enabled=False), seed=step)
        scaler.unscale_(optimizer)
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)  # scale is a power of two
        scaler.step(optimizer)
        ref_optimizer.step()
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [256.0, 256.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]
    assert scaler.num_skipped_steps == 0 and scaler.num_steps == 7
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_backoff_stops_at_min_scale():
    scaler = LossScaler(init_scale=4.0, min_scale=1.5)
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    for expected in (2.0, 1.5, 1.5):
        param.grad = torch.tensor([float("inf"), 0.0])
        scaler.step(optimizer)
        scaler.update()
        assert scaler.get_scale() == expected
    assert torch.equal(param, torch.zeros(2))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.integers(1, 4))
def test_scale_follows_the_rule_for_any_overflow_pattern(overflows, interval):
    scaler = LossScaler(init_scale=2.0 ** 10, growth_interval=interval, min_scale=2.0 ** 6)
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=1.0)
    expected, clean_run, updates = 2.0 ** 10, 0, 0
    for overflow in overflows:
        param.grad = torch.tensor([float("nan") if overflow else 1.0, 1.0, 1.0]) * scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if overflow:
            expected, clean_run = max(expected / 2, 2.0 ** 6), 0
        else:
            clean_run, updates = clean_run + 1, updates + 1
            if clean_run == interval:
                expected, clean_run = expected * 2, 0
        assert scaler.get_scale() == expected
    assert scaler.num_skipped_steps == sum(overflows)
    assert torch.equal(param, torch.full((3,), -float(updates)))  # every clean step moved by the true grad 1


def test_state_dict_round_trip():
    scaler = LossScaler(init_scale=64.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=2, min_scale=2.0)
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    for bad in (False, True, False):
        param.grad = torch.tensor([float("inf") if bad else 1.0])
        scaler.step(optimizer)
        scaler.update()
    state = scaler.state_dict()
    restored = LossScaler()
    restored.load_state_dict(copy.deepcopy(state))
    assert restored.state_dict() == state
    assert (restored.get_scale(), restored.get_growth_tracker()) == (16.0, 1)
    assert (restored.num_steps, restored.num_skipped_steps) == (3, 1)
    for s in (scaler, restored):  # both grow on the next clean step, by the saved factor
        param.grad = torch.ones(1)
        s.step(optimizer)
        s.update()
        assert s.get_scale() == 64.0
    with pytest.raises(ValueError, match="growth_tracker"):
        LossScaler().load_state_dict({k: v for k, v in state.items() if k != "growth_tracker"})


def test_scale_multiplies_loss_and_disabled_is_pass_through():
    loss = torch.tensor(3.0, dtype=torch.bfloat16)
    assert LossScaler(init_scale=8.0).scale(loss).item() == 24.0
    disabled = LossScaler(enabled=False)
    assert disabled.scale(loss) is loss and disabled.get_scale() == 1.0 and disabled.state_dict() == {}
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.ones(1)
    disabled.step(torch.optim.SGD([param], lr=1.0))
    disabled.update()
    assert param.item() == -1.0


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(init_scale=0.0), "init_scale"),
        (dict(init_scale=float("inf")), "init_scale"),
        (dict(init_scale="8"), "init_scale"),
        (dict(growth_factor=1.0), "growth_factor"),
        (dict(backoff_factor=1.0), "backoff_factor"),
        (dict(backoff_factor=0.0), "backoff_factor"),
        (dict(growth_interval=0), "growth_interval"),
        (dict(growth_interval=2.5), "growth_interval"),
        (dict(min_scale=-1.0), "min_scale"),
        (dict(min_scale=10.0, init_scale=8.0), "min_scale"),
        (dict(enabled=1), "enabled"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"'{name}'"):
        LossScaler(**kwargs)


def test_misuse_raises_clear_errors():
    scaler = LossScaler()
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.ones(1)
    optimizer = torch.optim.SGD([param], lr=1.0)
    with pytest.raises(RuntimeError, match="update"):
        scaler.update()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.step(optimizer)
    scaler.update()
    with pytest.raises(RuntimeError, match="'closure'"):
        scaler.step(optimizer, closure=lambda: 0.0)
    with pytest.raises(TypeError, match="'loss'"):
        scaler.scale(1.0)
    with pytest.raises(TypeError, match="'optimizer'"):
        scaler.unscale_(object())


def test_fp8_training_step_with_scaler():
    torch.manual_seed(0)
    model = torch.nn.Sequential(fp8mp.nn.Linear(16, 32), torch.nn.GELU(), fp8mp.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = fp8mp.LossScaler(init_scale=2.0 ** 12)
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        with fp8mp.fp8_autocast():
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert scaler.num_skipped_steps == 0
    assert losses[-1] < 0.8 * losses[0]
