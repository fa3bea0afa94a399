"""A training run that survives being killed: SIGKILL at random points, during saves too, then resume.

tests/training/kill_worker.py runs Trainer.fit with kill-safe checkpoints; here it is killed 11 times
(4 of them inside a checkpoint save, the others at a random instant 1 to 4 steps after it resumed),
restarted each time, and finally let finish. Its losses and final model, optimizer and loss-scaler state must be
bit-identical to an uninterrupted run. Then the folder-level guarantees: a truncated or corrupted
newest checkpoint is skipped with a log line, leftovers of killed saves are ignored and pruned. Last,
the same under `torchrun --max-restarts` on 2 gloo ranks through torch.distributed.checkpoint
(tests/training/dcp_worker.py): a rank killed in a step, then one killed in a save.
"""
from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import time

import pytest
import torch

from fp8mp.training.checkpoint_folder import CheckpointFolder, write_file

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(WORKER)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
           OMP_NUM_THREADS="1")
IN_SAVE_KILLS = [("--die-at-fsync", "3"), ("--die-mid-write", "2"), ("--die-at-fsync", "6"), ("--die-mid-write", "4")]
RANDOM_KILLS = 7


def start(checkpoint_dir, result, *kill) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, str(checkpoint_dir), str(result), *kill], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> int:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode in (0, -9), err[-4000:]
    return proc.returncode


@pytest.mark.slow  # 13 processes: about a minute on 2 cores
def test_sigkilled_training_resumes_bit_identical(tmp_path):
    assert finish(start(tmp_path / "reference", tmp_path / "reference.pt")) == 0
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)

    folder, result = tmp_path / "killed", tmp_path / "killed.pt"
    kills, rng = 0, random.Random(15)
    for kill in IN_SAVE_KILLS:  # killed inside its n-th fsync / checkpoint write
        kills += finish(start(folder, result, *kill)) == -9
    while kills < len(IN_SAVE_KILLS) + RANDOM_KILLS:  # killed at a random instant of a random coming step
        proc = start(folder, result)
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(rng.randint(1, 4)):
            assert proc.stdout.readline().strip() == "step", "the run ended before its kill"
        time.sleep(rng.uniform(0.0, 0.03))
        proc.kill()
        kills += finish(proc) == -9
    assert kills >= 10
    final = start(folder, result)
    out, err = final.communicate(timeout=600)
    assert final.returncode == 0, err[-4000:]
    steps_run = out.split().count("step")
    assert 0 < steps_run < 60 - 10, steps_run  # it resumed where the killed attempts had got to
    resumed = torch.load(result, weights_only=True)

    assert resumed["losses"] == reference["losses"] and resumed["step"] == reference["step"]
    assert resumed["scaler"] == reference["scaler"]
    for part in ("model", "optimizer"):
        flat_a, flat_b = flatten(resumed[part]), flatten(reference[part])
        assert flat_a.keys() == flat_b.keys()
        for key in flat_a:
            assert equal(flat_a[key], flat_b[key]), (part, key)
    names = sorted(os.listdir(folder))
    assert names == ["step-000000057.ckpt", "step-000000060.ckpt"], names  # keep_last=2, no leftovers


def flatten(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, value in enumerate(tree) for k, v in flatten(value, f"{prefix}{i}.").items()}
    return {prefix: tree}


def equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                                       b.reshape(-1).view(torch.uint8))
    return a == b


# ----------------------------------------------------------------------------- the folder
def write_steps(folder: CheckpointFolder, steps) -> None:
    for step in steps:
        folder.save(step, {"step": step, "weights": torch.full((64,), float(step))})


