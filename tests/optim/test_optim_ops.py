"""fp8mp::adamw_step and fp8mp::lion_step against fp64 references, one step at a time, with error bounds counted
from the formats' precisions: fp32's unit roundoff u = 2^-24 per operation, and for the stochastic rounding of
FP8 and bf16 values less than one step of the format: E4M3's 2^-3 (relative) or its subnormal spacing 2^-9
times the block scale, bf16's 2^-7."""
from __future__ import annotations

import pytest
import torch

from fp8mp.ops import optim as optim_ops
from opcheck_util import error_of, opcheck_fp8_aware
from optim_reference import (BF16_ULP, E4M3_MIN_SUBNORMAL, E4M3_STEP, U32, adamw_reference, block_scale_of,
                             dequantize, lion_reference, new_state)

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)
SLACK = 1.01  # second-order terms (u^2) of the first-order bounds below


def heterogeneous_grad(gen, numel, dtype=torch.float32):
    """Gradients whose magnitudes span six decades across and within blocks, with some exact zeros."""
    g = torch.randn(numel, generator=gen, dtype=torch.float64) * 10.0 ** (torch.rand(numel, generator=gen) * 6 - 4)
    g[torch.rand(numel, generator=gen) < 0.02] = 0.0
    return g.to(dtype)


def run_adamw(p, g, state, found_inf=None, seed=7, **hyper):
    args = {**ADAMW, **hyper}
    optim_ops.adamw_step(p, g, state["exp_avg"], state["exp_avg_scale"], state["exp_avg_sq"], state["exp_avg_sq_scale"],
                         state["step"], found_inf, seed=seed, **args)


