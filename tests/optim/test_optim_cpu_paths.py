"""The CPU kernels of the fused optimizer steps write the same bits whatever runs them: any number of threads
(the blocks of 128 elements are independent, split over the threads in chunks), and the vectorized loops
at each level of vector instructions this CPU runs (AVX-512, AVX2 or baseline x86-64: its best, and the
lower ones FP8MP_CPU_ISA asks for) or the one-element-at-a-time loop that FP8MP_CPU_OPTIM=scalar forces; over sizes with tails (not a multiple of a vector or of a block) and inputs
holding NaN, Inf, subnormals and every E4M3 code. Each configuration runs in its own process (the thread count
is torch's global state, FP8MP_CPU_OPTIM and FP8MP_CPU_ISA are read once per process). Also: the NaN bits written, which the ops
document, and the E4M3 decode and encode of every code."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp8mp.ops import optim as optim_ops
from cpu_levels import best_isa_level, why_not

WORKER = Path(__file__).with_name("optim_bits_worker.py")
# name -> (threads, FP8MP_CPU_OPTIM, FP8MP_CPU_ISA); "1 thread" runs this CPU's best level.
CONFIGS = {"1 thread": (1, None, None), "3 threads": (3, None, None), "scalar loop, 2 threads": (2, "scalar", None),
           "avx512 loops, 2 threads": (2, None, "avx512"), "avx2 loops, 2 threads": (2, None, "avx2"),
           "baseline loops, 2 threads": (2, None, "baseline")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> what the worker wrote; a level this CPU lacks is left out (its test skips, naming the features)."""
    out = {}
    for name, (threads, optim_path, isa) in CONFIGS.items():
        if isa and why_not(isa):
            continue
        path = tmp_path_factory.mktemp("optim_bits") / "out.pt"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        for variable, value in (("FP8MP_CPU_OPTIM", optim_path), ("FP8MP_CPU_ISA", isa)):
            env.pop(variable, None)
            if value:
                env[variable] = value
        subprocess.run([sys.executable, str(WORKER), str(path), str(threads)], env=env, check=True, timeout=600)
        out[name] = torch.load(path)
        assert out[name].pop("cpu_isa") == (isa or best_isa_level()), name
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("other", [name for name in CONFIGS if name != "1 thread"])
def test_same_bits_for_any_thread_count_and_loop(runs, other):
    isa = CONFIGS[other][2]
    if other not in runs:
        pytest.skip(why_not(isa))
    base = runs["1 thread"]
    assert base.keys() == runs[other].keys()
    for case, written in base.items():
        for i, (a, b) in enumerate(zip(written, runs[other][case], strict=True)):
            assert torch.equal(bits(a), bits(b)), f"{case}: output {i} differs between 1 thread and {other}"


def test_the_comparison_sees_nans_and_every_code(runs):
    """The cases compared above do exercise the special values (else the bit comparison proves little)."""
    written = runs["1 thread"][("adamw", str(torch.float8_e4m3fn), str(torch.float32), str(torch.float32), 5 * 8192 + 77)]
    p = written[0]
    assert p.isnan().any() and p.isfinite().any()


def test_nan_bits_written_are_pinned():
    """A NaN the arithmetic makes (Inf / Inf from an Inf gradient) or a NaN gradient is written as the canonical
    +NaN: float32 0x7FC00000 (x86 makes 0xFFC00000, NVIDIA 0x7FFFFFFF), bfloat16 0x7FC0, E4M3 code 0x7F, the
    scale of a block holding a NaN 0x7FC00000."""
    g = torch.tensor([float("inf"), -float("inf"), -float("nan"), 1.0] * 50)
    for state_dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        for param_dtype in (torch.float32, torch.bfloat16):
            p = torch.ones(200, dtype=param_dtype)
            fp8 = state_dtype == torch.float8_e4m3fn
            m, v = torch.zeros(200, dtype=state_dtype), torch.zeros(200, dtype=state_dtype)
            m_scale, v_scale = (torch.zeros(2), torch.zeros(2)) if fp8 else (None, None)
            optim_ops.adamw_step(p, g.to(param_dtype), m, m_scale, v, v_scale, torch.zeros(1, dtype=torch.int64), None,
                                 lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, seed=0)
            nan_bits = 0x7FC00000 if param_dtype == torch.float32 else 0x7FC0
            as_int = p.view(torch.int32 if param_dtype == torch.float32 else torch.int16).long() & (
                0xFFFFFFFF if param_dtype == torch.float32 else 0xFFFF)
            assert p[:3].isnan().all() and (as_int[p.isnan()] == nan_bits).all(), (state_dtype, param_dtype)
            for state, scale in ((m, m_scale), (v, v_scale)):
                if fp8:
                    codes = state.view(torch.uint8)
                    assert (codes[state.float().isnan()] == 0x7F).all() and state.float().isnan().any()
                    assert (scale.view(torch.int32) == 0x7FC00000).all()  # every block holds a NaN


def test_every_e4m3_code_survives_a_step_that_keeps_the_moment():
    """Lion with beta2 = 1 keeps m = 1 * m + 0 * g: with a block scale of 1 and 448 in every block, the states'
    codes decode to E4M3 values (torch's float8 decode is the reference) that encode back to themselves, so every
    code must come back unchanged, NaN as 0x7F."""
    finite = [c for c in range(256) if c & 0x7F != 0x7F]
    blocks = [finite[i:i + 127] + [0x7E] for i in range(0, len(finite), 127)]
    codes = torch.tensor(sum(blocks, []) + [0x7F, 0xFF, 0x7E], dtype=torch.uint8)
    state = codes.clone().view(torch.float8_e4m3fn)
    expected_values = codes.view(torch.float8_e4m3fn).float()
    scale = torch.ones(optim_ops.state_scale_numel(codes.numel()))
    # g < 0: (1 - beta2) g = -0, which leaves both +0 and -0 as they are.
    optim_ops.lion_step(torch.zeros(codes.numel()), -torch.ones(codes.numel()), state, scale,
                        torch.zeros(1, dtype=torch.int64), None, lr=1e-3, beta1=0.9, beta2=1.0, weight_decay=0.0, seed=1)
    finite_part = slice(0, codes.numel() - 3)
    assert torch.equal(state.view(torch.uint8)[finite_part], codes[finite_part])
    assert torch.equal(state.float()[finite_part], expected_values[finite_part])
    assert torch.equal(state.view(torch.uint8)[-3:-1], torch.tensor([0x7F, 0x7F], dtype=torch.uint8))
    assert torch.equal(scale[:-1], torch.ones(scale.numel() - 1))
