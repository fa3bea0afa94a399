"""The GPT example's outputs: the side-by-side table and the loss-curve PNG."""
from __future__ import annotations

import os


GOAL = 0.005  # FP8 final loss within 0.5% (relative) of the baseline
FP32_GEMM_OF_BF16 = "fp32 GEMM of bf16 operands"  # fp8mp.nn.bf16_via_fp32.Bf16ViaFp32State.kernel


def relative(value: float, baseline: float) -> float:
    return (value - baseline) / baseline


def report_table(results) -> str:
    """One row per run: final losses, their relative difference from BF16 and FP32, speed, memory; a run whose bf16
    matmuls' kernel is known (the BF16 run) is named with it."""
    by_name = {r.name: r for r in results}
    bf16, fp32 = by_name["BF16"], by_name["FP32"]
    gpu = any(getattr(r, "peak_gpu_mib", None) is not None for r in results)
    header = ("run", "train loss", "val loss", "val vs BF16", "val vs FP32", "train vs BF16", "train vs FP32", "median step",
              "peak RSS") + (("peak GPU memory",) if gpu else ())
    rows = [header]
    for r in results:
        rows.append((
            getattr(r, "label", r.name), f"{r.final_train:.4f}", f"{r.final_val:.4f}",
            f"{relative(r.final_val, bf16.final_val):+.2%}", f"{relative(r.final_val, fp32.final_val):+.2%}",
            f"{relative(r.final_train, bf16.final_train):+.2%}", f"{relative(r.final_train, fp32.final_train):+.2%}",
            f"{r.median_step_s * 1000:.0f} ms", f"{r.peak_rss_mib:.0f} MiB",
        ) + ((f"{r.peak_gpu_mib:.0f} MiB",) if gpu else ()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    lines.append("train loss: mean over the last 10% of steps (same batches in every run); val loss: final evaluation.")
    if getattr(bf16, "matmul_kernel", None) == FP32_GEMM_OF_BF16:
        # The numbers are BF16's, the speed is not: every speed ratio against BF16 is against torch's bf16 matmul.
        lines.append(f"BF16 ({FP32_GEMM_OF_BF16}): this CPU has no bf16 matrix units, where torch's bf16 matmul is "
                     "oneDNN's emulation (~100x slower), so BF16's matmuls ran as fp32 GEMMs of their bf16 operands, "
                     "rounded to bf16: torch's bf16 numbers (the same products, fp32 sums, one rounding), not its "
                     "speed. Its step time is not torch's bf16 path's: --bf16-gemm torch runs that.")
    fp8 = by_name["FP8"]
    for base in (bf16, fp32):
        diff = relative(fp8.final_val, base.final_val)
        verdict = "within" if abs(diff) <= GOAL else "NOT within"
        lines.append(f"FP8 final val loss vs {base.name}: {diff:+.3%}, {verdict} the {GOAL:.1%} goal")
    for peer in (r for r in results if r.name not in ("FP8", "BF16", "FP32")):
        lines.append(f"FP8 final val loss vs {peer.name}: {relative(fp8.final_val, peer.final_val):+.3%} (one seed)")
    # One seed's gap says little either way: at 200 steps this model's loss is chaotic, and the gap between any two
    # precisions moves by several percent from seed to seed (train_gpt.py's docstring; README has a 5-seed table).
    lines.append("These gaps are one seed's: they move by several percent from seed to seed. For FP8 against torchao's "
                 "FP8 per seed and against BF16 over 5 seeds' mean: python examples/train_gpt.py --peer torchao --seeds 5")
    return "\n".join(lines)


def seed_table(per_seed: list[dict[str, float]], peer: str | None, lean_peer: str | None = None) -> str:
    """Markdown: final val loss per seed of each run, each FP8 run's relative gaps to its peer (if any) and to BF16,
    the means over seeds, and whether each FP8 run's mean is within GOAL of BF16's."""
    subjects = [("FP8", peer)] + ([("FP8 memory-lean", lean_peer)] if "FP8 memory-lean" in per_seed[0] else [])
    names = [name for subject in subjects for name in subject if name] + ["BF16"]
    comparisons = [(subject, base) for subject, subject_peer in subjects
                   for base in ([subject_peer] if subject_peer else []) + ["BF16"]]
    header = ["seed", *names, *(f"{subject} vs {base}" for subject, base in comparisons)]
    rows = []
    for seed, losses in enumerate(per_seed):
        gaps = [relative(losses[subject], losses[base]) for subject, base in comparisons]
        rows.append([str(seed), *(f"{losses[n]:.4f}" for n in names), *(f"{g:+.2%}" for g in gaps)])
    means = {n: sum(s[n] for s in per_seed) / len(per_seed) for n in names}
    mean_gaps = [relative(means[subject], means[base]) for subject, base in comparisons]
    rows.append([f"mean of {len(per_seed)}", *(f"{means[n]:.4f}" for n in names), *(f"{g:+.2%}" for g in mean_gaps)])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    for subject, _ in subjects:
        gap = relative(means[subject], means["BF16"])
        lines.append(f"{subject} mean final val loss vs BF16: {gap:+.3%}, "
                     f"{'within' if abs(gap) <= GOAL else 'NOT within'} the {GOAL:.1%} goal")
    return "\n".join(lines)


def _smooth(values: list[float], weight: float = 0.9) -> list[float]:
    out, avg = [], values[0]
    for v in values:
        avg = weight * avg + (1 - weight) * v
        out.append(avg)
    return out


def plot_losses(results, path: str) -> str:
    """Train loss (raw, faint, and smoothed), val loss, and FP8's relative gap to each baseline; returns `path`."""
    import matplotlib  # only for the pictures: the tables need no matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig, (ax_train, ax_val, ax_gap) = plt.subplots(1, 3, figsize=(15, 4.2))
    by_name = {r.name: r for r in results}
    for r in results:
        steps = range(1, len(r.train_losses) + 1)
        (line,) = ax_train.plot(steps, _smooth(r.train_losses), label=r.name, linewidth=1.4)
        ax_train.plot(steps, r.train_losses, color=line.get_color(), alpha=0.2, linewidth=0.8)
        ax_val.plot(r.val_steps, r.val_losses, marker="o", label=r.name, color=line.get_color())
    fp8 = by_name["FP8"]
    for base in (by_name["BF16"], by_name["FP32"]):
        gap = [100 * relative(a, b) for a, b in zip(_smooth(fp8.train_losses), _smooth(base.train_losses))]
        ax_gap.plot(range(1, len(gap) + 1), gap, label=f"FP8 vs {base.name}")
    ax_gap.axhspan(-100 * GOAL, 100 * GOAL, color="green", alpha=0.1, label="±0.5%")
    for ax, title in ((ax_train, "train loss (smoothed; raw faint)"), (ax_val, "validation loss"), (ax_gap, "smoothed train loss gap, %")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
