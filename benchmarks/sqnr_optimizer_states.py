"""How to keep AdamW's second moment in FP8: measured against an fp64 reference AdamW.

AdamW's v = EMA(g^2) spans the square of the gradients' dynamic range inside one block, so storing it
in E4M3 with one scale per block loses its small entries first, and those are the ones whose update
m / (sqrt(v) + eps) they blow up. Encodings of v (each with a per-block fp32 scale, blocks of 128 contiguous
elements; m is E4M3 with a per-block absmax scale in every row, rounded as v is):

  direct      v itself in E4M3, scale = amax(v) / 448
  sqrt        sqrt(v) in E4M3, scale = amax(sqrt v) / 448
  sqrt floor  the same, a positive sqrt(v) never stored as 0 (at least the smallest subnormal)
  dre         COAT's dynamic range expansion: |v|^k in E4M3 with k per block chosen so the block's
              max/min ratio fills E4M3's (448 / 2^-9), plus k per block

each rounded to nearest even (RNE) or stochastically (SR, the expected value kept), on a noisy quadratic whose
curvatures span six decades (gradients of very different sizes side by side, as in a network's layers), with
the gradient noise constant or shrinking 100x over the run (v must then follow it down by 0.1% a step at
beta2 = 0.999, below E4M3's spacing). Columns: the error of one update taken from quantized reference states
(shadow: the states follow the fp64 run, so the error is the encoding's alone), and where training ends
(each variant on its own trajectory: its distance to the fp64 run's parameters, and its loss over fp64's).

    python benchmarks/sqnr_optimizer_states.py --steps 300 --seeds 1 --n 4096

2026-12-05, torch 2.14.1 CPU (the numbers do not depend on the machine):

    noise constant       update err mean   max     |p-p64|/|p64-p0|  loss/loss64
    direct RNE / SR      3.0e6 / 3.0e6     5.5e6   nan               nan
    sqrt RNE             0.038             0.066   0.093             1.0072
    sqrt SR              10.0              2994    18.1              1.0077
    sqrt floor RNE       0.038             0.066   0.093             1.0072
    sqrt floor SR        0.054             0.095   0.071             1.0007
    dre RNE              0.042             0.094   0.095             1.0016
    dre SR               0.059             0.221   0.069             1.0002
    noise shrinking 100x
    direct RNE / SR      3.6e6 / 3.8e6     5.5e6   nan               nan
    sqrt RNE             0.040             0.068   0.207             0.9970
    sqrt SR              8.96              2672    14.7              1.0086
    sqrt floor RNE       0.040             0.068   0.207             0.9970
    sqrt floor SR        0.058             0.092   0.079             1.0002
    dre RNE              0.040             0.088   0.162             0.9660
    dre SR               0.058             0.232   0.064             0.9993

What fp8mp.optim stores, and why: sqrt(v), kept positive, rounded stochastically ("sqrt floor SR").
* v directly is unusable: a block's small v underflow to 0 while their m survive, and m / eps is a step
  millions of times too large (the NaN is the run diverging).
* sqrt(v) has m's range (v has twice it), so it fits the same E4M3 block as m does.
* Nearest rounding freezes an EMA whose step is below the format's spacing: with the noise shrinking, RNE's
  trajectories end 2.6x (sqrt) and 2.5x (dre) farther from fp64's than SR's; the same freeze made Lion's
  momentum (beta2 = 0.99) diverge on a small regression (tests/optim). SR costs a larger one-step error
  (0.054 against 0.038: its rounding error is up to a whole step, not half) and wins over a run.
* SR alone can round a small sqrt(v) to 0 under a surviving m (the 2994x update): the floor removes that,
  at a bias only below the smallest subnormal of the block.
* COAT's expansion with SR ends about as close (0.064-0.069 against 0.071-0.079) with a 2.5x larger worst
  one-step error, and costs a pow per element each way plus an exponent per block: not worth it here.
"""
from __future__ import annotations

import argparse
import math

import torch

BLOCK = 128
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0 ** -9


def e4m3_stochastic(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """fp32 x (within +-448) to E4M3, rounded to one of its two neighbours with the probability that keeps the
    expected value x (the kernels' rule, csrc/optim/optim_rule.h), from torch's own E4M3 cast and codes."""
    nearest = x.to(torch.float8_e4m3fn)
    code = nearest.view(torch.uint8).int()
    magnitude, sign = code & 0x7F, code & 0x80
    ax, an = x.abs(), nearest.float().abs()
    lo = torch.where(an > ax, magnitude - 1, magnitude).clamp(min=0)
    hi = torch.where((magnitude == 0x7E) & (an <= ax), lo, lo + 1)
    lo_value = lo.to(torch.uint8).view(torch.float8_e4m3fn).float()
    hi_value = hi.to(torch.uint8).view(torch.float8_e4m3fn).float()
    up = ((ax - lo_value) / (hi_value - lo_value)).nan_to_num(0.0)
    chosen = torch.where(torch.rand(x.shape, generator=gen) < up, hi, lo)
    chosen = torch.where(an == ax, magnitude, chosen)
    return (chosen | sign).to(torch.uint8).view(torch.float8_e4m3fn)


def e4m3_blocks(x: torch.Tensor, gen: torch.Generator | None = None, floor: bool = False) -> torch.Tensor:
    """x (fp64, numel divisible by BLOCK) through E4M3 with one absmax scale per block, back to fp64; rounded to
    nearest, or stochastically when a generator is given; `floor`: a positive value keeps at least the smallest
    subnormal code (never 0)."""
    blocks = x.view(-1, BLOCK)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).float().double()
    scaled = (blocks / scale).float()
    codes = scaled.to(torch.float8_e4m3fn) if gen is None else e4m3_stochastic(scaled, gen)
    if floor:
        codes = torch.where(scaled > 0, codes.view(torch.uint8).clamp(min=1), codes.view(torch.uint8))
        codes = codes.view(torch.float8_e4m3fn)
    return (codes.double() * scale).view_as(x)


