"""benchmarks/bench_step_in_backward.py: the gradient bytes each mode holds at once against formulas (every bf16
gradient after backward; the largest one, the tied embedding's, with the step in backward), the profiler's peak
of a known allocation pattern, and its rows."""
from __future__ import annotations

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_step_in_backward as bench  # noqa: E402
import bench_train_memory  # noqa: E402


def test_peak_of_the_profiled_allocations():
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(2**18)  # 1 MiB
        b = torch.empty(2**19)  # 2 MiB: 3 MiB live
        del a
        c = torch.empty(2**17)  # 2.5 MiB live
        del b, c
    assert bench.peak_allocated_bytes(prof, "cpu") == 3 * 2**20


def test_modes_hold_every_gradient_or_the_largest_one():
    spec = bench_train_memory.QUICK_MODELS["llama"]
    numel_embedding = spec.config["vocab_size"] * spec.config["hidden_size"]
    rows = {mode: bench.measure("llama", mode, quick=True, device="cpu", batch=None, seq=None, steps=1)
            for mode in bench.MODES}
    plain = rows["backward + step"]
    assert plain["grad_bytes_held"] == 2 * plain["params_numel"]  # bf16, the tied head counted once
    for mode in bench.MODES[1:]:
        assert rows[mode]["grad_bytes_held"] == 2 * numel_embedding
    assert all(r["peak_backward_step_bytes"] > 0 and r["step_cpu_s"] > 0 for r in rows.values())