def test_a_truncated_or_corrupted_newest_checkpoint_is_skipped_with_a_log_line(tmp_path, caplog):
    folder = CheckpointFolder(tmp_path, keep_last=5)
    write_steps(folder, [1, 2, 3, 4])
    newest = tmp_path / "step-000000004.ckpt"
    newest.write_bytes(newest.read_bytes()[:-10])
    flipped = tmp_path / "step-000000003.ckpt"
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0x01
    flipped.write_bytes(bytes(data))
    (tmp_path / "step-000000002.ckpt").rename(tmp_path / ".tmp-step-000000005.ckpt-1")  # a killed save's leftover
    with caplog.at_level(logging.WARNING, logger="fp8mp"):
        step, state = folder.load_newest()
    assert step == 1 and torch.equal(state["weights"], torch.full((64,), 1.0))
    assert "step-000000004.ckpt is unusable (truncated: " in caplog.text
    assert "step-000000003.ckpt is unusable (checksum mismatch)" in caplog.text
    assert sorted(os.listdir(tmp_path)) == [".tmp-step-000000005.ckpt-1", "step-000000001.ckpt",
                                            "step-000000003.ckpt.corrupt", "step-000000004.ckpt.corrupt"]
    folder.save(2, {"step": 2})  # the next save prunes the leftover; .corrupt files are kept for inspection
    assert sorted(os.listdir(tmp_path)) == ["step-000000001.ckpt", "step-000000002.ckpt",
                                            "step-000000003.ckpt.corrupt", "step-000000004.ckpt.corrupt"]


def test_keep_last_keeps_the_newest(tmp_path):
    folder = CheckpointFolder(tmp_path, keep_last=2)
    write_steps(folder, [3, 6, 9, 12])
    assert folder.steps() == [12, 9]


def test_no_half_written_file_under_a_final_name(tmp_path, monkeypatch):
    from fp8mp.training import checkpoint_folder

    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_folder.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_file(tmp_path / "step-000000001.ckpt", {"x": torch.zeros(8)})
    assert CheckpointFolder(tmp_path).steps() == []


def test_fit_refuses_a_folder_of_another_run_without_resume(tmp_path):
    import fp8mp

    write_steps(CheckpointFolder(tmp_path), [1])
    trainer = fp8mp.Trainer(torch.nn.Sequential(torch.nn.Linear(16, 16)), {"progress_bar": False})
    batches = [(torch.randn(4, 16), torch.randn(4, 16))]
    with pytest.raises(ValueError, match="holds checkpoints of an earlier run; pass resume=True"):
        trainer.fit(batches, lambda m, b: (m(b[0]) - b[1]).square().mean(), checkpoint_dir=tmp_path, resume=False)


# ----------------------------------------------------------------------------- torchrun, 2 ranks
DCP_WORKER = os.path.join(os.path.dirname(WORKER), "dcp_worker.py")


def torchrun(tmp_path, name: str, max_restarts: int) -> tuple[list[dict], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = tmp_path / f"{name}-results"
    results.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", str(max_restarts),
           "--monitor-interval", "0.5", "--master_addr", "127.0.0.1", "--master_port", str(port), DCP_WORKER,
           str(tmp_path / f"{name}-checkpoints"), str(results), name]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [torch.load(results / f"rank-{rank}.pt", weights_only=True) for rank in range(2)], proc.stderr


@pytest.mark.slow  # two torchrun launches, the second with two restarts
def test_torchrun_restarts_resume_through_distributed_checkpoint_bit_identical(tmp_path):
    clean, _ = torchrun(tmp_path, "clean", max_restarts=0)
    killed, log = torchrun(tmp_path, "kill", max_restarts=3)
    assert log.count("(exitcode: -9)") == 2  # rank 1 in a step, then rank 0 in a save
    for rank in range(2):
        assert 0 < killed[rank]["steps_run"] < 24  # the last attempt resumed
        assert killed[rank]["losses"] == clean[rank]["losses"]
        for part in ("model", "optimizer"):
            flat_a, flat_b = flatten(killed[rank][part]), flatten(clean[rank][part])
            assert flat_a.keys() == flat_b.keys()
            assert all(equal(flat_a[key], flat_b[key]) for key in flat_a), (rank, part)
