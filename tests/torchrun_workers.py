"""Launching a gloo worker script under torchrun from a test: one launch, a time bound, a free port.

    run_workers("tests/optim/fsdp_worker.py", out_dir, nproc=2, timeout_s=180, extra_args=[...])

runs `python -m torch.distributed.run --nproc_per_node N --master_addr 127.0.0.1 --master_port <free> WORKER
OUT_DIR *extra_args` with the repository on PYTHONPATH and one OpenMP thread per rank, and asserts it exited 0.
A failed launch is run once more (with a new port) before it fails the test: once in a dozen runs (2026-12-05,
in CI) torch 2.11's rank 1 aborted at shutdown ("terminate called without an active exception", SIGABRT) after
every result was written; a failure that comes back fails.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_results(worker: str, out_dir, nproc: int, timeout_s: float) -> list[dict]:
    """Run `worker` (run_workers) and load what each rank wrote to OUT_DIR/rank-<r>.pt."""
    import torch
    run_workers(worker, out_dir, nproc, timeout_s)
    return [torch.load(os.path.join(out_dir, f"rank-{r}.pt"), weights_only=False) for r in range(nproc)]


def run_workers(worker: str, out_dir, nproc: int, timeout_s: float, extra_args=()) -> None:
    """Run `worker` (a path relative to the repository) under torchrun, as the module docstring says."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), os.path.join(REPO, worker), str(out_dir), *extra_args]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    print(f"torchrun: {time.monotonic() - start:.1f} s")
    if proc.returncode != 0:
        warnings.warn(f"torchrun failed (exit {proc.returncode}); running it again. Its output's tail:\n"
                      + proc.stderr[-2000:])
        cmd[cmd.index("--master_port") + 1] = str(free_port())
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
