"""Shared helpers of the benchmarks: timing, shape parsing, markdown tables."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch


def median_time(fn: Callable[[], object], device: str, min_repeats: int = 5, min_seconds: float = 0.3,
                max_repeats: int = 200) -> float:
    """Median seconds of fn() after one warm-up call: CUDA events on GPU, perf_counter on CPU.

    Repeats at least `min_repeats` times and until `min_seconds` have passed (capped at `max_repeats`).
    """
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() - started < min_seconds):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def minor_page_faults() -> int:
    """This process's minor page faults so far (0 where the platform does not count them)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_peers(peers: dict[str, Callable[[], object]], device: str, rounds: int = 1,
               **median_kwargs) -> dict[str, tuple[float, float]]:
    """{name: (median seconds, minor page faults per call)} of each peer, all warmed up once before any is timed.

    The warm-up matters on CPU: whether a large output gets recycled heap pages or fresh ones from the kernel
    (about 1 us per 4 KiB page, zero-filled on first touch) depends on glibc's trim and mmap thresholds, which move
    with the largest blocks freed so far. Timed first in a fresh process, an fp32-output FP8 Linear step at
    4096x1024x1024 took about 3,000 faults a step (3-4 ms of 18); after every peer had run once, none did. The
    faults per call are reported so that a reader can see the allocator's share.

    rounds > 1: the peers are timed in turn that many times over (median_time each time, with its warm-up call),
    and a peer's time is the median of its rounds' medians, so that a change in the machine's speed while they
    run (other load on a shared host) falls on every peer rather than on whichever was being timed.
    """
    for fn in peers.values():
        fn()
    medians: dict[str, list[float]] = {name: [] for name in peers}
    calls = dict.fromkeys(peers, 0)
    faults = dict.fromkeys(peers, 0)
    for _ in range(rounds):
        for name, fn in peers.items():
            def counted(fn=fn, name=name):
                calls[name] += 1
                return fn()

            faults_before = minor_page_faults()
            medians[name].append(median_time(counted, device, **median_kwargs))
            faults[name] += minor_page_faults() - faults_before
    return {name: (statistics.median(medians[name]), faults[name] / max(calls[name], 1)) for name in peers}


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """'4096x1024x1024,8192x2048x2048' -> [(4096, 1024, 1024), (8192, 2048, 2048)]."""
    shapes = []
    for item in text.split(","):
        try:
            shapes.append(tuple(int(p) for p in item.lower().split("x")))
        except ValueError:
            raise ValueError(f"shape {item!r} is not of the form AxBxC") from None
    return shapes


def parse_size(text: str) -> int:
    """'16M' -> 16 * 2**20; '4096' -> 4096."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    suffix = text[-1].upper()
    return int(text[:-1]) * units[suffix] if suffix in units else int(text)


def format_size(n: int) -> str:
    """16 * 2**20 -> '16M', 65536 -> '64K', 1000 -> '1000': the inverse of parse_size where it is exact."""
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def markdown_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def where(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"


def cpu_matrix_units() -> str:
    """The CPU's vector and bf16/fp16 matrix units, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return "CPU flags unknown"
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile"]
    present = [name for name in wanted if name in flags]
    units = "bf16 matrix units: " + ("yes" if {"avx512_bf16", "amx_bf16"} & flags else "none")
    return f"{units} (flags: {' '.join(present) or 'none of ' + ' '.join(wanted)})"
