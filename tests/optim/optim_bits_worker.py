"""Runs fp8mp::adamw_step and fp8mp::lion_step over every dtype combination, sizes with tails, and inputs holding
NaN, Inf, subnormals and every E4M3 code, and saves what they wrote (torch.save): a process per configuration of
the CPU kernels (thread count, FP8MP_CPU_OPTIM, FP8MP_CPU_ISA; the level that ran saved as "cpu_isa"), which test_optim_cpu_paths.py compares bit for bit.

    python optim_bits_worker.py OUT THREADS
"""
from __future__ import annotations

import itertools
import sys

import torch

import fp8mp
from fp8mp.ops import optim as optim_ops

STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
PARAM_DTYPES = (torch.float32, torch.bfloat16)
# 1 and 17: less than a vector; 127, 129: around one state block; 5 * 8192 + 77: several of the kernels'
# parallel chunks (64 blocks each) and a short last block.
SIZES = (1, 17, 127, 129, 5 * 8192 + 77)


def inputs(gen, numel, param_dtype, grad_dtype, state_dtype, states):
    p = (torch.randn(numel, generator=gen) * 3).to(param_dtype)
    g = torch.randn(numel, generator=gen, dtype=torch.float64) * 10.0 ** (torch.rand(numel, generator=gen) * 12 - 9)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-40, -3e38, 0.0, -0.0])
    g[: min(numel, len(specials))] = specials[: min(numel, len(specials))].double()
    g = g.to(grad_dtype)
    values, scales = [], []
    for _ in range(states):
        if state_dtype == torch.float8_e4m3fn:
            codes = torch.randint(0, 256, (numel,), generator=gen, dtype=torch.uint8)
            codes[: min(numel, 256)] = torch.arange(256, dtype=torch.uint8)[: min(numel, 256)]
            values.append(codes.view(torch.float8_e4m3fn))
            scales.append(torch.rand(optim_ops.state_scale_numel(numel), generator=gen) * 1e-2)
        else:
            v = torch.rand(numel, generator=gen) * 1e-3
            v[numel // 2] = float("nan")
            values.append(v.to(state_dtype))
            scales.append(None)
    return p, g, values, scales


def main(out: str, threads: int) -> None:
    torch.set_num_threads(threads)
    results = {}
    for op, state_dtype, param_dtype, grad_dtype, numel in itertools.product(
            ("adamw", "lion"), STATE_DTYPES, PARAM_DTYPES, PARAM_DTYPES, SIZES):
        gen = torch.Generator().manual_seed(numel)
        p, g, states, scales = inputs(gen, numel, param_dtype, grad_dtype, state_dtype, 2 if op == "adamw" else 1)
        step = torch.zeros(1, dtype=torch.int64)
        written = []
        for _ in range(2):
            if op == "adamw":
                optim_ops.adamw_step(p, g, states[0], scales[0], states[1], scales[1], step, None, lr=1e-2, beta1=0.9,
                                     beta2=0.999, eps=1e-8, weight_decay=0.1, seed=numel)
            else:
                optim_ops.lion_step(p, g, states[0], scales[0], step, None, lr=1e-3, beta1=0.9, beta2=0.99,
                                    weight_decay=0.1, seed=-numel)
            written += [t.clone() for t in (p, *states, *scales, step) if t is not None]
        results[(op, str(state_dtype), str(param_dtype), str(grad_dtype), numel)] = written
    results["cpu_isa"] = fp8mp.ops.cpu_isa()
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
