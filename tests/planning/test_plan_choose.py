"""The choice rule on evidence written by hand, and the rank correlation written without scipy."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fp8mp.planning.choose import LayerOptions, choose
from fp8mp.planning.sensitivity import spearman

CANDIDATES = ["delayed", "rowwise", "mxfp8"]
FAST = {"bf16": 2.0, "delayed": 1.0, "rowwise": 1.3, "mxfp8": 1.5}


def layer(name, delayed, rowwise, mxfp8, times=FAST):
    return LayerOptions(name, {"delayed": delayed, "rowwise": rowwise, "mxfp8": mxfp8}, dict(times))


def test_without_budget_each_layer_takes_its_fastest_candidate():
    choices = choose([layer("a", 1.0, 0.1, 0.0), layer("b", 0.0, 0.0, 0.0)], CANDIDATES, budget=None)
    assert [c for c, _ in choices] == ["delayed", "delayed"]
    assert "fastest FP8 candidate, 2.00x" in choices[0][1]


def test_the_worst_offender_moves_to_its_next_less_sensitive_candidate():
    layers = [layer("a", 0.010, 0.008, 0.001), layer("b", 0.002, 0.001, 0.001), layer("c", 0.001, 0.001, 0.001)]
    choices = choose(layers, CANDIDATES, budget=0.005)
    assert [c for c, _ in choices] == ["mxfp8", "delayed", "delayed"]  # a: delayed -> rowwise -> mxfp8 (0.004 total)
    assert choices[0][1].startswith("over budget: delayed (0.01), rowwise (0.008)")


def test_a_budget_no_fp8_candidate_meets_keeps_layers_in_bf16():
    choices = choose([layer("a", 0.01, 0.01, 0.01)], CANDIDATES, budget=0.0)
    assert choices == [("bf16", "over budget: delayed (0.01); no FP8 candidate fits the budget")]


def test_fp8_slower_than_bf16_stays_bf16_unless_memory_first():
    slow = {"bf16": 1.0, "delayed": 1.5, "rowwise": 2.0, "mxfp8": 1.2}
    assert choose([layer("a", 0, 0, 0, slow)], CANDIDATES, None)[0] == (
        "bf16", "FP8 slower than bf16 on this device (fastest: mxfp8, 0.83x bf16's speed)")
    assert choose([layer("a", 0, 0, 0, slow)], CANDIDATES, None, memory_first=True)[0][0] == "mxfp8"


def test_near_equal_times_keep_the_candidates_order():
    times = {"bf16": 2.0, "delayed": 1.05, "rowwise": 1.0, "mxfp8": 1.5}  # within 10%: delayed comes first
    assert choose([layer("a", 0, 0, 0, times)], CANDIDATES, None)[0][0] == "delayed"


def test_a_candidate_without_a_finite_sensitivity_is_no_option():
    assert choose([layer("a", math.nan, 0.0, 0.0)], CANDIDATES, None)[0][0] == "rowwise"


def test_spearman_against_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ties share their mean rank: ranks (0.5, 0.5, 2, 3) against (0, 1, 2, 3).
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(np.corrcoef([0.5, 0.5, 2, 3], [0, 1, 2, 3])[0, 1])
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2], [1, 2]))
    with pytest.raises(ValueError, match="'a' and 'b'"):
        spearman([1, 2, 3], [1, 2])