def adamw_param_bound(p, g, m_in, v_in, t, m_in_rel, v_in_rel, lr, beta1, beta2, eps, weight_decay):
    """How far the kernel's fp32 m, v and p may be from the fp64 step on the same (dequantized) inputs.

    Counting roundings of u each: m = B1 m + O1 g (coefficients, products, sum: 3u of |B1 m| + |O1 g|,
    plus the input's own error m_in_rel); v likewise with g*g one more (4u, all terms positive); denom =
    sqrt(v) / BC + eps (v's error halved by the root, root, BC, division, eps, sum: 6u + v_rel / 2);
    q = m / denom (+u); p D - S q (D, S, products, difference: 2u |p D| + 2u |S q| + u |p|)."""
    p, g, m_in, v_in = (x.double() for x in (p, g, m_in, v_in))
    p_ref, m_ref, v_ref, denom = adamw_reference(p, g, m_in, v_in, t, lr, beta1, beta2, eps, weight_decay)
    err_m = 3 * U32 * (beta1 * m_in.abs() + (1 - beta1) * g.abs()) + beta1 * m_in_rel * m_in.abs()
    err_v = 4 * U32 * v_ref + beta2 * v_in_rel * v_in
    denom_rel = 6 * U32 + err_v / v_ref.clamp(min=1e-300) / 2
    q = m_ref / denom
    step_size = lr / (1 - beta1 ** t)
    err_q = err_m / denom + q.abs() * (denom_rel + U32)
    err_p = 2 * U32 * (p * (1 - lr * weight_decay)).abs() + step_size * (err_q + 2 * U32 * q.abs()) + U32 * p_ref.abs()
    return p_ref, m_ref, v_ref, SLACK * err_p, SLACK * err_m, SLACK * err_v


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_adamw_each_step_against_fp64(state_dtype, param_dtype):
    """Six steps; each from the op's own (dequantized) previous states, so every step's error is that step's."""
    gen = torch.Generator().manual_seed(3)
    numel = 1000  # 7 full blocks and a short one
    p = torch.randn(numel, generator=gen).to(param_dtype)
    state = new_state((numel,), state_dtype, ("exp_avg", "exp_avg_sq"))
    fp8 = state_dtype == torch.float8_e4m3fn
    for t in range(1, 7):
        g = heterogeneous_grad(gen, numel)
        m_in = dequantize(state["exp_avg"], state["exp_avg_scale"])
        stored_v = dequantize(state["exp_avg_sq"], state["exp_avg_sq_scale"])
        v_in = stored_v ** 2 if fp8 else stored_v  # FP8 stores sqrt(v)
        # Reading an FP8 state back costs the kernel code * scale (u), and v's square (u more).
        m_in_rel, v_in_rel = (U32, 3 * U32) if fp8 else (0.0, 0.0)
        p_before = p.clone()
        p_ref, m_ref, v_ref, err_p, err_m, err_v = adamw_param_bound(p_before, g, m_in, v_in, t, m_in_rel, v_in_rel,
                                                                     **ADAMW)
        run_adamw(p, g, state)
        assert int(state["step"]) == t
        if param_dtype == torch.bfloat16:
            err_p = err_p + BF16_ULP * p_ref.abs()  # stochastic rounding: less than one bf16 step either way
        assert ((p.double() - p_ref).abs() <= err_p).all(), f"step {t}: param"

        m_q = dequantize(state["exp_avg"], state["exp_avg_scale"]).reshape(-1)
        v_q = dequantize(state["exp_avg_sq"], state["exp_avg_sq_scale"]).reshape(-1)
        if fp8:
            # E4M3 with one scale per block, rounded stochastically: less than a step of 3 mantissa bits, or
            # of the subnormal spacing in the block's units (also what keeping sqrt(v) positive may add),
            # plus the fp32 value's error and the encode (multiplier, product) and decode (scale) roundings.
            m_scale = block_scale_of(state["exp_avg_scale"], numel)
            r_scale = block_scale_of(state["exp_avg_sq_scale"], numel)
            bound_m = E4M3_STEP * m_ref.abs() + E4M3_MIN_SUBNORMAL * m_scale + err_m + 3 * U32 * m_ref.abs()
            r_ref = v_ref.sqrt()
            err_r = err_v / v_ref.clamp(min=1e-300).sqrt() / 2 + U32 * r_ref  # v's error through the root, root
            bound_r = E4M3_STEP * r_ref + E4M3_MIN_SUBNORMAL * r_scale + err_r + 3 * U32 * r_ref
            assert ((m_q - m_ref).abs() <= SLACK * bound_m).all(), f"step {t}: exp_avg"
            assert ((v_q - r_ref).abs() <= SLACK * bound_r).all(), f"step {t}: exp_avg_sq (sqrt(v))"
            # The scale is the block's amax / 448: no code above 448, and the largest within one step of it.
            codes = state["exp_avg"].view(torch.uint8).reshape(-1)
            padded = torch.zeros(8 * 128, dtype=torch.uint8)
            padded[:numel] = codes & 0x7F
            assert (padded.view(8, 128).amax(dim=1)[state["exp_avg_scale"] > 0] >= 0x7D).all()
            assert (padded <= 0x7E).all()
        elif state_dtype == torch.bfloat16:
            assert ((m_q - m_ref).abs() <= SLACK * (BF16_ULP * m_ref.abs() + err_m)).all(), f"step {t}: exp_avg"
            assert ((v_q - v_ref).abs() <= SLACK * (BF16_ULP * v_ref + err_v)).all(), f"step {t}: exp_avg_sq"
        else:
            assert ((m_q - m_ref).abs() <= err_m).all(), f"step {t}: exp_avg"
            assert ((v_q - v_ref).abs() <= err_v).all(), f"step {t}: exp_avg_sq"


def test_the_bound_is_tight_enough_to_fail():
    """The fp32 bound catches an error of a few units in the last place: the update with eps doubled breaks it."""
    gen = torch.Generator().manual_seed(5)
    p = torch.randn(512, generator=gen)
    g = torch.randn(512, generator=gen) * 1e-6  # |g| ~ eps: eps matters
    state = new_state((512,), torch.float32, ("exp_avg", "exp_avg_sq"))
    p_ref, *_, err_p, _, _ = adamw_param_bound(p, g, torch.zeros(512), torch.zeros(512), 1, 0.0, 0.0,
                                               **{**ADAMW, "eps": 2e-8})
    run_adamw(p, g, state)
    assert ((p.double() - p_ref).abs() > err_p).any()


def test_adamw_fp32_matches_torch_adamw_step_by_step():
    """fp32 states and parameter: within the two implementations' fp32 roundings of torch.optim.AdamW, over steps
    with fixed gradients (no feedback), each step's difference at most 16 u of |p| + |update| (8 u each side)."""
    gen = torch.Generator().manual_seed(11)
    p = torch.randn(777, generator=gen)
    p_torch = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([p_torch], lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], foreach=False)
    state = new_state((777,), torch.float32, ("exp_avg", "exp_avg_sq"))
    bound = torch.zeros(777, dtype=torch.float64)
    for _ in range(10):
        g = heterogeneous_grad(gen, 777)
        before = p_torch.detach().clone().double()
        p_torch.grad = g.clone()
        opt.step()
        run_adamw(p, g, state)
        bound += 16 * U32 * (p_torch.detach().double().abs() + (p_torch.detach().double() - before).abs())
        assert ((p.double() - p_torch.detach().double()).abs() <= bound).all()


