"""One torchrun launch of a worker script on CPU (gloo, loopback, a free port, a time bound), for the tests of
tests/optim: a launch that fails is run once more (a port taken between choosing and binding it, as in
tests/scaling/test_distributed.py); a failure that comes back fails the test."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, world: int, args: list[str], timeout_s: float) -> float:
    """Run tests/optim/`script` under torchrun with `world` processes and `args`; its wall time in seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), os.path.join(REPO, "tests", "optim", script), *args]
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
    print(f"torchrun {script} x{world}: {elapsed:.1f} s")
    return elapsed
