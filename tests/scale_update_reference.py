"""Plain-torch reference of the fused amax-history / scale update, and its test inputs."""
from __future__ import annotations

import math

import torch

E4M3_MAX, E5M2_MAX = 448.0, 57344.0
ALGOS = ["max", "most_recent"]


# ---------------------------------------------------------------- reference


def reference_step(amax, history, scale, fp8_max, margin, algo):
    """One delayed-scaling step with plain torch ops, out of place."""
    history = torch.roll(history, shifts=1, dims=0)
    history[0] = amax
    effective = history.amax(dim=0) if algo == "max" else amax  # amax propagates NaN
    new = fp8_max / effective / 2.0**margin
    usable = (effective > 0) & torch.isfinite(effective) & (new > 0) & torch.isfinite(new)
    scale = torch.where(usable, new, scale)
    return history, scale, torch.ones_like(scale) / scale


def bits(t):
    return t.contiguous().view(torch.int32)


def assert_same_bits(got, expected, what=""):
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    assert torch.equal(bits(got), bits(expected)), f"{what}: {got} != {expected}"


def random_amax(gen, T, specials=True):
    """Amaxes over many binades, with zeros, NaN and +Inf sprinkled in."""
    amax = torch.rand(T, generator=gen) * 2.0 ** torch.randint(-20, 20, (T,), generator=gen).float()
    if specials:
        kind = torch.randint(0, 20, (T,), generator=gen)
        amax = torch.where(kind == 0, torch.zeros(T), amax)
        amax = torch.where(kind == 1, torch.full((T,), math.nan), amax)
        amax = torch.where(kind == 2, torch.full((T,), math.inf), amax)
    return amax


def mixed_fp8_max(gen, T):
    return torch.where(torch.rand(T, generator=gen) < 0.5, torch.tensor(E4M3_MAX), torch.tensor(E5M2_MAX))


def make_group(T, H, device="cpu"):
    return dict(
        amax_history=torch.zeros(H, T, device=device),
        scale=torch.ones(T, device=device),
        scale_inv=torch.ones(T, device=device),
    )
