"""examples/train_fsdp.py on 2 CPU processes (torchrun, gloo): a memory-lean tiny Llama under FSDP2 with FP8
all-gather (--fp8-all-gather) trains 6 steps with a DCP checkpoint every 3; a second launch resumes from the step-3 checkpoint and its steps 3-5 are the
first run's, bit for bit (model, FP8 scaling state, optimizer states, loss scaler and data all carried on).
With --tp 2 (tensor parallel over both processes, fp8mp's styles): every projection runs in FP8, the loss falls,
and the DCP checkpoints save (save_checkpoint compares the FP8 scaling buffers across the ranks bit for bit)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
from torchrun_launch import free_port  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 120


def run_example(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), os.path.join(REPO, "examples", "train_fsdp.py"), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def test_trains_checkpoints_and_resumes_bit_exact_on_two_processes(tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ["--steps", "6", "--checkpoint-every", "3", "--checkpoint-dir", str(ckpt), "--context", "32",
              "--fp8-all-gather"]
    out = run_example(*common, "--out", str(tmp_path / "first.json"))
    assert "saved" in out and sorted(os.listdir(ckpt)) == ["step-000003", "step-000006"]
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["world"] == 2 and len(first["losses"]) == 6
    losses = [first["losses"][str(step)] for step in range(6)]
    assert losses[-1] < losses[0]

    shutil.rmtree(ckpt / "step-000006")  # resume from step 3
    out = run_example(*common, "--resume", "--out", str(tmp_path / "resumed.json"))
    assert "resumed from" in out and "(step 3) on 2 processes" in out
    resumed = json.loads((tmp_path / "resumed.json").read_text())["losses"]
    assert sorted(resumed, key=int) == ["3", "4", "5"]
    assert [resumed[str(step)] for step in range(3, 6)] == losses[3:]


def test_tensor_parallel_trains_in_fp8_and_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    out = run_example("--tp", "2", "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(ckpt),
                      "--context", "16", "--hidden", "64", "--layers", "1", "--out", str(tmp_path / "tp.json"))
    assert "saved" in out and sorted(os.listdir(ckpt)) == ["step-000002", "step-000004"]
    run = json.loads((tmp_path / "tp.json").read_text())
    assert run["world"] == 2 and run["tp"] == 2
    assert run["fp8_layers"] == 8  # the layer's 7 projections and the head, each scaled from data
    losses = [run["losses"][str(step)] for step in range(4)]
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