def test_lion_each_step_against_fp64():
    gen = torch.Generator().manual_seed(13)
    lr, beta1, beta2, wd = 1e-3, 0.9, 0.99, 0.1
    p = torch.randn(600, generator=gen)
    state = new_state((600,), torch.float32, ("exp_avg",))
    for t in range(1, 5):
        g = heterogeneous_grad(gen, 600)
        m_in = state["exp_avg"].double()
        p_ref, m_ref, c = lion_reference(p.double(), g.double(), m_in, lr, beta1, beta2, wd)
        clear = c.abs() > 1e-5 * (beta1 * m_in.abs() + (1 - beta1) * g.double().abs())  # sign decided in fp32 too
        p_before = p.double().clone()
        optim_ops.lion_step(p, g, state["exp_avg"], None, state["step"], None, lr=lr, beta1=beta1, beta2=beta2,
                            weight_decay=wd, seed=0)
        err_p = SLACK * (2 * U32 * (p_before * (1 - lr * wd)).abs() + 2 * U32 * lr + U32 * p_ref.abs())
        err_m = SLACK * 3 * U32 * (beta2 * m_in.abs() + (1 - beta2) * g.double().abs())
        assert ((p.double() - p_ref).abs()[clear] <= err_p[clear]).all()
        assert ((state["exp_avg"].double() - m_ref).abs() <= err_m).all()
        assert clear.float().mean() > 0.9 and int(state["step"]) == t


def test_lion_fp8_state_within_e4m3():
    gen = torch.Generator().manual_seed(17)
    p = torch.randn(300, generator=gen)
    state = new_state((300,), torch.float8_e4m3fn, ("exp_avg",))
    g = heterogeneous_grad(gen, 300)
    optim_ops.lion_step(p, g, state["exp_avg"], state["exp_avg_scale"], state["step"], None, lr=1e-3, beta1=0.9,
                        beta2=0.99, weight_decay=0.0, seed=0)
    m_ref = 0.01 * g.double()
    bound = E4M3_STEP * m_ref.abs() + E4M3_MIN_SUBNORMAL * block_scale_of(state["exp_avg_scale"], 300) \
        + 8 * U32 * m_ref.abs()
    assert ((dequantize(state["exp_avg"], state["exp_avg_scale"]) - m_ref).abs() <= bound).all()


# ------------------------------------------------------------------------------ stochastic rounding


