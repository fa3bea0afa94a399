"""Property-based fuzz of every op and module (tests/fuzz_worker.py), in a subprocess: a crash fails the
test with the call that caused it, an assertion with hypothesis's shrunk example and the seed to replay.

Replay a failed run with the seed its report prints:
    FP8MP_FUZZ_SEED=<seed> python -m pytest tests/test_fuzz.py
(or, one target at a time: FP8MP_FUZZ_SEED=<seed> PYTHONPATH=. python tests/fuzz_worker.py 200 <target>)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import fp8mp  # noqa: F401  (registers the ops)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_worker.py")
REPO = os.path.dirname(os.path.dirname(WORKER))
EXAMPLES_PER_TARGET = 200


def run_worker(*args: str, env: dict | None = None) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run([sys.executable, WORKER, *args], env=env, capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout, proc.stderr


def report(returncode: int, stdout: str, stderr: str) -> str:
    """What a failed run says: how it ended, the seed and how to replay it, the last call it started, the end of
    its stderr."""
    lines = stdout.splitlines()
    seed = next((line for line in lines if line.startswith("SEED")), "SEED unknown")
    calls = [line for line in lines if line.startswith("CALL")]
    how = f"crashed (signal {-returncode})" if returncode < 0 else f"exited with {returncode}"
    replay = f"replay: FP8MP_FUZZ_SEED={seed.split()[-1]} python -m pytest tests/test_fuzz.py"
    return f"fuzz worker {how}; {seed}; {replay}; last call: {calls[-1] if calls else None}\n{stderr[-6000:]}"


@pytest.mark.slow  # 18 targets x 200 examples: about a minute of one CPU core
def test_fuzz_every_op_and_module():
    returncode, stdout, stderr = run_worker(str(EXAMPLES_PER_TARGET))
    print(next((line for line in stdout.splitlines() if line.startswith("SEED")), "SEED unknown"))
    assert returncode == 0 and stdout.rstrip().endswith("DONE"), report(returncode, stdout, stderr)


def schema_ops() -> set[str]:
    """The op names csrc/ops.cpp declares."""
    with open(os.path.join(REPO, "csrc", "ops.cpp")) as f:
        return set(re.findall(r'm\.def\(\s*"(\w+)\(', f.read()))


def test_every_schema_op_has_a_fuzz_target():
    registered = {name.removeprefix("fp8mp::") for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith("fp8mp::")}
    assert schema_ops() == registered  # the schema file is the one place ops are declared
    returncode, stdout, stderr = run_worker("--list")
    assert returncode == 0, stderr[-3000:]
    fuzzed = {op for line in stdout.splitlines() for op in line.split()[1:]}
    assert registered - fuzzed == set(), f"schema ops without a fuzz target: {sorted(registered - fuzzed)}"


def test_the_same_seed_replays_the_same_calls():
    runs = [run_worker("3", "cast", "block_quantize", env={"FP8MP_FUZZ_SEED": "12345"})[1] for _ in range(2)]
    calls = [[line for line in stdout.splitlines() if line.startswith(("SEED", "CALL"))] for stdout in runs]
    assert calls[0][0] == "SEED 12345" and len(calls[0]) > 1 and calls[0] == calls[1]


def test_a_crash_is_reported_with_the_input_that_caused_it():
    message = report(*run_worker("1", "--crash"))
    assert message.startswith("fuzz worker crashed (signal 6); SEED ")
    assert "; replay: FP8MP_FUZZ_SEED=" in message
    assert "last call: CALL os.abort {'x': 'torch.float32[2] strides [1] on cpu = [1.5, nan]'}" in message
