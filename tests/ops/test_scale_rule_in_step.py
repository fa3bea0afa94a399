"""The scale rule has one definition, csrc/scale_update/scale_rule.h: the delayed-scaling op and Python's
current scaling (fp8mp.ops.compute_scale, which calls the op) both use it. These tests hold it to the
formula bit for bit over every kind of fp32 amax, and hold the block rule (csrc/blockwise/block_scale_rule.h,
torchao's amax_to_scale, a division in double) to it where the two rules coincide."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp8mp.ops.blockwise import block_quantize
from fp8mp.ops.scale_update import compute_scale
from scale_update_reference import assert_same_bits, reference_step

FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def edge_amaxes() -> torch.Tensor:
    """Zeros, subnormals, the normal range's ends, amaxes whose scale overflows, Inf, NaNs of several payloads,
    negatives, and 20000 random bit patterns of positive floats."""
    special_bits = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x3F800000, 0x3F7FFFFF, 0x3F800001,
                    0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xBF800000]
    fixed = np.array(special_bits, dtype=np.uint32).view(np.float32)
    near_overflow = np.float32(448.0) / np.float32(3.4028235e38) * np.array([0.5, 0.999, 1.0, 1.001, 2.0], np.float32)
    random = np.random.default_rng(11).integers(0, 0x7F800000, 20000, dtype=np.uint32).view(np.float32)
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    return torch.from_numpy(np.concatenate([fixed, near_overflow, random, powers]).astype(np.float32))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("margin", [0, 1, 5, 127, 128, 1000])
def test_compute_scale_is_the_formula_bit_for_bit(fmt, margin):
    amax = edge_amaxes()
    previous = torch.full_like(amax, 0.75)
    _, expected, _ = reference_step(amax, torch.zeros(1, amax.numel()), previous, torch.full_like(amax, FP8_MAX[fmt]),
                                    margin, "most_recent")
    assert_same_bits(compute_scale(amax, FP8_MAX[fmt], margin, previous), expected, f"{fmt} margin {margin}")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_block_rule_gives_the_per_tensor_scale_where_both_apply(fmt):
    """Block "fp32" scales are float(fp8_max / max(amax, 1e-12)) in double: for a finite amax >= 1e-12 and
    no margin that is the per-tensor rule's correctly rounded fp32 quotient, so scale_inv must agree."""
    amax = edge_amaxes()
    amax = amax[torch.isfinite(amax) & (amax >= 1e-12)]
    scale = compute_scale(amax, FP8_MAX[fmt], 0, torch.ones_like(amax))
    _, block_scale_inv = block_quantize(amax.reshape(-1, 1), 1, 1, fmt, "fp32")
    assert_same_bits(block_scale_inv.reshape(-1), torch.ones_like(scale) / scale, fmt)


def test_the_tests_see_a_rule_that_rounds_twice():
    """The formula test fails a rule computed as fp8_max * (1 / amax) (two roundings)."""
    amax = edge_amaxes()
    amax = amax[torch.isfinite(amax) & (amax > 0)]
    twice = torch.full_like(amax, 448.0) * (torch.ones_like(amax) / amax)
    assert not torch.equal(compute_scale(amax, 448.0, 0, torch.ones_like(amax))[torch.isfinite(twice)],
                           twice[torch.isfinite(twice)])


def test_compute_scale_keeps_the_shape_and_refuses_a_negative_margin():
    amax, previous = torch.tensor([[2.0], [math.nan]]), torch.tensor([[1.0], [5.0]])
    assert compute_scale(amax, 448.0, 0, previous).tolist() == [[224.0], [5.0]]
    with pytest.raises(ValueError, match="margin"):
        compute_scale(amax, 448.0, -1, previous)
