"""The optimizer step in backward (fp8mp.step_in_backward) against backward() then optimizer.step(): the peak
bytes torch allocates during backward and the step, the most gradient bytes held at once, and the time of a
training step, on bench_train_memory.py's models with its memory-lean run (bf16 parameters, FP8 Linear layers,
FP8 saved activations, fp8mp.optim.AdamW with E4M3 states) and, for the Llama, the chunked LM-head loss.

Modes: "backward + step" (loss.backward(), optimizer.step(), zero_grad()); "in backward, verified" (the default
when a step can be skipped: a first backward pass checks every gradient, a second one steps; the optimizer's
skip_nonfinite=True); "in backward, one pass" (verify=False, which needs skip_nonfinite=False and no scaler).
Each mode runs in a fresh process: one step to create the optimizer states, one step under torch.profiler's
memory profiling (the peak of the allocations minus frees from the end of forward to the end of the step; a
CPU allocation, the device's with --device cuda), then `--steps` timed steps (median): on the CPU the process's
CPU time (time.process_time, all threads; on a shared host the wall clock mostly measures the other jobs), on a
GPU the wall clock.

    python benchmarks/bench_step_in_backward.py [--quick] [--device cpu|cuda] [--batch B --seq S] [--steps N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_train_memory as memory  # noqa: E402
from timing import markdown_table, where  # noqa: E402

MIB = 2**20
MODES = ("backward + step", "in backward, verified", "in backward, one pass")


def peak_allocated_bytes(prof, device: str) -> int:
    """The most bytes live at once among the allocations and frees the profiler recorded on `device`."""
    kind = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
                     and e.device_type() == kind), key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def measure(model_key: str, mode: str, quick: bool, device: str, batch: int | None, seq: int | None,
            steps: int) -> dict:
    import fp8mp
    from torch.profiler import ProfilerActivity, profile

    spec = (memory.QUICK_MODELS if quick else memory.MODELS)[model_key]
    batch, seq = batch or spec.batch, seq or spec.seq
    run = next(r for r in memory.RUNS if r.name == "fp8mp memory-lean")
    model, loss_of = memory.build_model(model_key, spec)
    model = memory.to_fp8(model, run, device).to(device=device, dtype=torch.bfloat16)
    if model_key == "llama":
        import fp8mp.integrations.hf

        fp8mp.integrations.hf.use_chunked_loss(model)
    optimizer = fp8mp.optim.AdamW(model.parameters(), lr=memory.LR, skip_nonfinite=mode != MODES[2])
    stepper = None if mode == MODES[0] else fp8mp.step_in_backward(optimizer, verify=mode == MODES[1])
    vocab = spec.config.get("vocab_size", 256)
    ids = torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(1)).to(device)

    def forward():
        with fp8mp.fp8_autocast():
            return loss_of(model, ids)

    def backward_and_step(loss):
        if stepper is None:
            loss.backward()
            held = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
            optimizer.step()
            optimizer.zero_grad()
            return held
        stepper.backward(loss)
        return stepper.peak_grad_bytes

    backward_and_step(forward())  # the optimizer states
    loss = forward()
    activities = [ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU]
    with profile(activities=activities, profile_memory=True) as prof:
        grad_bytes = backward_and_step(loss)
    del loss
    times, cpu_times = [], []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        backward_and_step(forward())
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {"model": spec.name, "mode": mode, "batch": batch, "seq": seq,
            "params_numel": sum(p.numel() for p in model.parameters()), "grad_bytes_held": grad_bytes,
            "peak_backward_step_bytes": peak_allocated_bytes(prof, device), "step_s": statistics.median(times),
            "step_cpu_s": statistics.median(cpu_times)}


def main(argv: list[str] | None = None) -> list[dict]:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (what the tests run)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="llama", choices=sorted(memory.MODELS))
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (median)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(measure(args.model, args.child, args.quick, args.device, args.batch, args.seq,
                                             args.steps)))
        return []
    rows = []
    for mode in MODES:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--child", mode], capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                  filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")]))))
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"{mode}: the process failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        rows.append(json.loads(lines[-1][len("RESULT "):]))
    base = rows[0]
    key = "step_s" if args.device == "cuda" else "step_cpu_s"
    cells = [[r["mode"], f"{r['grad_bytes_held'] / MIB:.1f}", f"{r['peak_backward_step_bytes'] / MIB:.1f}",
              f"{r[key] * 1e3:.0f}", f"{r[key] / base[key]:.2f}x"] for r in rows]
    print(markdown_table(f"step in backward: {base['model']}, {base['params_numel'] / 1e6:.1f}M parameters, batch "
                         f"{base['batch']} x {base['seq']}, {where(args.device)}",
                         ["mode", "gradient MiB held at once", "peak MiB allocated in backward + step",
                          "step ms (median)" if args.device == "cuda" else "step CPU ms (median)", "vs backward + step"], cells))
    return rows


if __name__ == "__main__":
    main()
