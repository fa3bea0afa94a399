"""Worker for tests/scaling/test_distributed.py, launched by torchrun with 2 processes (gloo, CPU).

    python -m torch.distributed.run --nproc_per_node 2 ... tests/scaling/dist_worker.py OUT_DIR SCENARIO...

Each scenario trains a tiny fp8mp model for a few steps on its shard of a global batch with
`fp8_autocast(fp8_group=WORLD)`, checks that every rank holds the same FP8 scaling state, and
(rank 0) saves the losses and that state to OUT_DIR/<scenario>.pt; the test compares them with
a single-process run on the global batch (`train_single`).

What makes the two runs comparable. Each rank's loss is its shard's share of the global mean,
sum(shard errors) / numel(global batch), and parameter gradients are *summed* over ranks (DDP: a
SUM comm hook; FSDP2: gradient divide factor 1). Then every rank's grad_output equals the rows
of the single-process grad_output, so max over ranks of the gradient amax == the single-process
gradient amax, as max over shards of the forward input amax == the global one.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

DIM, HIDDEN, GLOBAL_BATCH, STEPS, LR = 32, 64, 16, 4, 0.05


class Block(torch.nn.Module):
    """Pre-norm residual MLP; `repeat` applies fc2 twice (a module running twice per step)."""

    def __init__(self, repeat: bool = False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.fc1 = fp8mp.nn.Linear(DIM, HIDDEN)
        self.fc2 = fp8mp.nn.Linear(HIDDEN, DIM)
        self.repeat = repeat

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.norm(x))))
        if self.repeat:
            h = self.fc2(F.gelu(self.fc1(h)))
        return x + h


def make_model(repeat: bool = False) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(Block(repeat), Block())


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, DIM, generator=gen) * (1 + step)  # growing amax: the history moves
    return x, torch.randn(GLOBAL_BATCH, DIM, generator=gen)


def shard_loss(model, x, y, recipe, group) -> torch.Tensor:
    """This shard's share of the global mean squared error (see the module docstring)."""
    with fp8mp.fp8_autocast(fp8_recipe=recipe, fp8_group=group):
        out = model(x)
    return ((out - y) ** 2).sum() / (GLOBAL_BATCH * DIM)


def plain_name(name: str) -> str:
    """A parameter/module name without the DDP ("module.") or torch.compile ("_orig_mod.") prefix."""
    for prefix in ("module.", "_orig_mod."):
        name = name.removeprefix(prefix)
    return name


def fp8_state(model) -> dict[str, torch.Tensor]:
    """name -> amax / amax_history / scale of every fp8mp Linear (names without wrapper prefixes)."""
    state = {}
    for name, m in model.named_modules():
        if isinstance(m, fp8mp.nn.Linear):
            name = plain_name(name)
            state[name + ".amax"] = m.fp8_meta.amax.clone()
            state[name + ".amax_history"] = m.fp8_meta.amax_history.clone()
            state[name + ".scale"] = m.fp8_meta.scale.clone()
    return state


def full_params(model) -> dict[str, torch.Tensor]:
    params = {}
    for name, p in model.named_parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        params[plain_name(name)] = p.detach().clone()
    return params


def train_single(recipe, repeat: bool = False) -> dict:
    """The reference: one process, the whole global batch, no fp8_group."""
    model = make_model(repeat)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = shard_loss(model, x, y, recipe, None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "fp8_state": fp8_state(model), "params": full_params(model)}


