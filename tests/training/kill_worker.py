"""A training run for tests/training/test_kill_resume.py to SIGKILL: Trainer.fit with checkpoints.

    python kill_worker.py CHECKPOINT_DIR RESULT_FILE [--die-at-fsync N | --die-mid-write N]

Prints "ready" once set up and "step" as each step starts, then trains (resuming from CHECKPOINT_DIR when it holds checkpoints) and
writes the losses and final state to RESULT_FILE. The run draws on every RNG a real one does: a
shuffling DataLoader, dropout, and a Python-random data augmentation. --die-at-fsync N kills the
process at the N-th fsync of this attempt (a temporary file written but not yet renamed);
--die-mid-write N at the N-th checkpoint write, after half of it.
"""
from __future__ import annotations

import os
import random
import signal
import sys

import torch
import torch.nn.functional as F

import fp8mp
from fp8mp.training import checkpoint_folder

STEPS, BATCH, CHECKPOINT_EVERY, KEEP_LAST = 60, 16, 3, 2


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(mode: str, n: int) -> None:
    """Kill this process inside its n-th fsync or checkpoint write (test instrumentation)."""
    calls = {"count": 0}

    def countdown() -> None:
        calls["count"] += 1
        if calls["count"] == n:
            die()

    if mode == "--die-at-fsync":
        real_fsync = os.fsync
        checkpoint_folder.os.fsync = lambda fd: (countdown(), real_fsync(fd))[1]
    else:
        class HalfThenDie:
            """A file whose n-th large write stops halfway and kills the process."""

            def __init__(self, f):
                self.f = f

            def write(self, data):
                if len(data) > 64:
                    calls["count"] += 1
                    if calls["count"] == n:
                        self.f.write(data[: len(data) // 2])
                        self.f.flush()
                        die()
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        def half_then_die_open(path, mode="r", *args, **kwargs):
            f = open(path, mode, *args, **kwargs)
            return HalfThenDie(f) if "w" in mode else f

        checkpoint_folder.open = half_then_die_open


def make_data() -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH, 32, generator=gen)
    y = torch.tanh(x @ torch.randn(32, 16, generator=gen))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def loss_fn(model, batch):
    print("step", flush=True)  # lets the test kill at a random point of a chosen step
    x, y = batch
    x = x * random.uniform(0.9, 1.1)  # an augmentation drawing on Python's RNG
    return F.mse_loss(model(x).float(), y)


def main(checkpoint_dir: str, result_file: str, *kill) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 16))
    trainer = fp8mp.Trainer(model, {"lr": 3e-3, "progress_bar": False, "amax_history_len": 8})
    if kill:
        arm(kill[0], int(kill[1]))
    print("ready", flush=True)
    losses = trainer.fit(make_data(), loss_fn, checkpoint_dir=checkpoint_dir, checkpoint_every=CHECKPOINT_EVERY,
                         keep_last=KEEP_LAST)
    state = {"losses": losses, "model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
             "scaler": trainer.scaler.state_dict(), "step": trainer.step}
    torch.save(state, result_file + ".tmp")
    os.replace(result_file + ".tmp", result_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
