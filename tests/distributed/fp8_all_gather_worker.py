"""Worker for tests/distributed/test_fp8_all_gather.py, launched by torchrun with 2 processes (gloo, CPU):

    python -m torch.distributed.run --nproc_per_node 2 ... tests/distributed/fp8_all_gather_worker.py OUT_DIR

A tiny model (embedding, two pre-norm MLP blocks of fp8mp Linear layers (tests/optim/fsdp_worker.py's), a head of 33 rows: uneven shards
of 17 and 16 rows) under FSDP2 (`fully_shard` per block and the root), bf16 parameters, fp8mp.optim.AdamW.
Each run trains STEPS steps on a global batch split between the ranks, with fp8_autocast(fp8_group=WORLD),
once with `convert(..., fp8_all_gather=True)` and once without, from the same initial weights. Every rank
writes OUT_DIR/rank-<r>.pt:

* "runs": per run (recipe, all-gather or not): the losses, every local parameter's bytes, every fp8_meta
  buffer's bytes, the bytes all-gathered and reduce-scattered per step (counted at the collectives);
* "gathered": in the all-gather runs, the first block's fc1 weight the GEMMs got (E4M3 codes, scale_inv)
  at each step, and the unsharded bf16 weight of that step (gathered here by hand from the shards); in the
  runs without, the scale the layer's own cast used that step;
* "errors": the messages of what must be refused;
* "dcp": a torch.distributed.checkpoint round trip of an FP8 all-gather model: what its state_dict holds, and
  the step after loading against the step without the round trip.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8mp
from fp8mp.scaling.fp8_meta import Fp8Meta
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, DelayedScaling

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from collective_bytes import count_collective_bytes  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim"))
from fsdp_worker import DIM, Block  # noqa: E402  (the pre-norm MLP block of tests/optim/test_fsdp.py)

VOCAB, CLASSES, SEQ, GLOBAL_BATCH, STEPS, LR = 64, 33, 4, 8, 4, 3e-3


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = fp8mp.nn.Linear(DIM, CLASSES)  # 33 rows: convert keeps such a layer; built here to shard unevenly

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(all_gather: bool):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = fp8mp.convert(Model().bfloat16(), fp8_all_gather=all_gather)
    for module in (*model.blocks, model):
        fully_shard(module)
        # Sum, don't average; force_sum: a custom factor otherwise needs PREMUL_SUM, which gloo lacks.
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model


def make_optimizer(model):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return fp8mp.optim.AdamW([{"params": matrices}, {"params": vectors, "state_dtype": torch.bfloat16}], lr=LR,
                             state_dtype=torch.float8_e4m3fn)


def local_batch(step: int):
    gen = torch.Generator().manual_seed(100)  # the same batch every step: the loss falls
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=gen)
    labels = torch.randint(0, CLASSES, (GLOBAL_BATCH, SEQ), generator=gen)
    rows = slice(dist.get_rank() * GLOBAL_BATCH // 2, (dist.get_rank() + 1) * GLOBAL_BATCH // 2)
    return tokens[rows], labels[rows]


def local_values(p: torch.Tensor) -> torch.Tensor:
    local = p.to_local()
    return local._tensor if isinstance(local, fp8mp.nn.Fp8AllGatherWeight) else local


def unsharded(p) -> torch.Tensor:
    """The whole parameter, gathered here from the shards (padded to equal chunks, as FSDP2 does)."""
    shard = local_values(p).detach()
    chunk = -(-p.shape[0] // dist.get_world_size())
    padded = shard.new_zeros((chunk, *shard.shape[1:]))
    padded[:shard.shape[0]] = shard
    out = shard.new_zeros((chunk * dist.get_world_size(), *shard.shape[1:]))
    dist.all_gather_into_tensor(out, padded)
    return out[:p.shape[0]]


def train_step(model, optimizer, recipe, step: int) -> torch.Tensor:
    """One step; returns the global batch's loss."""
    tokens, labels = local_batch(step)
    with fp8mp.fp8_autocast(fp8_recipe=recipe, fp8_group=dist.group.WORLD):
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().reshape(-1, CLASSES), labels.reshape(-1), reduction="sum")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total


