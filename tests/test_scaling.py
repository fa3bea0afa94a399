"""Scaling recipes and the fused amax-history / scale update, checked exactly against plain torch."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import fp8mp
from fp8mp import recipe
from fp8mp.fp8_format import FP8_MAX, fp8_max_of
from fp8mp.scaling import compute_scale

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


def test_compute_scale_matches_the_op_with_most_recent():
    gen = torch.Generator().manual_seed(7)
    for margin in (0, 2):
        for fmt in ("e4m3", "e5m2"):
            amax = random_amax(gen, 64)
            previous = torch.rand(64, generator=gen) + 0.5
            g = dict(amax_history=torch.zeros(1, 64), scale=previous.clone(), scale_inv=torch.ones(64))
            fp8mp.update_amax_history_and_scale(amax, g["amax_history"], g["scale"], g["scale_inv"],
                                                torch.full((64,), fp8_max_of(fmt)), margin, "most_recent")
            got = compute_scale(amax, fp8_max_of(fmt), margin, previous)
            assert_same_bits(got, g["scale"], f"{fmt} margin {margin}")


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


# ---------------------------------------------------------------- recipes


def test_format_directions():
    assert (recipe.Format.E4M3.forward_format, recipe.Format.E4M3.backward_format) == ("e4m3", "e4m3")
    assert (recipe.Format.E5M2.forward_format, recipe.Format.E5M2.backward_format) == ("e5m2", "e5m2")
    assert (recipe.Format.HYBRID.forward_format, recipe.Format.HYBRID.backward_format) == ("e4m3", "e5m2")


def test_recipe_defaults_and_exports():
    d = fp8mp.recipe.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo) == (0, recipe.Format.HYBRID, 1024, "max")
    c = fp8mp.recipe.CurrentScaling(margin=1, fp8_format=recipe.Format.E4M3)
    assert (c.margin, c.fp8_format) == (1, recipe.Format.E4M3)
    assert fp8mp.update_amax_history_and_scale is fp8mp.scaling.update_amax_history_and_scale


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(margin=-1), "margin"),
        (dict(margin=1.5), "margin"),
        (dict(margin=True), "margin"),
        (dict(amax_history_len=0), "amax_history_len"),
        (dict(amax_history_len=2.0), "amax_history_len"),
        (dict(amax_compute_algo="mean"), "amax_compute_algo"),
        (dict(fp8_format="HYBRID"), "fp8_format"),
        (dict(fp8_format=None), "fp8_format"),
    ],
)
def test_delayed_scaling_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        recipe.DelayedScaling(**kwargs)


@pytest.mark.parametrize("kwargs,field", [(dict(margin=-2), "margin"), (dict(fp8_format="e4m3"), "fp8_format")])
def test_current_scaling_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        recipe.CurrentScaling(**kwargs)


@pytest.mark.parametrize("obj,field", [(recipe.DelayedScaling(), "margin"), (recipe.CurrentScaling(), "fp8_format")])
def test_recipes_are_frozen(obj, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, getattr(obj, field))
    assert hash(obj) == hash(type(obj)())  # frozen dataclasses are hashable values


# ---------------------------------------------------------------- opcheck and torch.compile


def opcheck_case(T, H, margin, algo, seed):
    gen = torch.Generator().manual_seed(seed)
    history = torch.rand(H, T, generator=gen) * 10
    return (random_amax(gen, T, specials=False), history, torch.rand(T, generator=gen) + 0.5, torch.ones(T),
            mixed_fp8_max(gen, T), margin, algo)


@pytest.mark.parametrize("T,H,margin,algo", [(3, 4, 0, "max"), (1, 1, 0, "most_recent"), (17, 16, 2, "max"), (5, 1024, 1, "most_recent")])
def test_opcheck(T, H, margin, algo):
    torch.library.opcheck(torch.ops.fp8mp.update_amax_history_and_scale.default, opcheck_case(T, H, margin, algo, T + H))


def test_torch_compile_fullgraph_matches_eager():
    def step(amax, history, scale, scale_inv, fp8_max):
        fp8mp.update_amax_history_and_scale(amax, history, scale, scale_inv, fp8_max, 1, "max")
        return scale * 2  # something downstream that reads the updated scale

    compiled = torch.compile(step, fullgraph=True)
    T, H = 5, 8
    gen = torch.Generator().manual_seed(3)
    fp8_max = mixed_fp8_max(gen, T)
    eager_g, compiled_g = make_group(T, H), make_group(T, H)
    for _ in range(12):
        amax = random_amax(gen, T)
        out_e = step(amax, eager_g["amax_history"], eager_g["scale"], eager_g["scale_inv"], fp8_max)
        out_c = compiled(amax, compiled_g["amax_history"], compiled_g["scale"], compiled_g["scale_inv"], fp8_max)
        assert_same_bits(out_c, out_e, "output")
        for key in eager_g:
            assert_same_bits(compiled_g[key], eager_g[key], key)


# ---------------------------------------------------------------- bad input


def good_args(T=3, H=4):
    return dict(amax=torch.ones(T), amax_history=torch.zeros(H, T), scale=torch.ones(T), scale_inv=torch.ones(T),
                fp8_max=torch.full((T,), E4M3_MAX), margin=0, amax_compute_algo="max")


def call(args):
    fp8mp.update_amax_history_and_scale(**args)


def test_good_args_work():
    call(good_args())


@pytest.mark.parametrize(
    "arg,bad",
    [
        ("amax", torch.ones(4)),
        ("amax", torch.ones(3, 1)),
        ("amax_history", torch.zeros(4, 2)),
        ("amax_history", torch.zeros(12)),
        ("amax_history", torch.zeros(0, 3)),
        ("amax_history", torch.zeros(2, 4, 3)),
        ("scale", torch.ones(2)),
        ("scale_inv", torch.ones(3, 1)),
        ("fp8_max", torch.ones(4)),
    ],
)
def test_bad_shapes_name_the_argument(arg, bad):
    args = good_args()
    args[arg] = bad
    # A bad amax shape is reported against amax_history's T (amax defines T); both name an argument.
    with pytest.raises(ValueError, match=f"'{arg}'" if arg != "amax" or bad.dim() != 1 else "'amax_history'"):
        call(args)


@pytest.mark.parametrize("arg", ["amax", "amax_history", "scale", "scale_inv", "fp8_max"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int32])
def test_bad_dtypes_name_the_argument(arg, dtype):
    args = good_args()
    args[arg] = args[arg].to(dtype)
    with pytest.raises(RuntimeError, match=f"'{arg}' must be float32"):
        call(args)


@pytest.mark.parametrize("arg", ["amax", "amax_history", "scale"])
def test_non_contiguous_is_rejected(arg):
    args = good_args()
    args[arg] = torch.zeros(args[arg].shape[::-1]).t() if arg == "amax_history" else torch.ones(6)[::2]
    with pytest.raises(RuntimeError, match=f"'{arg}' must be contiguous"):
        call(args)


def test_aliased_outputs_are_rejected():
    args = good_args()
    args["scale_inv"] = args["scale"]
    with pytest.raises(RuntimeError, match="'scale'.*must not share memory with 'scale_inv'"):
        call(args)
    args = good_args(T=3, H=2)
    args["amax"] = args["amax_history"][1]
    with pytest.raises(RuntimeError, match="'amax_history'.*must not share memory with 'amax'"):
        call(args)


@pytest.mark.parametrize("margin", [-1, -100])
def test_negative_margin(margin):
    args = good_args()
    args["margin"] = margin
    with pytest.raises(ValueError, match="'margin' must be >= 0"):
        call(args)


@pytest.mark.parametrize("algo", ["mean", "MAX", ""])
def test_unknown_algo(algo):
    args = good_args()
    args["amax_compute_algo"] = algo
    with pytest.raises(ValueError, match="'amax_compute_algo'"):
        call(args)


def test_failed_check_leaves_buffers_untouched():
    args = good_args()
    args["amax"] = torch.full((3,), 2.0)
    args["amax_compute_algo"] = "bogus"
    with pytest.raises(ValueError):
        call(args)
    assert torch.equal(args["amax_history"], torch.zeros(4, 3)) and torch.equal(args["scale"], torch.ones(3))


# ---------------------------------------------------------------- CUDA vs CPU

needs_cuda = pytest.mark.skipif(not fp8mp.cuda_kernels_available(), reason="no CUDA device or fp8mp built without CUDA kernels")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("T,H", [(1, 1), (3, 4), (17, 1024), (5, 255), (4, 256), (4, 257), (2, 3000), (300, 16)])
def test_cuda_matches_cpu(T, H, algo):
    gen = torch.Generator().manual_seed(T * 7919 + H)
    fp8_max = mixed_fp8_max(gen, T)
    history = random_amax(gen, H * T).reshape(H, T)  # a random, NaN/Inf-laden starting history
    cpu = dict(amax_history=history.clone(), scale=torch.rand(T, generator=gen) + 0.5, scale_inv=torch.ones(T))
    gpu = {k: v.cuda() for k, v in cpu.items()}
    for step in range(10):
        amax = random_amax(gen, T, specials=step % 2 == 0)
        margin = step % 3
        fp8mp.update_amax_history_and_scale(amax, cpu["amax_history"], cpu["scale"], cpu["scale_inv"], fp8_max, margin, algo)
        fp8mp.update_amax_history_and_scale(amax.cuda(), gpu["amax_history"], gpu["scale"], gpu["scale_inv"],
                                            fp8_max.cuda(), margin, algo)
        for key in cpu:
            assert_same_bits(gpu[key].cpu(), cpu[key], f"{key}, step {step}")


@needs_cuda
@pytest.mark.cuda
def test_cuda_opcheck_and_device_errors():
    args = opcheck_case(17, 64, 1, "max", 0)
    cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    torch.library.opcheck(torch.ops.fp8mp.update_amax_history_and_scale.default, cuda_args)
    bad = good_args()
    bad = {k: v.cuda() if isinstance(v, torch.Tensor) and k != "fp8_max" else v for k, v in bad.items()}
    with pytest.raises(RuntimeError, match="'fp8_max' must be on amax's device"):
        call(bad)


@needs_cuda
@pytest.mark.cuda
def test_cuda_under_torch_compile():
    def step(amax, history, scale, scale_inv, fp8_max):
        fp8mp.update_amax_history_and_scale(amax, history, scale, scale_inv, fp8_max, 0, "max")

    compiled = torch.compile(step, fullgraph=True)
    T, H = 6, 32
    g_cpu, g_gpu = make_group(T, H), make_group(T, H, "cuda")
    fp8_max = torch.full((T,), E4M3_MAX)
    gen = torch.Generator().manual_seed(11)
    for _ in range(5):
        amax = random_amax(gen, T)
        step(amax, g_cpu["amax_history"], g_cpu["scale"], g_cpu["scale_inv"], fp8_max)
        compiled(amax.cuda(), g_gpu["amax_history"], g_gpu["scale"], g_gpu["scale_inv"], fp8_max.cuda())
    for key in g_cpu:
        assert_same_bits(g_gpu[key].cpu(), g_cpu[key], key)
