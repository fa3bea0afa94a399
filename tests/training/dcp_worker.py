"""A 2-rank DDP training run under torchrun, checkpointed through torch.distributed.checkpoint.

    torchrun --nproc_per_node 2 --max-restarts 3 dcp_worker.py CHECKPOINT_DIR RESULT_DIR (clean | kill)

Trainer.fit on each rank's shard (gloo, CPU) with checkpoint_dir. In "kill" mode, torchrun's first
attempt loses rank 1 to a SIGKILL in the middle of step 7, the second loses rank 0 inside its first
checkpoint save (at its 6th fsync, torch.distributed.checkpoint's own included: before the folder is
complete); torchrun restarts both ranks each time and the third attempt resumes and finishes. Each rank then writes its losses and final
state to RESULT_DIR/rank-<r>.pt, for tests/training/test_kill_resume.py to compare with a "clean" run.
"""
from __future__ import annotations

import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8mp
from fp8mp.training import checkpoint_folder

STEPS, BATCH = 24, 8


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def init_process_group(attempt: int) -> None:
    """gloo, through a store prefix of this attempt's own. torchrun's agent hosts the store and it outlives an
    attempt: restarted ranks could otherwise read the dead ranks' addresses of the previous attempt
    ("Gloo connectFullMesh failed ... Connection refused", https://github.com/pytorch/pytorch/issues/167288)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts_store, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank, world_size=world)


def main(checkpoint_dir: str, result_dir: str, mode: str) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_process_group(attempt)
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Dropout(0.1),
                                              torch.nn.Linear(64, 16)))
    model = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(100 + rank)  # each rank's dropout draws its own masks, restored from its own file
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 32, generator=gen), torch.randn(BATCH, 16, generator=gen)) for _ in range(STEPS)]
    trainer = fp8mp.Trainer(model, {"lr": 3e-3, "progress_bar": False, "amax_history_len": 8})
    calls = {"n": 0}

    def loss_fn(m, batch):
        calls["n"] += 1
        if mode == "kill" and attempt == 0 and rank == 1 and calls["n"] == 7:
            die()
        return F.mse_loss(m(batch[0]).float(), batch[1])

    if mode == "kill" and attempt == 1 and rank == 0:  # inside a save, before the checkpoint folder is complete
        fsyncs, real_fsync = {"n": 0}, os.fsync

        def fsync(fd):
            fsyncs["n"] += 1
            if fsyncs["n"] == 6:
                die()
            return real_fsync(fd)
        checkpoint_folder.os.fsync = fsync

    losses = trainer.fit(batches, loss_fn, checkpoint_dir=checkpoint_dir, checkpoint_every=3, keep_last=2)
    torch.save({"losses": losses, "model": trainer.model.module.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "steps_run": calls["n"]}, os.path.join(result_dir, f"rank-{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