def bf16_neighbours(x: torch.Tensor):
    """The bf16 values just below and above each fp32 x (toward zero and away), from torch's own casts."""
    toward_zero = (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
    away = ((x.view(torch.int32) & ~0xFFFF) + 0x10000).view(torch.float32)
    return toward_zero, away


def sr_setup(n, seed=0, step=0):
    """n copies of one element, so every copy sees the same exact update and its own random bits."""
    p = torch.full((n,), 1.0 + 3 * 2 ** -7, dtype=torch.float32)  # on the bf16 grid (its step is 2^-7 here)
    g = torch.full((n,), 0.37)
    state = new_state((n,), torch.float32, ("exp_avg", "exp_avg_sq"))
    state["step"].fill_(step)
    return p, g, state


def test_bf16_stochastic_rounding_is_unbiased_and_between_neighbours():
    n = 1 << 16
    p32, g, state32 = sr_setup(n)
    run_adamw(p32, g, state32, lr=1e-3)  # the exact fp32 update of the same element
    exact = p32[0].item()
    lo, hi = (v.item() for v in bf16_neighbours(p32[:1]))
    frac = (exact - lo) / (hi - lo)
    assert 0.05 < frac < 0.95, "the update must land between two bf16 values for this test to say anything"
    p16, g16, state16 = sr_setup(n)
    p16 = p16.bfloat16()
    run_adamw(p16, g, state16, lr=1e-3)
    values = p16.double()
    assert set(values.unique().tolist()) <= {lo, hi}
    sigma = (hi - lo) * (frac * (1 - frac) / n) ** 0.5  # standard deviation of the mean of n Bernoulli roundings
    assert abs(values.mean().item() - exact) <= 5 * sigma


def test_bf16_stochastic_rounding_is_deterministic_and_counter_based():
    def bits(seed, step):
        p, g, state = sr_setup(4096, step=step)
        p = p.bfloat16()
        run_adamw(p, g, state, seed=seed, lr=1e-3)
        return p.view(torch.int16).clone()

    assert torch.equal(bits(1, 5), bits(1, 5))
    assert not torch.equal(bits(1, 5), bits(2, 5))
    assert not torch.equal(bits(1, 5), bits(1, 6))


def test_fp8_states_are_rounded_stochastically_without_bias():
    """One step from zero states: m = 0.1 g. Each block holds one element at its amax (code 448) and 127 whose
    scaled m is 134.4, between the E4M3 values 128 and 144: their mean comes within 5 sigma of 134.4. sqrt(v)
    of an element far below its block's smallest subnormal stays positive (the smallest subnormal)."""
    blocks = 512
    g = torch.full((blocks, 128), 0.3)
    g[:, 0] = 1.0
    g[:, 1] = 1e-9  # sqrt(v) = 3e-11 against a block amax of 0.03: 2^-9 * 0.03 / 448 = 1.3e-7 is the floor
    p = torch.zeros(blocks * 128)
    state = new_state((blocks * 128,), torch.float8_e4m3fn, ("exp_avg", "exp_avg_sq"))
    run_adamw(p, g.reshape(-1), state, weight_decay=0.0)
    scaled = state["exp_avg"].float().view(blocks, 128)[:, 2:]
    assert set(scaled.unique().tolist()) == {128.0, 144.0}
    frac = (134.4 - 128) / 16
    sigma = 16 * (frac * (1 - frac) / scaled.numel()) ** 0.5
    assert abs(scaled.double().mean().item() - 134.4) <= 5 * sigma
    assert (state["exp_avg_sq"].view(torch.uint8).view(blocks, 128)[:, 1] == 1).all()


# ------------------------------------------------------------------------------ skipping, opcheck, errors


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_found_inf_changes_nothing(state_dtype):
    gen = torch.Generator().manual_seed(19)
    p = torch.randn(300, generator=gen).bfloat16()
    state = new_state((300,), state_dtype, ("exp_avg", "exp_avg_sq"))
    run_adamw(p, heterogeneous_grad(gen, 300), state)
    snapshot = [t.clone() for t in (p, *(v for v in state.values() if v is not None))]
    g = heterogeneous_grad(gen, 300)
    run_adamw(p, g, state, found_inf=torch.ones(1))
    after = [p, *(v for v in state.values() if v is not None)]
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(after, snapshot))
    run_adamw(p, g, state, found_inf=torch.zeros(1))
    assert int(state["step"]) == 2 and not torch.equal(p, snapshot[0])


def op_args(op, param_dtype, grad_dtype, state_dtype, found_inf, numel=300):
    gen = torch.Generator().manual_seed(23)
    names = ("exp_avg", "exp_avg_sq") if op == "adamw" else ("exp_avg",)
    p = torch.randn(numel, generator=gen).to(param_dtype)
    g = heterogeneous_grad(gen, numel, grad_dtype)
    state = new_state((numel,), state_dtype, names)
    flag = torch.zeros(1) if found_inf else None
    if op == "adamw":
        return (p, g, state["exp_avg"], state["exp_avg_scale"], state["exp_avg_sq"], state["exp_avg_sq_scale"],
                state["step"], flag, 1e-3, 0.9, 0.999, 1e-8, 0.01, 5)
    return (p, g, state["exp_avg"], state["exp_avg_scale"], state["step"], flag, 1e-4, 0.9, 0.99, 0.0, 5)


