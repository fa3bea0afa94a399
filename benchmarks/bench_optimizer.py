"""One optimizer step of fp8mp.optim.AdamW against torch.optim.AdamW(foreach=True) at equal parameter count.

Parameters: a few large tensors (default 4096x4096 + 2048x4096 + 4096 = 25.2M parameters, like the linear
layers of a small model), random gradients, timed over whole `optimizer.step()` calls after a warm-up
(states exist). Rows, all in one run (the peers timed in turn, rounds over, medians of medians):

  torch AdamW foreach          fp32 params, fp32 states (8 bytes of state a parameter): the peer
  fp8mp AdamW fp32 states      the same arithmetic in one fused op per parameter
  fp8mp AdamW bf16 states
  fp8mp AdamW fp8 states       E4M3 m and sqrt(v), a float32 scale per 128 elements (2.06 bytes)
  ... and the same without the on-device non-finite check (skip_nonfinite=False: what a LossScaler user runs)
  with --bf16-params: bf16 parameters and gradients, torch's AdamW keeping bf16 states, fp8mp's
  stochastically rounding the parameters.

The ratio is the peer's time over the row's (> 1: fp8mp faster). The bytes column is the optimizer state held,
per parameter (state_bytes for fp8mp, the exp_avg / exp_avg_sq / step tensors for torch).

    python benchmarks/bench_optimizer.py [--device cpu|cuda] [--shapes 4096x4096,2048x4096,4096] [--bf16-params]
        [--threads N]

--threads sets torch's intra-op threads of this process (CPU): 1 measures the arithmetic and the bytes alone,
apart from how promptly a busy host wakes the other threads of each parallel region (torch's foreach step runs
several regions per tensor, fp8mp's one).

Results (machine, date, command): benchmarks/RESULTS.md. The non-finite check is one more read of every
gradient (torch.aminmax).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import markdown_table, time_peers, where  # noqa: E402

from fp8mp.optim import AdamW  # noqa: E402


def make_params(shapes, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype=dtype, device=device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(dtype=dtype, device=device)
        params.append(p)
    return params


def torch_state_bytes(optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", default="4096x4096,2048x4096,4096")
    parser.add_argument("--bf16-params", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for this process")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    dtype = torch.bfloat16 if args.bf16_params else torch.float32
    numel = sum(torch.Size(s).numel() for s in shapes)

    optimizers = {"torch AdamW foreach": torch.optim.AdamW(make_params(shapes, dtype, args.device), lr=1e-3,
                                                           weight_decay=0.01, foreach=True)}
    for name, state_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        for skip in (True, False):
            label = f"fp8mp AdamW {name} states" + ("" if skip else ", no non-finite check")
            optimizers[label] = AdamW(make_params(shapes, dtype, args.device), lr=1e-3, weight_decay=0.01,
                                      state_dtype=state_dtype, skip_nonfinite=skip)
    for opt in optimizers.values():
        opt.step()  # create the states
    results = time_peers({name: opt.step for name, opt in optimizers.items()}, args.device, rounds=args.rounds,
                         min_repeats=3, min_seconds=1.0)
    peer = results["torch AdamW foreach"][0]
    rows = []
    for name, opt in optimizers.items():
        seconds = results[name][0]
        state = opt.state_bytes() if isinstance(opt, AdamW) else torch_state_bytes(opt)
        rows.append([name, f"{seconds * 1e3:.1f}", f"{peer / seconds:.2f}x", f"{state / numel:.3f}"])
    title = (f"optimizer step, {numel / 1e6:.1f}M {str(dtype).removeprefix('torch.')} parameters "
             f"({args.shapes}), {where(args.device)}")
    print(markdown_table(title, ["optimizer", "ms / step", "torch / this", "state bytes / param"], rows))


if __name__ == "__main__":
    main()