def v_direct(v, gen=None):
    return e4m3_blocks(v, gen)


def v_sqrt(v, gen=None):
    return e4m3_blocks(v.sqrt(), gen) ** 2


def v_sqrt_floor(v, gen=None):
    return e4m3_blocks(v.sqrt(), gen, floor=True) ** 2


def v_dre(v, gen=None):
    blocks = v.view(-1, BLOCK)
    positive = torch.where(blocks > 0, blocks, torch.full_like(blocks, math.inf))
    vmin = positive.amin(dim=1, keepdim=True)
    vmax = blocks.amax(dim=1, keepdim=True)
    ratio = (vmax / vmin).clamp(min=1.0 + 1e-12)
    k = (math.log(E4M3_MAX / E4M3_MIN_SUBNORMAL) / ratio.log()).clamp(max=1.0)
    k = torch.where(torch.isfinite(k) & (vmax > 0), k, torch.ones_like(k)).float().double()  # stored in fp32
    expanded = blocks.clamp(min=0) ** k
    return (e4m3_blocks(expanded.reshape(-1), gen).view_as(blocks).clamp(min=0) ** (1.0 / k)).view_as(v)


# name -> (encoding of v, stochastic rounding of m and v)
ENCODINGS = {f"{name} {rounding}": (fn, rounding == "SR") for name, fn in
             (("direct", v_direct), ("sqrt", v_sqrt), ("sqrt floor", v_sqrt_floor), ("dre", v_dre)) for rounding in ("RNE", "SR")}


def update(m, v, step, lr, b1, b2, eps):
    return -lr / (1 - b1 ** step) * m / (v.sqrt() / math.sqrt(1 - b2 ** step) + eps)


def run(n, steps, seed, decay, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    """`decay`: the gradient noise shrinks by this factor over the run (a loss that goes down), so v must follow
    its gradients down, in steps of 0.1% per step at beta2 = 0.999."""
    gen = torch.Generator().manual_seed(seed)
    curvature = 10.0 ** (torch.rand(n, generator=gen, dtype=torch.float64) * 6 - 4)
    target = torch.randn(n, generator=gen, dtype=torch.float64)
    rounding = torch.Generator().manual_seed(seed + 12345)

    def grad(p, step):
        g = torch.Generator().manual_seed(seed * 100003 + step)
        noise = decay ** (-step / steps) * curvature.sqrt() * torch.randn(n, generator=g, dtype=torch.float64)
        return curvature * (p - target) + noise

    def loss(p):
        return float((0.5 * curvature * (p - target) ** 2).sum())

    p0 = torch.zeros(n, dtype=torch.float64)
    ref_p, ref_m, ref_v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    runs = {name: (p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)) for name in ENCODINGS}
    shadow = {name: [] for name in ENCODINGS}
    for step in range(1, steps + 1):
        g = grad(ref_p, step)
        ref_m.mul_(b1).add_(g, alpha=1 - b1)
        ref_v.mul_(b2).addcmul_(g, g, value=1 - b2)
        u_ref = update(ref_m, ref_v, step, lr, b1, b2, eps)
        for name, (encode_v, stochastic) in ENCODINGS.items():
            sr = rounding if stochastic else None
            u = update(e4m3_blocks(ref_m, sr), encode_v(ref_v, sr), step, lr, b1, b2, eps)
            shadow[name].append(float((u - u_ref).norm() / u_ref.norm()))
            p, m, v = runs[name]
            gq = grad(p, step)
            m.copy_(e4m3_blocks(m * b1 + (1 - b1) * gq, sr))
            v.copy_(encode_v(v * b2 + (1 - b2) * gq * gq, sr))
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
    parser.add_argument("--n", type=int, default=1 << 13)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    print(f"n={args.n} steps={args.steps} seeds={args.seeds}, blocks of {BLOCK}; m in E4M3 per block in every row, "
          "rounded as v is (RNE: nearest even, SR: stochastic)")
    for decay in (1.0, 100.0):
        print(f"\ngradient noise shrinking {decay:g}x over the run")
        print(f"{'v stored as':<18}{'update rel. err mean':>22}{'max':>10}{'final |p-p64|/|p64-p0|':>25}"
              f"{'loss/loss64':>14}")
        totals = {name: [0.0] * 4 for name in ENCODINGS}
        for seed in range(args.seeds):
            for name, row in run(args.n, args.steps, seed, decay).items():
                totals[name] = [t + r / args.seeds for t, r in zip(totals[name], row)]
        for name, (mean, worst, dist, loss_ratio) in totals.items():
            print(f"{name:<18}{mean:>22.4f}{worst:>10.4g}{dist:>25.4f}{loss_ratio:>14.4f}")


if __name__ == "__main__":
    main()
