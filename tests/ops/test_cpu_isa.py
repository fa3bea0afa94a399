"""The level of the CPU's vector instructions fp8mp's loops run with (csrc/common/cpu_isa.h): the one
/proc/cpuinfo says this CPU has, and every lower level FP8MP_CPU_ISA asks for writes the same bits as the best
one (the casts, norms and their FP8 outputs here; the optimizer steps in tests/optim/test_optim_cpu_paths.py), so
that one machine runs the loops an AVX2-only or a baseline x86-64 CPU runs. What the best level writes is held
to independent references by the op tests (ml_dtypes, float64 formulas)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cpu_levels import ISA_LEVELS, best_isa_level, choice_in_a_fresh_process, why_not
from fp8mp.ops import cpu_isa

WORKER = Path(__file__).with_name("cpu_isa_worker.py")


def run_worker(tmp_path_factory, level: str | None) -> dict:
    out = tmp_path_factory.mktemp("cpu_isa") / "out.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("FP8MP_CPU_ISA", None)
    env.pop("FP8MP_CPU_GEMM", None)
    if level:
        env["FP8MP_CPU_ISA"] = level
    subprocess.run([sys.executable, str(WORKER), str(out)], env=env, check=True, timeout=600)
    return torch.load(out)


@pytest.fixture(scope="module")
def best_run(tmp_path_factory):
    return run_worker(tmp_path_factory, None)


@pytest.fixture(scope="module", params=ISA_LEVELS)
def lower_run(request, tmp_path_factory):
    level = request.param
    if why_not(level):
        pytest.skip(why_not(level))
    return level, run_worker(tmp_path_factory, level)


@pytest.mark.skipif(bool(os.environ.get("FP8MP_CPU_ISA")), reason="FP8MP_CPU_ISA set for this process")
def test_the_level_is_the_one_proc_cpuinfo_names():
    assert cpu_isa() == best_isa_level()


def test_the_asked_for_level_runs(lower_run):
    level, results = lower_run
    assert results["cpu_isa"] == level
    if level != "avx512":  # no AVX-512: neither bf16 GEMM kernel
        assert results["cpu_gemm_path"] == "fp32"


@pytest.mark.parametrize("family", ["casts", "norms"])
def test_every_level_writes_the_best_levels_bits(best_run, lower_run, family):
    level, results = lower_run
    assert results[family].keys() == best_run[family].keys()
    for case, written in best_run[family].items():
        for i, (a, b) in enumerate(zip(written, results[family][case], strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape, (case, i)
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), \
                f"{family} {case}: output {i} differs between {best_run['cpu_isa']} and {level}"


def test_the_comparison_sees_nans_and_saturation(best_run):
    """The cast cases do hold NaN inputs, values beyond E4M3's range and subnormal outputs."""
    y, amax = best_run["casts"]["bf16", "e4m3", 1.0][:2]
    codes = y.view(torch.uint8) & 0x7F
    assert amax.isnan().all() and (codes == 0x7F).any() and (codes == 0x7E).any() and ((codes > 0) & (codes < 8)).any()


def test_an_unknown_level_warns_and_runs_the_best():
    level, message = choice_in_a_fresh_process("FP8MP_CPU_ISA", "sse2", "cpu_isa")
    assert level == best_isa_level()
    assert "FP8MP_CPU_ISA='sse2' is not one of avx512, avx2, baseline" in message