@pytest.mark.parametrize("op", ["adamw", "lion"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("param_dtype,grad_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                    (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("found_inf", [False, True])
def test_opcheck(op, state_dtype, param_dtype, grad_dtype, found_inf):
    opcheck_fp8_aware(getattr(torch.ops.fp8mp, f"{op}_step").default,
                      op_args(op, param_dtype, grad_dtype, state_dtype, found_inf))


@pytest.mark.parametrize("op", ["adamw", "lion"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_opcheck_with_element_offset(op, state_dtype):
    args = op_args(op, torch.bfloat16, torch.bfloat16, state_dtype, True)
    opcheck_fp8_aware(getattr(torch.ops.fp8mp, f"{op}_step").default, args + (3 * 128,))


# ------------------------------------------------------------------------------ shards of a larger tensor


def step_shards(op, whole_args, cuts, steps=3):
    """Step `whole_args` (op_args' tuple) as a whole and, on copies, as the shards [cuts[i], cuts[i+1]) of its
    elements, each with its element_offset; returns both results' tensors as bytes, shards concatenated."""
    fn = getattr(torch.ops.fp8mp, f"{op}_step")
    whole = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in whole_args)
    tensors = [i for i, a in enumerate(whole) if isinstance(a, torch.Tensor)]
    for _ in range(steps):
        fn(*whole)
    shard_results = []
    for start, stop in zip(cuts, cuts[1:]):
        shard = []
        for i, a in enumerate(whole_args):
            if isinstance(a, torch.Tensor) and a.numel() == whole_args[0].numel():
                shard.append(a[start:stop].clone())
            elif isinstance(a, torch.Tensor) and a.dim() == 1 and a.numel() > 1:  # FP8 scales: the shard's blocks
                shard.append(a[start // 128:(stop + 127) // 128].clone())
            else:
                shard.append(a.clone() if isinstance(a, torch.Tensor) else a)
        for _ in range(steps):
            fn(*shard, start)
        shard_results.append(shard)
    got = {i: [s[i] for s in shard_results] for i in tensors}
    return [(whole[i].view(torch.uint8).reshape(-1),
             torch.cat([t.view(torch.uint8).reshape(-1) for t in got[i]]) if whole[i].numel() > 1
             else got[i][0].view(torch.uint8).reshape(-1)) for i in tensors]


@pytest.mark.parametrize("op", ["adamw", "lion"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_shards_with_their_offsets_write_the_whole_tensors_bits(op, state_dtype):
    """bf16 parameter (rounded stochastically): three steps of three shards, each given its offset in the whole,
    leave exactly the bytes of three steps of the whole (parameter, states, FP8 scales, step); the last shard
    holds the whole tensor's short block."""
    args = op_args(op, torch.bfloat16, torch.float32, state_dtype, True, numel=1000)
    for want, got in step_shards(op, args, [0, 384, 768, 1000]):
        assert torch.equal(want, got)


def test_offsets_key_the_random_bits():
    """The same shard stepped at two offsets rounds differently (the offset is part of the hash)."""
    args = op_args("adamw", torch.bfloat16, torch.float32, torch.float32, False, numel=4096)
    p0, p1 = args[0].clone(), args[0].clone()
    rest = [a.clone() if isinstance(a, torch.Tensor) else a for a in args[1:]]
    rest2 = [a.clone() if isinstance(a, torch.Tensor) else a for a in args[1:]]
    torch.ops.fp8mp.adamw_step(p0, *rest, 0)
    torch.ops.fp8mp.adamw_step(p1, *rest2, 4096)
    assert not torch.equal(p0.view(torch.int16), p1.view(torch.int16))


@pytest.mark.parametrize("state_dtype,offset,words", [
    (torch.float8_e4m3fn, 64, "'element_offset' must be a multiple of 128 when the states are float8_e4m3fn"),
    (torch.float32, -1, "'element_offset' must be >= 0"),
    (torch.bfloat16, 2**63 - 100, "element_offset + numel within int64")])
def test_element_offset_errors_name_it_and_fake_agrees(state_dtype, offset, words):
    def call(device):
        a = op_args("lion", torch.float32, torch.float32, state_dtype, False)
        optim_ops.lion_step(*a[:6], lr=a[6], beta1=a[7], beta2=a[8], weight_decay=a[9], seed=a[10],
                            element_offset=offset)

    cpu = error_of(call, "cpu")
    assert cpu[0] is ValueError and words in cpu[1] and cpu[1].startswith("fp8mp::lion_step: argument")
    assert error_of(call, "fake") == cpu


def test_any_offset_without_fp8_states():
    """float32 and bfloat16 states have no blocks: an offset that is not a multiple of 128 is fine."""
    torch.ops.fp8mp.adamw_step(*op_args("adamw", torch.bfloat16, torch.float32, torch.bfloat16, False), 32)


def bad_adamw_calls():
    """(description, mutation of the valid argument tuple, expected error type, words the message must hold)."""
    def with_arg(i, value):
        return lambda a: a[:i] + (value(a) if callable(value) else value,) + a[i + 1:]

    return [
        ("int param", with_arg(0, lambda a: a[0].to(torch.int32)), RuntimeError, "'param' must be float32 or bfloat16"),
        ("grad shape", with_arg(1, lambda a: a[1][:-1]), ValueError, "'grad' must have param's shape"),
        ("state dtype", with_arg(2, lambda a: a[2].half()), RuntimeError, "'exp_avg' must be float32, bfloat16 or float8"),
        ("mixed states", with_arg(4, lambda a: a[4].float()), RuntimeError, "'exp_avg_sq' must have the dtype of 'exp_avg'"),
        ("missing scale", with_arg(3, None), ValueError, "'exp_avg_scale' is required"),
        ("scale shape", with_arg(5, lambda a: a[5][:-1]), ValueError, "'exp_avg_sq_scale' must have shape [3]"),
        ("step dtype", with_arg(6, lambda a: a[6].float()), RuntimeError, "'step' must be a 1-element int64"),
        ("found_inf", with_arg(7, lambda a: torch.zeros(2)), ValueError, "'found_inf' must be a 1-element float32"),
        ("aliased", with_arg(4, lambda a: a[2]), RuntimeError, "must not share memory"),
        ("lr", with_arg(8, -1.0), ValueError, "'lr' must be finite and >= 0, got -1"),
        ("beta2", with_arg(10, 1.0), ValueError, "'beta2' must be in [0, 1), got 1"),
        ("eps", with_arg(11, 0.0), ValueError, "'eps' must be finite and > 0, got 0"),
    ]


@pytest.mark.parametrize("case", bad_adamw_calls(), ids=lambda c: c[0])
def test_adamw_errors_name_the_argument_and_fake_agrees(case):
    _, mutate, error, words = case

    def call(device):
        args = mutate(op_args("adamw", torch.float32, torch.float32, torch.float8_e4m3fn, True))
        optim_ops.adamw_step(*args[:8], lr=args[8], beta1=args[9], beta2=args[10], eps=args[11],
                             weight_decay=args[12], seed=args[13])

    cpu = error_of(call, "cpu")
    assert cpu[0] is error and words in cpu[1] and cpu[1].startswith("fp8mp::adamw_step: argument")
    assert error_of(call, "fake") == cpu


def test_param_device_mismatch_is_named():
    args = op_args("lion", torch.float32, torch.float32, torch.float32, False)
    with pytest.raises(RuntimeError, match="argument 'grad' must be on param's device cpu, got meta"):
        torch.ops.fp8mp.lion_step(args[0], args[1].to("meta"), *args[2:])


# ------------------------------------------------------------------------------ CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", ["adamw", "lion"])
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("param_dtype,grad_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                    (torch.bfloat16, torch.float32)], ids=["fp32", "bf16", "bf16-fp32grad"])
def test_cuda_writes_the_cpus_bits(op, state_dtype, param_dtype, grad_dtype):
    """The same steps on both devices give the same bits: parameter (stochastic rounding included), states, scales;
    bf16 parameters with fp32 gradients too (their own kernel instantiation). Then a step with found_inf = 1 (the
    skip path) changes no bit on either device, the step count included."""
    cpu_args = op_args(op, param_dtype, grad_dtype, state_dtype, True, numel=100_000)
    cuda_args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in cpu_args)
    fn = getattr(torch.ops.fp8mp, f"{op}_step")
    for _ in range(3):
        fn(*cpu_args, 256)  # a shard's offset: the random bits of elements 256...
        fn(*cuda_args, 256)
    for a, b in zip(cpu_args, cuda_args):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.view(torch.uint8), b.cpu().view(torch.uint8))
    found_inf = 7 if op == "adamw" else 5  # the position of found_inf in op_args
    kept = [i for i, a in enumerate(cpu_args) if isinstance(a, torch.Tensor) and i != found_inf]
    before = {i: cpu_args[i].clone() for i in kept}
    for args in (cpu_args, cuda_args):
        args[found_inf].fill_(1.0)
        fn(*args, 256)
    for i in kept:
        assert torch.equal(cpu_args[i].view(torch.uint8), before[i].view(torch.uint8)), i
        assert torch.equal(cuda_args[i].cpu().view(torch.uint8), before[i].view(torch.uint8)), i
