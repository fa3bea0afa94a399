"""fp8mp::update_amax_history_and_scale and compute_scale, checked exactly against a plain-torch reference."""
from __future__ import annotations

import math

import pytest
import torch

import fp8mp
from fp8mp.ops.format import FP8_MAX, fp8_max_of
from fp8mp.ops.scale_update import compute_scale
from scale_update_reference import (ALGOS, E4M3_MAX, E5M2_MAX, assert_same_bits, make_group, mixed_fp8_max,
                                    random_amax, reference_step)


# ---------------------------------------------------------------- the op vs the reference


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("margin", [0, 2])
@pytest.mark.parametrize("H", [1, 4, 1024])
@pytest.mark.parametrize("T", [1, 3, 17])
def test_matches_reference_over_random_steps(T, H, margin, algo):
    gen = torch.Generator().manual_seed(1000 * T + 10 * H + margin)
    fp8_max = mixed_fp8_max(gen, T)
    g = make_group(T, H)
    ref_history, ref_scale = g["amax_history"].clone(), g["scale"].clone()
    steps = 40 if H < 1024 else 12
    for step in range(steps):
        # Some steps without specials, so that scales do change.
        amax = random_amax(gen, T, specials=step % 3 != 0)
        fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"], fp8_max, margin, algo)
        ref_history, ref_scale, ref_scale_inv = reference_step(amax, ref_history, ref_scale, fp8_max, margin, algo)
        assert_same_bits(g["amax_history"], ref_history, f"history, step {step}")
        assert_same_bits(g["scale"], ref_scale, f"scale, step {step}")
        assert_same_bits(g["scale_inv"], ref_scale_inv, f"scale_inv, step {step}")
    assert not torch.equal(g["scale"], torch.ones(T))  # the scales did move


def test_history_rolls_row_by_row():
    T, H = 3, 4
    g = make_group(T, H)
    fp8_max = torch.full((T,), E4M3_MAX)
    for step in range(1, 7):
        amax = torch.tensor([step, 10.0 * step, 100.0 * step])
        fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"], fp8_max)
    # after step 6, row i holds step 6 - i
    expected = torch.tensor([[6.0 - i, 10.0 * (6 - i), 100.0 * (6 - i)] for i in range(H)])
    assert torch.equal(g["amax_history"], expected)
    assert torch.equal(g["scale"], torch.tensor([448.0 / 6, 448.0 / 60, 448.0 / 600], dtype=torch.float32))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("special", [0.0, math.nan, math.inf])