def sum_allreduce_hook(state, bucket):
    """DDP comm hook: SUM the gradients (DDP's default averages them)."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])


def wrap(model, kind: str):
    if kind == "ddp":
        # broadcast_buffers=False: DDP would otherwise copy rank 0's FP8 buffers to every rank
        # before each forward, hiding whether fp8_group's reduction alone keeps the ranks in step.
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        ddp.register_comm_hook(None, sum_allreduce_hook)
        return ddp
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for module in (*model, model):  # each block, then the root
            fully_shard(module)
            # Sum, don't average; force_sum: a custom factor otherwise needs PREMUL_SUM, which gloo lacks.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
        return model
    if kind == "compile":  # gradients summed by sum_gradients after backward
        return torch.compile(model, fullgraph=True)
    raise ValueError(f"unknown wrapper {kind!r}")


def sum_gradients(model) -> None:
    """For the unwrapped (compiled) model: what DDP with sum_allreduce_hook does."""
    for p in model.parameters():
        dist.all_reduce(p.grad)


SCENARIOS = {  # name -> (wrapper, recipe, repeat)
    "ddp": ("ddp", DelayedScaling(amax_history_len=4), False),
    "fsdp2": ("fsdp2", DelayedScaling(amax_history_len=4), False),
    "ddp_current": ("ddp", CurrentScaling(), False),
    "ddp_repeat": ("ddp", DelayedScaling(amax_history_len=4), True),
    # fp8_autocast entered in eager around a torch.compile(fullgraph=True) model; step 0's per-tensor
    # reductions (current scaling) run inside the compiled forward and backward graphs.
    "compile": ("compile", DelayedScaling(amax_history_len=4), False),
}


def train_distributed(scenario: str) -> dict:
    kind, recipe, repeat = SCENARIOS[scenario]
    rank, world = dist.get_rank(), dist.get_world_size()
    model = wrap(make_model(repeat), kind)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = shard_loss(model, x[rows], y[rows], recipe, dist.group.WORLD)
        opt.zero_grad()
        loss.backward()
        if kind == "compile":
            sum_gradients(model)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
    # Enter once more: reduces the last step's amaxes, so the saved state is the reduced one.
    with fp8mp.fp8_autocast(fp8_recipe=recipe, fp8_group=dist.group.WORLD):
        pass
    return {"losses": losses, "fp8_state": fp8_state(model), "params": full_params(model)}


FALLBACK_STEPS = 6


def fallback_agreement() -> dict:
    """Only rank 1 overflows (an Inf in its input at steps 0 and 1); with fp8_group every rank's
    FallbackPolicy must send the layers to high precision together. Returns, per step, the layers
    in fallback after policy.step."""
    from fp8mp.training.fallback import FallbackPolicy

    model = make_model()
    policy = FallbackPolicy(max_bad_steps=2, cooldown_steps=2, fp8_group=dist.group.WORLD)
    in_fallback = []
    for step in range(FALLBACK_STEPS):
        x, _ = batch(step)
        if dist.get_rank() == 1 and step < 2:
            x = x.clone()
            x[0, 0] = float("inf")
        with torch.no_grad(), fp8mp.fp8_autocast(fp8_recipe=CurrentScaling(), fp8_group=dist.group.WORLD):
            model(x)
        policy.step(model)
        in_fallback.append(policy.layers_in_fallback(model))
    return {"in_fallback": in_fallback}


def loss_scaler_agreement() -> dict:
    """Only rank 1 gets an Inf in the input of one FP8 layer (step 1), which E4M3 saturates: its
    gradients stay finite, and after DDP's reduction so do everyone's. LossScaler's FP8 cast check,
    reduced over fp8_group, must skip that step on every rank. Returns, per step, whether the
    optimizer stepped."""
    from fp8mp.scaling.recipe import Format

    model = make_model()
    poison = {"now": False}

    def inf_input(module, args):
        if poison["now"]:
            x = args[0].clone()
            x[0, 0] = float("inf")
            return (x,)

    model[0].fc1.register_forward_pre_hook(inf_input)  # after the LayerNorm, which would turn an Inf into NaNs
    model = wrap(model, "ddp")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = fp8mp.LossScaler()
    recipe = DelayedScaling(fp8_format=Format.E4M3)
    stepped = []
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x.chunk(2)[dist.get_rank()], y.chunk(2)[dist.get_rank()]
        poison["now"] = dist.get_rank() == 1 and step == 1
        opt.zero_grad()
        scaler.scale(shard_loss(model, x, y, recipe, dist.group.WORLD)).backward()
        scaler.step(opt)
        skipped_before = scaler.num_skipped_steps
        scaler.update()
        stepped.append(scaler.num_skipped_steps == skipped_before)
    check_same_on_every_rank(full_params(model))
    return {"stepped": stepped}


def check_same_on_every_rank(state: dict[str, torch.Tensor]) -> None:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    for rank, other in enumerate(gathered):
        for name, value in state.items():
            assert torch.equal(value, other[name]), f"{name} differs between this rank and rank {rank}"


AGREEMENTS = {"fallback": fallback_agreement, "loss_scaler": loss_scaler_agreement}  # what every rank must agree on


def main(out_dir: str, scenarios: list[str]) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        for scenario in scenarios:
            if scenario in AGREEMENTS:
                result = AGREEMENTS[scenario]()
                gathered = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, next(iter(result.values())))
                result["per_rank"] = gathered
            else:
                result = train_distributed(scenario)
                check_same_on_every_rank(result["fp8_state"])
            if dist.get_rank() == 0:
                torch.save(result, os.path.join(out_dir, f"{scenario}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
