"""How to keep AdamW's second moment in FP8: measured against an fp64 reference AdamW.

AdamW's v = EMA(g^2) spans the square of the gradients' dynamic range inside one block, so storing it
in E4M3 with one scale per block loses its small entries first, and those are the ones whose update
m / (sqrt(v) + eps) they blow up. Three encodings of v (each with a per-block fp32 scale, blocks of
128 contiguous elements; m is E4M3 with a per-block absmax scale in every case) are compared:

  direct  v itself in E4M3, scale = amax(v) / 448
  sqrt    sqrt(v) in E4M3, scale = amax(sqrt v) / 448 (what fp8mp.optim stores)
  dre     COAT's dynamic range expansion: |v|^k in E4M3 with k per block chosen so the block's
          max/min ratio fills E4M3's (448 / 2^-9), plus k per block

on a noisy quadratic whose curvatures span six decades (gradients of very different sizes side by side,
as in a network's layers), both as the error of one update taken from quantized reference states
(shadow: the states follow the fp64 run, so the error is the encoding's alone) and as where training
ends (each variant on its own trajectory, its distance to the fp64 run's parameters and its loss).

    python benchmarks/sqnr_optimizer_states.py
"""
from __future__ import annotations

import argparse
import math

import torch

BLOCK = 128
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0 ** -9


def e4m3_blocks(x: torch.Tensor) -> torch.Tensor:
    """x (fp64, numel divisible by BLOCK) through E4M3 with one absmax scale per block, back to fp64."""
    blocks = x.view(-1, BLOCK)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).float().double()
    codes = (blocks / scale).float().to(torch.float8_e4m3fn)
    return (codes.double() * scale).view_as(x)


def v_direct(v):
    return e4m3_blocks(v)


def v_sqrt(v):
    return e4m3_blocks(v.sqrt()) ** 2


def v_dre(v):
    blocks = v.view(-1, BLOCK)
    positive = torch.where(blocks > 0, blocks, torch.full_like(blocks, math.inf))
    vmin = positive.amin(dim=1, keepdim=True)
    vmax = blocks.amax(dim=1, keepdim=True)
    ratio = (vmax / vmin).clamp(min=1.0 + 1e-12)
    k = (math.log(E4M3_MAX / E4M3_MIN_SUBNORMAL) / ratio.log()).clamp(max=1.0)
    k = torch.where(torch.isfinite(k) & (vmax > 0), k, torch.ones_like(k)).float().double()  # stored in fp32
    expanded = blocks.clamp(min=0) ** k
    return (e4m3_blocks(expanded.reshape(-1)).view_as(blocks).clamp(min=0) ** (1.0 / k)).view_as(v)


ENCODINGS = {"direct": v_direct, "sqrt": v_sqrt, "dre": v_dre}


def update(m, v, step, lr, b1, b2, eps):
    return -lr / (1 - b1 ** step) * m / (v.sqrt() / math.sqrt(1 - b2 ** step) + eps)


def run(n, steps, seed, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    gen = torch.Generator().manual_seed(seed)
    curvature = 10.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 6 - 4)
    target = torch.randn(n, generator=gen, dtype=torch.float64)
    noise = [torch.Generator().manual_seed(seed * 1000 + s) for s in range(1)]

    def grad(p, step):
        g = torch.Generator().manual_seed(seed * 100003 + step)
        return curvature * (p - target) + 0.1 * curvature.sqrt() * torch.randn(n, generator=g, dtype=torch.float64)

    def loss(p):
        return float((0.5 * curvature * (p - target) ** 2).sum())

    del noise
    p0 = torch.zeros(n, dtype=torch.float64)
    ref_p, ref_m, ref_v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    runs = {name: (p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)) for name in ENCODINGS}
    shadow = {name: [] for name in ENCODINGS}
    for step in range(1, steps + 1):
        g = grad(ref_p, step)
        ref_m.mul_(b1).add_(g, alpha=1 - b1)
        ref_v.mul_(b2).addcmul_(g, g, value=1 - b2)
        u_ref = update(ref_m, ref_v, step, lr, b1, b2, eps)
        for name, encode_v in ENCODINGS.items():
            u = update(e4m3_blocks(ref_m), encode_v(ref_v), step, lr, b1, b2, eps)
            shadow[name].append(float((u - u_ref).norm() / u_ref.norm()))
            p, m, v = runs[name]
            gq = grad(p, step)
            m.copy_(e4m3_blocks(m * b1 + (1 - b1) * gq))
            v.copy_(encode_v(v * b2 + (1 - b2) * gq * gq))
            p.mul_(1 - lr * wd).add_(update(m, v, step, lr, b1, b2, eps))
        ref_p.mul_(1 - lr * wd).add_(u_ref)
    rows = {}
    for name in ENCODINGS:
        errs = torch.tensor(shadow[name])
        p = runs[name][0]
        rows[name] = (float(errs.mean()), float(errs.max()), float((p - ref_p).norm() / (ref_p - p0).norm()),
                      loss(p) / loss(ref_p))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1 << 16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    print(f"n={args.n} steps={args.steps} seeds={args.seeds}, blocks of {BLOCK}, m in E4M3 per block in every row")
    print(f"{'v stored as':<12}{'update rel. err mean':>22}{'max':>10}{'final |p-p64|/|p64-p0|':>25}{'loss/loss64':>14}")
    totals = {name: [0.0] * 4 for name in ENCODINGS}
    for seed in range(args.seeds):
        for name, row in run(args.n, args.steps, seed).items():
            totals[name] = [t + r / args.seeds for t, r in zip(totals[name], row)]
    for name, (mean, worst, dist, loss_ratio) in totals.items():
        print(f"{name:<12}{mean:>22.4f}{worst:>10.4f}{dist:>25.4f}{loss_ratio:>14.4f}")


if __name__ == "__main__":
    main()
