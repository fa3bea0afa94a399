"""examples/lightning_fp8.py and examples/accelerate_fp8.py run, each with 2 CPU processes (gloo): Lightning's
strategy="ddp" and "model_parallel" (FSDP2, the model converted in configure_model before fully_shard), and
accelerate's own launcher (`accelerate launch --multi_gpu`, which on a machine without GPUs starts
CPU processes). The ranks train on different shards, so their last raw amaxes differ,
yet fp8mp's reduction over the data-parallel group leaves every amax history and scale the same bits on both ranks.
(Saving and resuming through each framework: tests/integrations/test_lightning.py, test_accelerate.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torchrun_launch import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
TIMEOUT_S = 120


def run(cmd: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def assert_ranks_share_the_fp8_scaling_state(out_dir) -> list[dict]:
    ranks = [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]
    a, b = (rank["fp8_state"] for rank in ranks)
    assert a.keys() == b.keys() and any(k.endswith("amax_history") for k in a)
    for key in a:
        if key.endswith(("amax_history", "scale", "scale_inv", "initialized")):
            assert torch.equal(a[key], b[key]), key
    assert any(not torch.equal(a[k], b[k]) for k in a if k.endswith(".amax"))  # the shards differ: not reduced yet
    return ranks


def test_lightning_example_with_ddp_on_two_processes(tmp_path):
    pytest.importorskip("pytorch_lightning")
    out = run([sys.executable, os.path.join(EXAMPLES, "lightning_fp8.py"), "--devices", "2", "--strategy", "ddp",
               "--steps", "12", "--out", str(tmp_path)])
    assert "FP8 layers: 2" in out
    for rank in assert_ranks_share_the_fp8_scaling_state(tmp_path):
        assert len(rank["losses"]) == 12 and rank["losses"][-1] < 0.8 * rank["losses"][0]
        assert rank["plugin"]["loss_scaler"]["num_steps"] == 12


def test_lightning_example_with_model_parallel_fsdp2_on_two_processes(tmp_path):
    pytest.importorskip("pytorch_lightning")
    out = run([sys.executable, os.path.join(EXAMPLES, "lightning_fp8.py"), "--devices", "2", "--strategy",
               "model_parallel", "--steps", "12", "--out", str(tmp_path)])
    assert "FP8 layers: 2" in out
    for rank in assert_ranks_share_the_fp8_scaling_state(tmp_path):
        assert len(rank["losses"]) == 12 and rank["losses"][-1] < 0.8 * rank["losses"][0]


def test_accelerate_example_under_accelerate_launch_on_two_processes(tmp_path):
    pytest.importorskip("accelerate")
    if torch.cuda.is_available():
        pytest.skip("on a machine with GPUs --multi_gpu would train on them; this checks the CPU processes")
    out = run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip",
               "127.0.0.1", "--main_process_port", str(free_port()), os.path.join(EXAMPLES, "accelerate_fp8.py"),
               "--epochs", "1", "--out", str(tmp_path)])
    assert "processes 2" in out
    assert_ranks_share_the_fp8_scaling_state(tmp_path)