def train(recipe, all_gather: bool, precompute: bool = True) -> tuple[dict, dict]:
    model = make_model(all_gather)
    optimizer = make_optimizer(model)
    fc1 = model.blocks[0].fc1
    seen = []
    if all_gather:
        hook = fc1.register_forward_pre_hook(lambda m, args: seen.append(
            (type(m.weight).__name__, m.weight.codes.clone(), m.weight.scale_inv.clone())))
    else:
        hook = fc1.register_forward_hook(lambda m, args, out: seen.append(m.fp8_meta.scale[1:2].clone()))
    losses, gathered, bytes_per_step = [], [], []
    for step in range(STEPS):
        whole_fc1 = unsharded(fc1.weight)
        with count_collective_bytes() as counts:  # (and the loss's all_reduce, which is neither)
            losses.append(train_step(model, optimizer, recipe, step).item())
        bytes_per_step.append((counts.all_gathered, counts.reduce_scattered))
        if all_gather and precompute:
            fp8mp.precompute_fp8_weight_scales(model)
        gathered.append({"whole": whole_fc1, "seen": seen[-1]})
    hook.remove()
    with fp8mp.fp8_autocast(fp8_recipe=recipe, fp8_group=dist.group.WORLD):
        pass  # its entry reduces the last step's amaxes (under all-gather: the weight shards' into the whole's)
    run = {
        "losses": losses,
        "params": params_bytes(model),
        "meta": {name: b.detach().clone() for name, b in model.named_buffers()
                 if ".fp8_meta." in name and name.rsplit(".", 1)[1] in Fp8Meta.STATE_KEYS},
        "bytes": bytes_per_step,
        "weight_types": {name: type(p.to_local()).__name__ for name, p in model.named_parameters() if p.dim() == 2},
    }
    return run, gathered


def params_bytes(model) -> dict:
    return {name: local_values(p).detach().reshape(-1).view(torch.uint8).clone() for name, p in model.named_parameters()}


def dcp_round_trip(out_dir: str) -> dict:
    """get_state_dict -> torch.distributed.checkpoint save / load -> set_state_dict into a fresh FP8 all-gather
    model and optimizer, then one more step: the same bits as going on without the round trip."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    path = os.path.join(out_dir, "checkpoint")
    model = make_model(True)
    optimizer = make_optimizer(model)
    for step in range(2):
        train_step(model, optimizer, DelayedScaling(), step)
    with fp8mp.fp8_autocast(fp8_group=dist.group.WORLD):
        pass  # reduce the last step's amaxes first: every rank then holds (and DCP saves) the same FP8 state
    model_state, optim_state = get_state_dict(model, optimizer)
    held = sorted({type(v.to_local() if hasattr(v, "to_local") else v).__name__ for v in model_state.values()})
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    want = train_step(model, optimizer, DelayedScaling(), 2)
    fresh = make_model(True)
    fresh_optimizer = make_optimizer(fresh)
    train_step(fresh, fresh_optimizer, DelayedScaling(), 5)  # other weights and states, to be overwritten
    model_state, optim_state = get_state_dict(fresh, fresh_optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(fresh, fresh_optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    got = train_step(fresh, fresh_optimizer, DelayedScaling(), 2)
    want_params, got_params = params_bytes(model), params_bytes(fresh)
    return {"held": held, "losses": (want.item(), got.item()),
            "differ": [name for name in want_params if not torch.equal(want_params[name], got_params[name])],
            "type": type(fresh.blocks[0].fc1.weight.to_local()).__name__}


def refused(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError, RuntimeError) as e:
        return str(e)
    return "nothing raised"


def one_forward(model, **autocast):
    tokens, _ = local_batch(0)
    with fp8mp.fp8_autocast(**autocast):
        model(tokens)


def errors() -> dict:
    own_group = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    return {
        "no_group": refused(lambda: one_forward(make_model(True))),
        "other_group": refused(lambda: one_forward(make_model(True), fp8_group=own_group)),
        "block_recipe": refused(lambda: one_forward(make_model(True), fp8_recipe=BlockScaling(),
                                                    fp8_group=dist.group.WORLD)),
        "convert_block_recipe": refused(lambda: fp8mp.convert(Model(), recipe=BlockScaling(), fp8_all_gather=True)),
    }


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {"runs": {}, "gathered": {}}
    for recipe_name, recipe in (("delayed", DelayedScaling()), ("current", CurrentScaling())):
        for all_gather in (False, True):
            run, gathered = train(recipe, all_gather)
            results["runs"][(recipe_name, all_gather)] = run
            results["gathered"][(recipe_name, all_gather)] = gathered
    # CurrentScaling without precompute_fp8_weight_scales: each gather reduces its own amax
    results["runs"][("current", "no_precompute")], _ = train(CurrentScaling(), True, precompute=False)
    results["errors"] = errors()
    results["dcp"] = dcp_round_trip(out_dir)
    torch.save(results, os.path.join(out_dir, f"rank-{dist.get_rank()}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
