"""fp8mp::update_amax_history_and_scale: opcheck, torch.compile, bad input, CUDA vs CPU."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from scale_update_reference import (ALGOS, E4M3_MAX, assert_same_bits, make_group, mixed_fp8_max,
                                    random_amax)


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
