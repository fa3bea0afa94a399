"""benchmarks/gpu_check.sh runs end to end: `--dry-run` takes every step on the CPU with tiny sizes.

The GPU run (the same script without --dry-run) needs a GPU, which the test machines lack;
the dry run keeps the script from rotting where none is present.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ["versions", "build", "tests", "bench_cast", "bench_cast_transpose", "bench_gemm", "bench_gemm_fast_accum",
         "bench_linear", "bench_norm", "bench_gpt_step"]


def run_dry(out_dir: pathlib.Path, budget_s: int, timeout_s: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out_dir), PYTHON=sys.executable, GPU_CHECK_BUDGET_S=str(budget_s),
               PYTHONPATH=str(ROOT))
    env.pop("FP8MP_TEST_TIMEOUT", None)
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)


def step_files(out_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    return {re.sub(r"^\d\d_", "", p.stem): p for p in out_dir.glob("[0-9][0-9]_*.txt")}


def test_dry_run_takes_every_step_and_keeps_each_result(tmp_path):
    result = run_dry(tmp_path, budget_s=2160, timeout_s=2200)  # the dry run's default budget (4 x 540 s)
    log = (tmp_path / "gpu_check.log").read_text()
    assert result.returncode == 0, log[-4000:]
    assert "all steps passed" in log
    files = step_files(tmp_path)
    assert list(files) == STEPS or sorted(files) == sorted(STEPS)
    assert "torch" in files["versions"].read_text()
    assert "CUDA kernels:" in files["build"].read_text()
    assert re.search(r"slowest \d+ durations|no tests ran|deselected|skipped", files["tests"].read_text())
    for name in STEPS[3:]:
        text = files[name].read_text()
        assert "|---:|" in text, (name, text[-2000:])  # the benchmark's markdown table
        assert text in log  # and the log has it too
    assert "goal: bandwidth >= 85% of x.clone()" in files["bench_cast_transpose"].read_text()


def test_a_short_budget_skips_late_steps_but_keeps_early_results(tmp_path):
    # 15 s: the first steps fit on any machine (versions alone, if slow, is cut at 10 s and still keeps what
    # it printed), but ten steps that each start a Python with torch never do. 40 s was enough for every
    # step on CI's faster machine, so the budget never ran out there.
    result = run_dry(tmp_path, budget_s=15, timeout_s=160)
    log = (tmp_path / "gpu_check.log").read_text()
    assert result.returncode != 0
    files = step_files(tmp_path)
    versions = files["versions"].read_text()
    assert versions.strip() and versions in log  # the first step's output survives the later timeouts
    last = files[max(files, key=lambda name: STEPS.index(name))].read_text()
    assert "SKIPPED: no time left" in last or "TIMED OUT" in last  # the step the budget ran out in says so
    assert "FAILED" in log or "BUILD FAILED" in log


def test_script_budget_fits_one_device_call():
    text = SCRIPT.read_text()
    assert "BUDGET_S=${GPU_CHECK_BUDGET_S:-$(( 540 * SCALE ))}" in text
    assert "SCALE=${GPU_CHECK_STEP_SCALE:-$(( DRY_RUN ? 4 : 1 ))}" in text
    limits = [int(m) for m in re.findall(r"run_step \w+ (\d+) ", text)]
    assert len(limits) == len(STEPS)
    assert sum(limits) <= 540  # each step's own cap, before the running budget clamps them further