def test_zero_nan_inf_keep_previous_scale_and_are_recorded(algo, special):
    T, H = 3, 4
    g = make_group(T, H)
    fp8_max = torch.tensor([E4M3_MAX, E5M2_MAX, E4M3_MAX])
    # An all-zero history keeps the initial scale of 1.
    fp8mp.update_amax_history_and_scale(torch.zeros(T), g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
    assert torch.equal(g["scale"], torch.ones(T)) and torch.equal(g["scale_inv"], torch.ones(T))
    fp8mp.update_amax_history_and_scale(torch.tensor([2.0, 4.0, 8.0]), g["amax_history"], g["scale"], g["scale_inv"],
                                        fp8_max, 0, algo)
    good = torch.tensor([224.0, 14336.0, 56.0])
    assert torch.equal(g["scale"], good)
    amax = torch.tensor([special, 4.0, special])
    fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
    assert_same_bits(g["amax_history"][0], amax, "history records the special amax")
    # NaN/Inf (and 0 with "most_recent") keep the old scale; 0 with "max" leaves
    # the earlier amax as the window's max, which gives the same scale again.
    assert torch.equal(g["scale"], good)
    assert torch.equal(g["scale_inv"], torch.ones(T) / g["scale"])


@pytest.mark.parametrize("algo", ALGOS)
def test_nan_inf_never_become_a_scale_while_in_the_window(algo):
    T, H = 2, 3
    g = make_group(T, H)
    fp8_max = torch.full((T,), E4M3_MAX)
    fp8mp.update_amax_history_and_scale(torch.tensor([1.0, 1.0]), g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
    fp8mp.update_amax_history_and_scale(torch.tensor([math.nan, math.inf]), g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
    scales = []
    for _ in range(4):
        fp8mp.update_amax_history_and_scale(torch.tensor([2.0, 2.0]), g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
        scales.append(g["scale"].tolist())
        assert torch.equal(g["scale_inv"], torch.ones(T) / g["scale"])
    if algo == "max":
        # NaN/Inf stays in the 3-row window for two more steps: the scale stays 448/1.
        assert scales == [[448.0, 448.0], [448.0, 448.0], [224.0, 224.0], [224.0, 224.0]]
    else:
        assert scales == [[224.0, 224.0]] * 4


def test_tiny_amax_whose_scale_overflows_keeps_previous_scale():
    g = make_group(2, 1)
    fp8_max = torch.full((2,), E4M3_MAX)
    amax = torch.tensor([1e-45, 1e-3])  # 448 / 1e-45 overflows fp32
    fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, "most_recent")
    assert g["scale"][0].item() == 1.0
    assert g["scale"][1].item() == (torch.tensor(448.0) / torch.tensor(1e-3)).item()


def test_huge_margin_keeps_previous_scale():
    g = make_group(1, 1)
    fp8mp.update_amax_history_and_scale(torch.tensor([1.0]), g["amax_history"], g["scale"], g["scale_inv"],
                                        torch.tensor([E4M3_MAX]), 400, "max")
    assert g["scale"].item() == 1.0 and g["scale_inv"].item() == 1.0


def test_margin_divides_by_power_of_two():
    for margin in (0, 1, 2, 5):
        g = make_group(1, 1)
        fp8mp.update_amax_history_and_scale(torch.tensor([3.0]), g["amax_history"], g["scale"], g["scale_inv"],
                                            torch.tensor([E4M3_MAX]), margin)
        assert g["scale"].item() == (torch.tensor(448.0) / torch.tensor(3.0)).item() / 2**margin


def test_empty_group_is_a_no_op():
    g = make_group(0, 5)
    fp8mp.update_amax_history_and_scale(torch.zeros(0), g["amax_history"], g["scale"], g["scale_inv"], torch.zeros(0))
    assert g["amax_history"].shape == (5, 0)


# ---------------------------------------------------------------- convergence


@pytest.mark.parametrize("H", [1, 4, 16])
@pytest.mark.parametrize("spike_len", [1, 3])
@pytest.mark.parametrize("algo", ALGOS)
def test_delayed_scaling_follows_a_shifting_distribution(H, spike_len, algo):
    s, steps = 5, 40
    g = make_group(1, H)
    fp8_max = torch.tensor([E4M3_MAX])
    low, high = torch.tensor(E4M3_MAX) / torch.tensor(1.0), torch.tensor(E4M3_MAX) / torch.tensor(100.0)
    high_steps = []
    for step in range(steps):
        amax = torch.tensor([100.0 if s <= step < s + spike_len else 1.0])
        fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"], fp8_max, 0, algo)
        scale = g["scale"][0]
        assert scale == low or scale == high, (step, scale)
        if scale == high:
            high_steps.append(step)
    last_spike = s + spike_len - 1
    if algo == "max":
        # the spike dominates until it has left the H-row window: H steps after the last spike
        expected = list(range(s, last_spike + H))
    else:
        expected = list(range(s, last_spike + 1))
    assert high_steps == expected


# ---------------------------------------------------------------- current scaling helper


def test_compute_scale_matches_the_reference_with_most_recent():
    gen = torch.Generator().manual_seed(7)
    for margin in (0, 2):
        for fmt in ("e4m3", "e5m2"):
            amax = random_amax(gen, 64)
            previous = torch.rand(64, generator=gen) + 0.5
            _, expected, _ = reference_step(amax, torch.zeros(1, 64), previous, torch.full((64,), fp8_max_of(fmt)),
                                            margin, "most_recent")
            got = compute_scale(amax, fp8_max_of(fmt), margin, previous)
            assert_same_bits(got, expected, f"{fmt} margin {margin}")


def test_compute_scale_specials_and_exact_division():
    previous = torch.full((4,), 3.0)
    got = compute_scale(torch.tensor([0.0, math.nan, math.inf, 3.0]), 448.0, 0, previous)
    assert got[:3].tolist() == [3.0, 3.0, 3.0]
    assert got[3].item() == (torch.tensor(448.0) / torch.tensor(3.0)).item()  # one rounding, not 448 * (1/3)
    with pytest.raises(ValueError, match="margin"):
        compute_scale(torch.ones(1), 448.0, -1, torch.ones(1))


def test_compute_scale_under_torch_compile():
    amax = torch.tensor([0.0, 1.0, 3.0, 7e-3, math.inf, 1e-45, math.nan])
    previous = torch.full_like(amax, 2.0)
    compiled = torch.compile(compute_scale, fullgraph=True)
    for margin in (0, 2):
        assert_same_bits(compiled(amax, 448.0, margin, previous), compute_scale(amax, 448.0, margin, previous))


def test_fp8_max_of():
    assert fp8_max_of("e4m3") == 448.0 == FP8_MAX["e4m3"]
    assert fp8_max_of("E5M2") == 57344.0 == FP8_MAX["e5m2"]
    with pytest.raises(ValueError, match="'fmt'"):
        fp8_max_of("e3m4")
