"""Where the time of bench_grouped_gemm.py's Qwen3-MoE training step goes, FP8 (fp8mp) against BF16, by torch.profiler.

    python benchmarks/profile_moe_step.py --threads 1

Prints milliseconds per step (CPU time, inclusive) for the parts of the step: the experts' forward and backward
as a whole, and within them the FP8 grouped linear's pieces (the per-expert weight casts, the token and
gradient casts, the grouped GEMMs), the routing ops, and the attention projections'
FP8 GEMMs and casts. Parts nest (the experts' forward holds its weight casts), so the column does not add up
to the step. The pieces of the grouped linear are found by wrapping the per-tensor grouped call's helpers
(fp8mp/scaling/per_tensor_grouped.py) in profiler ranges; a helper missing there is left out.
"""
from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import torch
from torch.profiler import profile, record_function

from bench_grouped_gemm import qwen3_moe_step
from timing import markdown_table, where

# fp8mp.scaling.per_tensor_grouped's helpers -> the part of the step they are
GROUPED_LINEAR_PARTS = {
    "cast_per_expert": "experts: per-expert weight casts (amax, scale, cast)",
    "cast_tensorwise_transpose": "experts: token and gradient casts (+ transpose)",
    "fp8_grouped_gemm": "experts: grouped GEMMs fprop + dgrad",
    "fp8_grouped_gemm_wgrad": "experts: grouped GEMM wgrad",
}
EXPERTS_FORWARD = "experts forward (total)"
EXPERTS_BACKWARD = "experts backward (total)"
BACKWARD_NODES = ("GroupedLinearFunctionBackward", "GroupedMmBackward0")
ROUTING_OPS = ("aten::sort", "aten::bincount", "aten::histc", "aten::index", "aten::index_select", "aten::index_copy_",
               "aten::_index_put_impl_", "aten::topk")
ROUTING = "routing: sort, gather, scatter, top-k (self time)"
OP_PARTS = {"aten::_grouped_mm": "experts: torch._grouped_mm (BF16)",
            "fp8mp::fp8_gemm": "attention projections: fp8_gemm",
            "fp8mp::cast_to_fp8_transpose": "all cast_to_fp8_transpose calls (attention and experts)"}


def in_range(label: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapped


def label_parts() -> None:
    """Wrap the grouped linear's helpers and both experts implementations in profiler ranges."""
    import fp8mp.scaling.per_tensor_grouped as per_tensor_grouped
    from transformers.integrations import moe

    import fp8mp.integrations.hf_moe as hf_moe

    for name, label in GROUPED_LINEAR_PARTS.items():
        if hasattr(per_tensor_grouped, name):
            setattr(per_tensor_grouped, name, in_range(label, getattr(per_tensor_grouped, name)))
    moe.ExpertsInterface.register(hf_moe.EXPERTS_IMPLEMENTATION, in_range(EXPERTS_FORWARD, hf_moe.fp8_experts_forward))
    moe.ExpertsInterface.register("grouped_mm", in_range(EXPERTS_FORWARD, moe.grouped_mm_experts_forward))


def profile_step(step, steps: int) -> tuple[float, dict[str, float]]:
    """(wall seconds per step under the profiler, {part: CPU ms per step})."""
    for _ in range(2):
        step()
    parts = defaultdict(float)
    with profile() as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - started) / steps
    labels = set(GROUPED_LINEAR_PARTS.values()) | {EXPERTS_FORWARD}
    for event in prof.key_averages():
        total_ms, self_ms = event.cpu_time_total / 1e3 / steps, event.self_cpu_time_total / 1e3 / steps
        if event.key in labels:
            parts[event.key] += total_ms
        elif event.key in BACKWARD_NODES:
            parts[EXPERTS_BACKWARD] += total_ms
        elif event.key in OP_PARTS:
            parts[OP_PARTS[event.key]] += total_ms
        if event.key in ROUTING_OPS:
            parts[ROUTING] += self_ms
    return wall, parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for both runs")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per run (after 2 warm-up steps)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    steps, model = qwen3_moe_step("cpu")
    label_parts()
    fp8_wall, fp8 = profile_step(steps["fp8mp"], args.steps)
    bf16_wall, bf16 = profile_step(steps["bf16"], args.steps)
    names = sorted(set(fp8) | set(bf16), key=lambda n: -max(fp8.get(n, 0), bf16.get(n, 0)))
    rows = [["whole step (wall)", f"{fp8_wall * 1e3:.1f}", f"{bf16_wall * 1e3:.1f}"]]
    rows += [[n, f"{fp8[n]:.1f}" if n in fp8 else "", f"{bf16[n]:.1f}" if n in bf16 else ""] for n in names]
    print(markdown_table(f"Qwen3-MoE step ({model}), ms per step under torch.profiler, {where('cpu')}",
                         ["part", "FP8 (fp8mp)", "BF16 (grouped_mm)"], rows))
    print(f"BF16 / FP8 step time under the profiler: {bf16_wall / fp8_wall:.2f}x")


if __name__ == "__main__":
    main()
