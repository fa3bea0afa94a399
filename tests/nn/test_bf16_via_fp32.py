"""fp8mp.nn.bf16_via_fp32: bf16 matmuls as fp32 GEMMs of bf16 operands, against the definition of a bf16 GEMM with
fp32 accumulation (each product of two bf16 values exact, the products summed in fp32, the sum rounded to bf16 once),
computed independently in fp64; and against torch's own bf16 matmul, which meets the same definition."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import _get_current_function_mode_stack

from fp8mp.nn.bf16_via_fp32 import bf16_matmul_via_fp32, cpu_has_bf16_matmul_units

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_levels import best_isa_level, cpu_flags  # noqa: E402

U32 = 2.0**-24  # fp32's unit roundoff
U64 = 2.0**-53


def gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): |fl(sum of n+1 terms) - sum| <= gamma_n * sum of |terms|, any order."""
    return n * u / (1 - n * u)


def bf16_values(t: torch.Tensor) -> torch.Tensor:
    """t rounded to bf16 (as autocast casts it), as exact fp64 values."""
    return t.to(torch.bfloat16).to(torch.float64)


def allowed_bf16(exact: torch.Tensor, abs_sum: torch.Tensor, terms: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[lo, hi]: the bf16 results a GEMM with fp32 accumulation may give for a sum whose fp64 value is `exact`
    over `terms` exact fp32 products (and a bias) of absolute sum `abs_sum`.

    The fp32 sum s lies within gamma_terms(fp32) * abs_sum of the exact sum (plus the fp64 reference's own error);
    s is an fp32 value and its bf16 rounding is monotone, so rn_bf16(s) lies in [rn_bf16(exact - B), rn_bf16(exact +
    B)] (fp64 -> bf16 through fp32 is monotone and leaves fp32 values where they are). Away from a rounding boundary
    the interval is one value: the check is as tight as rounding once to bf16 allows."""
    bound = (gamma(terms, U32) + gamma(terms, U64)) * abs_sum
    lo = (exact - bound).to(torch.float32).to(torch.bfloat16).to(torch.float64)
    hi = (exact + bound).to(torch.float32).to(torch.bfloat16).to(torch.float64)
    return lo, hi


def assert_bf16_gemm(result: torch.Tensor, exact: torch.Tensor, abs_sum: torch.Tensor, terms: int) -> None:
    lo, hi = allowed_bf16(exact, abs_sum, terms)
    value = result.to(torch.float64)
    outside = (value < lo) | (value > hi)
    assert not outside.any(), (f"{int(outside.sum())} of {value.numel()} outside the fp32-accumulation interval; "
                               f"first at {outside.nonzero()[0].tolist()}")
    # The check is tight: most elements have exactly one allowed bf16 value (about 89% of them in the linear test,
    # where the bound, fp32's k * 2^-24 of the sum of |products|, reaches across a bf16 rounding boundary for the rest).
    assert (lo == hi).double().mean() > 0.75


def make(*shape, seed: int, requires_grad: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=gen) * torch.exp(torch.randn(*shape, generator=gen))  # spread the exponents
    return t.requires_grad_(requires_grad)


def test_the_check_rejects_a_gemm_that_does_not_accumulate_in_fp32():
    # A GEMM summing in bf16 (rounding after every addition) is outside the interval: the check can fail.
    x, w = make(16, 256, seed=1), make(8, 256, seed=2)
    xb, wb = bf16_values(x), bf16_values(w)
    acc = torch.zeros(16, 8, dtype=torch.bfloat16)
    for i in range(256):
        acc = (acc.float() + (xb[:, i:i + 1] * wb[:, i]).float()).to(torch.bfloat16)
    lo, hi = allowed_bf16(xb @ wb.T, xb.abs() @ wb.abs().T, 256)
    assert ((acc.double() < lo) | (acc.double() > hi)).any()


@pytest.mark.parametrize("bias", [True, False])
def test_linear_under_autocast_is_the_bf16_gemm_and_torch_bf16_is_the_same(bias):
    x, w = make(3, 37, 300, seed=3), make(50, 300, seed=4)
    b = make(50, seed=5) if bias else None
    xb, wb = bf16_values(x), bf16_values(w)
    exact = xb @ wb.T + (bf16_values(b) if bias else 0)
    abs_sum = xb.abs() @ wb.abs().T + (bf16_values(b).abs() if bias else 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with bf16_matmul_via_fp32(enabled=True) as state:
            y = F.linear(x, w, b)
        assert state.calls == 1 and state.kernel == "fp32 GEMM of bf16 operands"
        torch_y = F.linear(x, w, b)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 37, 50)
    assert_bf16_gemm(y, exact, abs_sum, 301)
    if not bias:  # torch's bf16 mm meets the same definition (with a bias, where it adds it is the kernel's choice)
        assert_bf16_gemm(torch_y, exact, abs_sum, 301)


def test_linear_gradients_are_bf16_gemms_as_torch_bf16_computes_them():
    x, w, b = make(4, 29, 96, seed=6, requires_grad=True), make(40, 96, seed=7, requires_grad=True), make(40, seed=8, requires_grad=True)
    g = make(4, 29, 40, seed=9).to(torch.bfloat16)  # the gradient arriving at a bf16 output is bf16
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_via_fp32(enabled=True) as state:
        y = F.linear(x, w, b)
    y.backward(g)
    assert state.calls == 1
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32  # autocast's casts hand back fp32
    gd, xb, wb = g.double().reshape(-1, 40), bf16_values(x.detach()).reshape(-1, 96), bf16_values(w.detach())
    assert_bf16_gemm(x.grad.reshape(-1, 96), gd @ wb, gd.abs() @ wb.abs(), 40)
    assert_bf16_gemm(w.grad, gd.T @ xb, gd.abs().T @ xb.abs(), 4 * 29)
    assert_bf16_gemm(b.grad, gd.sum(0), gd.abs().sum(0), 4 * 29)
    # torch's own bf16 backward meets the same definition
    x.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        F.linear(x, w, None).backward(g)
    assert_bf16_gemm(x.grad.reshape(-1, 96), gd @ wb, gd.abs() @ wb.abs(), 40)
    assert_bf16_gemm(w.grad, gd.T @ xb, gd.abs().T @ xb.abs(), 4 * 29)


@pytest.mark.parametrize("op", ["matmul", "@", "mm", "bmm", "broadcast"])
def test_matmuls_of_bf16_operands_and_their_gradients(op):
    shapes = {"matmul": ((5, 33, 70), (5, 70, 21)), "@": ((33, 70), (70, 21)), "mm": ((33, 70), (70, 21)),
              "bmm": ((5, 33, 70), (5, 70, 21)), "broadcast": ((2, 3, 33, 70), (70, 21))}[op]
    a = make(*shapes[0], seed=10).to(torch.bfloat16).requires_grad_()  # bf16 operands, no autocast
    b = make(*shapes[1], seed=11).to(torch.bfloat16).requires_grad_()
    call = {"matmul": torch.matmul, "@": lambda p, q: p @ q, "mm": torch.mm, "bmm": torch.bmm,
            "broadcast": torch.matmul}[op]
    with bf16_matmul_via_fp32(enabled=True) as state:
        out = call(a, b)
    assert state.calls == 1 and out.dtype == torch.bfloat16
    ad, bd = a.detach().double(), b.detach().double()
    assert_bf16_gemm(out, ad @ bd, ad.abs() @ bd.abs(), 70)
    g = make(*out.shape, seed=12).to(torch.bfloat16)
    out.backward(g)
    gd = g.double()
    assert a.grad.dtype == b.grad.dtype == torch.bfloat16
    assert_bf16_gemm(a.grad, gd @ bd.transpose(-1, -2), gd.abs() @ bd.abs().transpose(-1, -2), 21)
    batch = out.numel() // (33 * 21) if b.dim() < a.dim() else 1  # a broadcast b's gradient sums over the batch
    grad_b = (ad.transpose(-1, -2) @ gd).sum_to_size(b.shape)
    abs_b = (ad.abs().transpose(-1, -2) @ gd.abs()).sum_to_size(b.shape)
    assert_bf16_gemm(b.grad, grad_b, abs_b, 33 * batch)


def test_what_it_leaves_to_torch():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with bf16_matmul_via_fp32(enabled=True) as state:
        assert F.linear(x, w).dtype == torch.float32  # fp32 without autocast: not a bf16 matmul
        F.linear(x.double(), w.double())
        torch.matmul(x.bfloat16()[0], w.bfloat16()[0])  # vectors
        torch.matmul(x.bfloat16(), w.bfloat16().T, out=torch.empty(4, 3, dtype=torch.bfloat16))  # out=
        F.linear(torch.randn(4, 8, device="meta", dtype=torch.bfloat16),
                 torch.randn(3, 8, device="meta", dtype=torch.bfloat16))  # other devices (CUDA): torch's kernels
        with torch.autocast("cpu", dtype=torch.float16):
            F.linear(x, w)
        with pytest.raises(RuntimeError):
            torch.mm(x.bfloat16(), x.bfloat16())  # bad shapes keep torch's error
        assert state.calls == 0
    with pytest.raises(TypeError, match="argument 'enabled'"):
        with bf16_matmul_via_fp32(enabled="yes"):
            pass


def test_off_when_asked_and_by_default_where_the_cpu_has_bf16_units():
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_via_fp32(enabled=False) as state:
        assert not _get_current_function_mode_stack()
        F.linear(torch.randn(4, 8), torch.randn(3, 8))
    assert not state.enabled and state.calls == 0 and state.kernel == "torch bf16 matmul"
    # The automatic choice follows the CPU: on with no AVX-512 (so no AVX512-BF16 or AMX) or no bf16 units at all,
    # off where fp8mp's GEMM uses them.
    flags = cpu_flags()
    if best_isa_level() != "avx512" or not ({"avx512_bf16", "amx_bf16"} & flags):
        assert not cpu_has_bf16_matmul_units()
    with bf16_matmul_via_fp32() as state:
        assert state.enabled == (not cpu_has_bf16_matmul_units())
    if cpu_has_bf16_matmul_units():
        assert not state.enabled
    # FP8MP_CPU_ISA=avx2 runs what an AVX2-only CPU runs: there it is on, on every CPU (fp8mp reads it once per
    # process, so in a fresh one).
    code = ("from fp8mp.nn.bf16_via_fp32 import bf16_matmul_via_fp32, cpu_has_bf16_matmul_units\n"
            "with bf16_matmul_via_fp32() as state:\n"
            "    print(cpu_has_bf16_matmul_units(), state.enabled)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), FP8MP_CPU_ISA="avx2")
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["False", "True"]


def test_on_only_in_its_thread_and_block_and_no_global_state_changes():
    before = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.get_default_dtype(),
              torch.get_num_threads(), torch.backends.mkldnn.enabled)
    inside, outside = threading.Barrier(2, timeout=120), threading.Barrier(2, timeout=120)  # a failure never hangs
    seen = {}

    def other_thread():
        inside.wait()  # the main thread is inside the block now
        seen["modes"] = list(_get_current_function_mode_stack())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seen["y"] = F.linear(torch.randn(4, 8), torch.randn(3, 8))
        outside.wait()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with torch.autocast("cpu", dtype=torch.bfloat16), bf16_matmul_via_fp32(enabled=True) as state:
        assert len(_get_current_function_mode_stack()) == 1
        inside.wait()
        outside.wait()  # the other thread's linear ran while this block was open
        F.linear(torch.randn(4, 8), torch.randn(3, 8))
    thread.join()
    assert seen["modes"] == [] and seen["y"].dtype == torch.bfloat16
    assert state.calls == 1  # this thread's linear only
    assert not _get_current_function_mode_stack()
    with pytest.raises(ValueError):
        with bf16_matmul_via_fp32(enabled=True):
            raise ValueError("leaves the block")
    assert not _get_current_function_mode_stack()
    assert before == (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.get_default_dtype(),
                      torch.get_num_threads(), torch.backends.mkldnn.enabled)
