"""Worker for tests/optim/test_dcp_reshard.py, launched by torchrun with 4, then 2, then 1 process (gloo, CPU):

    python -m torch.distributed.run --nproc_per_node N ... tests/optim/dcp_reshard_worker.py OUT_DIR CKPT_DIR

The memory-lean recipe of tests/optim/fsdp_worker.py (its model: bf16 parameters, FP8 saved activations,
fully_shard per block and the root; fp8_autocast(fp8_group=WORLD)) with fp8mp.optim.AdamW (E4M3 states for
the matrices, bf16 states for the vectors, whose 256 elements 4 ranks would cut into 64-element shards) and a
LossScaler, checkpointed with fp8mp.training.save_checkpoint / load_checkpoint (torch.distributed.checkpoint).
Every rank writes OUT_DIR/world-<N>-rank-<r>.pt:

* N == 4 saves CKPT_DIR/main after SAVE_AT steps and trains AFTER more ("uninterrupted"); a fresh model,
  optimizer and scaler load CKPT_DIR/main and train the same AFTER steps ("resumed"): losses, every local
  parameter and state, FP8 scaling buffers and the scaler's state. It also saves CKPT_DIR/odd: a [5, 64]
  weight with E4M3 states, which 4 ranks shard in whole 128-element blocks (2 rows of 64) and 2 ranks
  cannot (3 rows); and tries to save an fp8mp Linear trained without fp8_group ("unreduced_error").
* N == 2 and N == 1 load CKPT_DIR/main into a fresh model sharded over N ranks and train AFTER steps
  ("resumed"); N == 2 tries CKPT_DIR/odd ("odd_error"); N == 1 also tries it into a plain model without
  fully_shard ("plain_error").
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import fp8mp
import fsdp_worker

SAVE_AT, AFTER = 3, 3


def make_optimizer(model):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return fp8mp.optim.AdamW([{"params": matrices}, {"params": vectors, "state_dtype": torch.bfloat16}],
                             lr=fsdp_worker.LR, weight_decay=0.1, state_dtype=torch.float8_e4m3fn, seed=3)


def fresh():
    model = fsdp_worker.make_model(torch.bfloat16, sharded=True)
    return model, make_optimizer(model), fp8mp.LossScaler(init_scale=2.0 ** 12, growth_interval=2)


def train(model, optimizer, scaler, steps) -> list[float]:
    """The global batch of each step split between the ranks; the loss scaled, the gradients unscaled and
    clipped over the mesh; the global loss of each step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * fsdp_worker.GLOBAL_BATCH // world, (rank + 1) * fsdp_worker.GLOBAL_BATCH // world)
    losses = []
    for step in steps:
        tokens, y = fsdp_worker.batch(step)
        loss = fsdp_worker.shard_loss(model, tokens[rows], y[rows], dist.group.WORLD)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), fsdp_worker.MAX_NORM)
        scaler.step(optimizer)
        scaler.update()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    return losses


def state_of(model, optimizer, scaler, losses) -> dict:
    fp8_state = {key: value.clone() for key, value in model.state_dict().items() if ".fp8_meta." in key}
    return {"losses": losses, "shards": fsdp_worker.snapshot(model, optimizer), "fp8_state": fp8_state,
            "scaler": scaler.state_dict()}


def error_of(load) -> str | None:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        load()
    except (Exception, CheckpointException) as e:  # noqa: BLE001 (the message is what the test checks)
        return f"{type(e).__name__}: {e}"
    return None


def odd_model(sharded: bool):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 5, bias=False).bfloat16()
    if sharded:
        from torch.distributed.fsdp import fully_shard
        fully_shard(layer)
    return layer, fp8mp.optim.AdamW(layer.parameters(), state_dtype=torch.float8_e4m3fn, seed=1)


def unreduced_save_error(path: str) -> str | None:
    """An fp8mp Linear run under fp8_autocast without fp8_group (each rank scales from its own data): saving it."""
    layer = fp8mp.convert(torch.nn.Linear(64, 64))
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(dist.get_rank()))
    with fp8mp.fp8_autocast():
        layer(x).sum().backward()
    optimizer = fp8mp.optim.AdamW(layer.parameters(), state_dtype=torch.bfloat16)
    return error_of(lambda: fp8mp.training.save_checkpoint(path, layer, optimizer))


def main(out_dir: str, ckpt_dir: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world, results = dist.get_world_size(), {}
    main_ckpt, odd_ckpt = os.path.join(ckpt_dir, "main"), os.path.join(ckpt_dir, "odd")
    after = range(SAVE_AT, SAVE_AT + AFTER)
    if world == 4:
        model, optimizer, scaler = fresh()
        before = train(model, optimizer, scaler, range(SAVE_AT))
        fp8mp.training.save_checkpoint(main_ckpt, model, optimizer, scaler)
        results["saved_scaler"] = scaler.state_dict()
        results["uninterrupted"] = state_of(model, optimizer, scaler, before + train(model, optimizer, scaler, after))
        model, optimizer, scaler = fresh()
        fp8mp.training.load_checkpoint(main_ckpt, model, optimizer, scaler)
        results["resumed"] = state_of(model, optimizer, scaler, train(model, optimizer, scaler, after))
        layer, layer_optimizer = odd_model(sharded=True)
        fsdp_worker.set_grads(layer, fsdp_worker.global_grads(layer, 0))
        layer_optimizer.step()
        fp8mp.training.save_checkpoint(odd_ckpt, layer, layer_optimizer)
        results["unreduced_error"] = unreduced_save_error(os.path.join(ckpt_dir, "unreduced"))
    else:
        model, optimizer, scaler = fresh()
        fp8mp.training.load_checkpoint(main_ckpt, model, optimizer, scaler)
        results["loaded_scaler"] = scaler.state_dict()
        results["resumed"] = state_of(model, optimizer, scaler, train(model, optimizer, scaler, after))
        results["odd_error"] = error_of(lambda: fp8mp.training.load_checkpoint(odd_ckpt, *odd_model(sharded=True)))
        if world == 1:
            results["plain_error"] = error_of(
                lambda: fp8mp.training.load_checkpoint(odd_ckpt, *odd_model(sharded=False)))
    torch.save(results, os.path.join(out_dir, f"world-{world}-rank-{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
