"""Launch a test worker under torchrun (gloo on CPU, loopback, a free port, a time bound), and read back what
each rank saved as OUT_DIR/rank-<r>.pt."""
from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
import warnings

import torch

REPO = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: pathlib.Path | str, world: int, args: list[str], timeout_s: float) -> float:
    """Run `script` (a path, or a name under tests/optim) under torchrun with `world` processes, one thread
    each, and `args`; its wall time in seconds.

    A launch that fails runs once more, with a new port: a port taken between the probe and the bind, a loaded
    host, or torch 2.11's rank 1 aborting at shutdown after every result was written ("terminate called without
    an active exception", SIGABRT; once in a dozen CI runs, 2026-12-05). A failure that comes back fails the
    test with the tail of the output.
    """
    script = pathlib.Path(script)
    if not script.is_absolute():
        script = REPO / "tests" / "optim" / script
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(script), *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        warnings.warn(f"torchrun failed (exit {proc.returncode}); running it again. Its output's tail:\n"
                      + proc.stderr[-2000:])
        cmd[cmd.index("--master_port") + 1] = str(free_port())
        start = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    elapsed = time.monotonic() - start
    print(f"torchrun {script.name} x{world}: {elapsed:.1f} s")
    return elapsed


def run_ranks(worker: pathlib.Path, nproc: int, out_dir: pathlib.Path, timeout_s: float, *args: str) -> list[dict]:
    """Run `worker OUT_DIR *args` on `nproc` processes (see launch); every rank's saved results, by rank."""
    launch(worker, nproc, [str(out_dir), *args], timeout_s)
    return [torch.load(out_dir / f"rank-{r}.pt", weights_only=False) for r in range(nproc)]


@contextlib.contextmanager
def one_thread():
    """Run the block on one thread, as the workers run (torch's global setting, restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
