"""Property-based fuzz of every op and module (tests/fuzz_worker.py), in a subprocess: a crash fails the
test with the call that caused it, an assertion with hypothesis's shrunk example and the seed to replay."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_worker.py")
REPO = os.path.dirname(os.path.dirname(WORKER))
EXAMPLES_PER_TARGET = 300


def run_worker(*args: str) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, WORKER, *args], env=env, capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout, proc.stderr


def report(returncode: int, stdout: str, stderr: str) -> str:
    """What a failed run says: how it ended, the seed, the last call it started, the end of its stderr."""
    lines = stdout.splitlines()
    seed = next((line for line in lines if line.startswith("SEED")), "SEED unknown")
    calls = [line for line in lines if line.startswith("CALL")]
    how = f"crashed (signal {-returncode})" if returncode < 0 else f"exited with {returncode}"
    return f"fuzz worker {how}; {seed}; last call: {calls[-1] if calls else None}\n{stderr[-6000:]}"


@pytest.mark.slow  # 6 targets x 300 examples: about 30 s of CPU
def test_fuzz_every_op_and_module():
    returncode, stdout, stderr = run_worker(str(EXAMPLES_PER_TARGET))
    assert returncode == 0 and stdout.rstrip().endswith("DONE"), report(returncode, stdout, stderr)


def test_a_crash_is_reported_with_the_input_that_caused_it():
    message = report(*run_worker("1", "--crash"))
    assert message.startswith("fuzz worker crashed (signal 6); SEED ")
    assert "last call: CALL os.abort {'x': 'torch.float32[2] strides [1] on cpu = [1.5, nan]'}" in message
