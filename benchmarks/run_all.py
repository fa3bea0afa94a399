"""Run every fp8mp benchmark and write benchmarks/RESULTS.md (+ a speed-up plot).

    python benchmarks/run_all.py [--device cpu|cuda] [--out benchmarks/RESULTS.md] [--quick]

Each benchmark measures its peers in the same run (torch eager, torchao's
emulated Float8Linear on CPU, torch._scaled_mm and BF16 on GPU) and reports
ratios; this script only collects their tables, adds the machine, date and
command, and plots speed-up against size.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import math
import os
import platform
import sys
import time

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mp  # noqa: E402
from timing import cpu_matrix_units  # noqa: E402

# (name, module, run() kwargs); every module has run(device, **kwargs) and table(rows, device).
BENCHMARKS = [
    ("cast", "bench_cast", {}),
    ("cast_transpose", "bench_cast", {"transpose": True}),
    ("gemm", "bench_gemm", {}),
    ("gemm_paths", "bench_gemm_paths", {}),
    ("norm", "bench_norm", {}),
    ("linear", "bench_linear", {}),
    ("gpt_step", "bench_gpt_step", {}),
    ("memory", "bench_memory", {}),
]
# --quick: smaller problems (CPU runs in about a minute).
QUICK = {
    "cast": {"sizes": "1M,16M"},
    "cast_transpose": {"sizes": "1M,16M"},
    "gemm": {"sizes": "512x1024x1024"},
    "gemm_paths": {"sizes": "512x1024x1024"},
    "linear": {"shapes": "4096x1024x1024"},
}


def machine_description(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    desc = f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    if device == "cpu":
        desc += f"; {cpu_matrix_units()}; fp8_gemm CPU path: {fp8mp.ops.cpu_gemm_path()}"
    if device == "cuda":
        desc += f"; GPU {torch.cuda.get_device_name()}"
    return f"{desc}; torch {torch.__version__}; fp8mp {fp8mp.__version__}; Python {platform.python_version()}"


def run_benchmarks(device: str, quick: bool) -> tuple[dict[str, list[dict]], list[str]]:
    results, sections = {}, []
    for name, module_name, kwargs in tqdm(BENCHMARKS, desc=f"benchmarks ({device})", unit="bench"):
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            sections.append(f"### {name}\n\nnot run: {error}")
            continue
        started = time.perf_counter()
        try:
            rows = module.run(device, **kwargs, **(QUICK.get(name, {}) if quick else {}))
        except (SystemExit, RuntimeError) as error:  # a benchmark that does not run on this device
            sections.append(f"### {name}\n\nnot run on {device}: {error}")
            continue
        results[name] = rows
        sections.append(module.table(rows, device) + f"\n\n({time.perf_counter() - started:.0f} s)")
    return results, sections


def shape_size(shape: str) -> int:
    return math.prod(int(v) for v in shape.split("x"))


def plot_speedups(results: dict[str, list[dict]], device: str, path: str) -> str | None:
    """Speed-up of fp8mp over its main peer against problem size, one line per benchmark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {
        "cast vs eager": [(r["numel"], r["speedup_vs_eager"]) for r in results.get("cast", [])],
        "cast+transpose vs eager": [(r["numel"], r["speedup_vs_eager"]) for r in results.get("cast_transpose", [])],
    }
    for peer in (["torchao_emulate_ms", "bf16_ms"] if device == "cpu" else ["bf16_ms"]):
        series[f"Linear fwd+bwd vs {peer[:-3]}"] = [
            (shape_size(r["shape"]), r[peer] / r["fp8mp_ms"]) for r in results.get("linear", [])
        ]
    # On a CPU without bf16 units torch's bf16 mm is slow, and fp32 mm is the peer to beat.
    gemm_peer = "fp32 mm" if device == "cpu" and fp8mp.ops.cpu_gemm_path() == "fp32" else "bf16 mm"
    series[f"GEMM vs {gemm_peer}"] = [(shape_size(r["shape"]), r[gemm_peer] / r["fp8mp"]) for r in results.get("gemm", [])]
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("problem size (elements, or M*K*N)")
    ax.set_ylabel("speed-up of fp8mp (x)")
    ax.set_title(f"fp8mp speed-up vs peers ({device})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if fp8mp.cuda_kernels_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"))
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a minute on CPU)")
    args = parser.parse_args()
    if args.device == "cuda" and not fp8mp.cuda_kernels_available():
        raise SystemExit("--device cuda: no CUDA device or fp8mp was built without CUDA kernels")
    command = "python " + " ".join(sys.argv)
    started = datetime.datetime.now(datetime.timezone.utc)
    results, sections = run_benchmarks(args.device, args.quick)
    plot_path = plot_speedups(results, args.device, os.path.splitext(args.out)[0] + f"_speedup_{args.device}.png")
    header = [
        f"# fp8mp benchmark results ({args.device})",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {machine_description(args.device)}",
        f"- command: `{command}`",
        "- ratios are peer time / fp8mp time (> 1: fp8mp faster), peers measured in the same run",
        "",
    ]
    if plot_path:
        header += [f"![speed-up]({os.path.basename(plot_path)})", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(header) + "\n\n".join(sections) + "\n")
    print(f"wrote {args.out}" + (f" and {plot_path}" if plot_path else ""))


if __name__ == "__main__":
    main()
