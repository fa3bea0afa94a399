"""Worker for tests/optim/test_fsdp.py, launched by torchrun with 2 processes (gloo, CPU):

    python -m torch.distributed.run --nproc_per_node 2 ... tests/optim/fsdp_worker.py OUT_DIR

fp8mp.optim.AdamW / Lion on a model under FSDP2 (`fully_shard` per block and the root): every rank writes
OUT_DIR/rank-<r>.pt with what the test compares against one process (`train`, `step_given_grads` with
sharded=False):

* "bits_<dtype>_<optimizer>": three steps on given global gradients (each rank copies its rows into its
  shards): every local parameter, state and FP8 scale, with the shard's first row, for a bitwise comparison;
* "train_<dtype>": 8 training steps on a global batch split between the ranks, gradients summed (FSDP2
  divide factor 1), clipped with torch.nn.utils.clip_grad_norm_: losses, total norms, per-rank bytes, and
  how many saved activations went to FP8 (the LayerNorms' inputs, fp8_saved_activations=True);
* "nonfinite": only rank 1's shard gets a NaN gradient; both ranks must skip the step;
* "unaligned": a vector whose shards cannot start on a 128-element boundary: the error with E4M3 states,
  and three steps with a bf16-states param group;
* "empty_shard": a weight of one row, whose shard on rank 1 is empty;
* "experts": an fp8mp.nn.GroupedLinear of 3 experts (3-D weight sharded along the experts: 2 and 1), three
  AdamW steps with E4M3 states on given gradients, as "bits_*";
* "frozen": a frozen FP8 base (frozen_weights="fp8") and a trainable head: losses, what a rank holds (its
  shard of the codes and the scale), the bytes all-gathered each step;
* "dcp": get_state_dict -> torch.distributed.checkpoint save / load -> set_state_dict into a fresh model and
  optimizer, then one more step: the same bits as going on without the round trip.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8mp
from fp8mp.memory import saved_activations

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from collective_bytes import CollectiveBytes, count_collective_bytes  # noqa: E402

VOCAB, DIM, HIDDEN, SEQ, GLOBAL_BATCH, STEPS, LR, MAX_NORM = 129, 256, 512, 2, 8, 8, 3e-3, 0.5


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.fc1 = torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(torch.nn.Module):
    """An embedding of 129 rows (uneven shards: 65 and 64 rows) and two pre-norm MLP blocks; every other
    parameter's shards start on a 128-element boundary over 2 ranks."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return x


def make_model(dtype: torch.dtype, sharded: bool) -> Model:
    torch.manual_seed(0)
    # The LayerNorms' inputs in E4M3 (norm_format: they would keep bf16 by default), what the test counts
    model = saved_activations.enable_fp8_saved_activations(fp8mp.convert(Model().to(dtype)), norm_format="e4m3")
    if sharded:
        from torch.distributed.fsdp import fully_shard
        for module in (*model.blocks, model):
            fully_shard(module)
            # Sum, don't average; force_sum: a custom factor otherwise needs PREMUL_SUM, which gloo lacks.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def batch(step: int):
    gen = torch.Generator().manual_seed(100 + step)
    return (torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=gen),
            torch.randn(GLOBAL_BATCH, SEQ, DIM, generator=gen))


def rows_of(p: torch.Tensor) -> slice:
    """The rows of the whole tensor that this rank's shard of p holds (all of them for a plain tensor)."""
    if not hasattr(p, "to_local"):
        return slice(0, p.shape[0])
    chunk = -(-p.shape[0] // p.device_mesh.size(0))
    start = min(p.device_mesh.get_local_rank(0) * chunk, p.shape[0])
    return slice(start, start + p.to_local().shape[0])


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def snapshot(model, optimizer) -> dict:
    """name -> (first row, local parameter, {state name: local state}) as bytes."""
    out = {}
    for name, p in model.named_parameters():
        states = {key: local(value).reshape(-1).view(torch.uint8).clone() for key, value in optimizer.state[p].items()}
        out[name] = (rows_of(p).start, local(p).detach().reshape(-1).view(torch.uint8).clone(), states)
    return out


def global_grads(model, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return {name: torch.randn(p.shape, generator=gen).to(p.dtype) * 0.01 for name, p in model.named_parameters()}


def set_grads(model, grads: dict) -> None:
    """Each parameter's gradient: its rows of the given global gradient (a DTensor like p under FSDP2)."""
    for name, p in model.named_parameters():
        g = grads[name][rows_of(p)].contiguous()
        if hasattr(p, "to_local"):
            from torch.distributed.tensor import DTensor
            g = DTensor.from_local(g, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride())
        p.grad = g


def make_optimizer(name: str, model, state_dtype=torch.float8_e4m3fn):
    if name == "adamw":
        return fp8mp.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, state_dtype=state_dtype, seed=3)
    return fp8mp.optim.Lion(model.parameters(), lr=LR / 3, weight_decay=0.1, state_dtype=state_dtype, seed=3)


def step_given_grads(dtype, optimizer_name: str, sharded: bool) -> dict:
    model = make_model(dtype, sharded)
    optimizer = make_optimizer(optimizer_name, model)
    for step in range(3):
        set_grads(model, global_grads(model, step))
        optimizer.step()
    return snapshot(model, optimizer)


def shard_loss(model, tokens, y, group):
    with fp8mp.fp8_autocast(fp8_group=group):
        out = model(tokens)
    return ((out.float() - y) ** 2).sum() / (GLOBAL_BATCH * SEQ * DIM)  # this shard's share of the global mean


def train(dtype, sharded: bool, state_dtype=torch.float8_e4m3fn) -> dict:
    """STEPS steps on the global batch (split between the ranks when sharded), the gradients clipped to
    MAX_NORM by torch.nn.utils.clip_grad_norm_: losses, total gradient norms and this rank's bytes."""
    model = make_model(dtype, sharded)
    optimizer = make_optimizer("adamw", model, state_dtype)
    group = dist.group.WORLD if sharded else None
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    losses, norms = [], []
    with mock.patch.object(saved_activations, "quantize_saved", side_effect=saved_activations.quantize_saved) as fp8_saved:
        for step in range(STEPS):
            tokens, y = batch(step)
            loss = shard_loss(model, tokens[rows], y[rows], group)
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
            optimizer.step()
            total = loss.detach().clone()
            if sharded:
                dist.all_reduce(total)
            losses.append(total.item())
    params = list(model.parameters())
    return {"losses": losses, "norms": norms, "numel": sum(p.numel() for p in params),
            "fp8_saved_activations": fp8_saved.call_count,
            "param_bytes": sum(local(p).numel() * p.element_size() for p in params),
            "grad_bytes": sum(local(p.grad).numel() * p.grad.element_size() for p in params),
            "state_bytes": optimizer.state_bytes(),
            "state_types": sorted({f"{k}:{type(v).__name__}" for s in optimizer.state.values() for k, v in s.items()})}


def nonfinite() -> dict:
    """Rank 1's shard of one gradient holds a NaN at step 1: every rank skips that step, then steps on."""
    model = make_model(torch.bfloat16, True)
    optimizer = make_optimizer("adamw", model)
    steps, changed = [], []
    for step in range(3):
        grads = global_grads(model, step)
        if step == 1:
            grads["blocks.1.fc2.weight"][DIM - 1, 0] = float("nan")  # in rank 1's rows
        before = [local(p).detach().clone() for p in model.parameters()]
        set_grads(model, grads)
        optimizer.step()
        changed.append(any(not torch.equal(b, local(p)) for b, p in zip(before, model.parameters())))
        steps.append(int(optimizer.state[model.embed.weight]["step"]))
    return {"steps": steps, "changed": changed}


def unaligned_step(sharded: bool) -> tuple[str | None, dict]:
    """A bf16 LayerNorm of 64 (over 2 ranks: shards of 32 elements). E4M3 states refuse it (the same error on
    every rank, before any collective): the message, or None; a param group with bf16 states steps it 3 times
    on given gradients: its snapshot."""
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(64).bfloat16()
    if sharded:
        from torch.distributed.fsdp import fully_shard
        fully_shard(norm)
    set_grads(norm, global_grads(norm, 0))
    error = None
    try:
        if sharded:  # (one process steps it)
            fp8mp.optim.AdamW(norm.parameters(), state_dtype=torch.float8_e4m3fn).step()
    except ValueError as e:
        error = str(e)
    optimizer = fp8mp.optim.AdamW([{"params": list(norm.parameters()), "state_dtype": torch.bfloat16}],
                                  state_dtype=torch.float8_e4m3fn, seed=5)
    for step in range(3):
        set_grads(norm, global_grads(norm, step))
        optimizer.step()
    return error, snapshot(norm, optimizer)


def fp8_state_steps(module: torch.nn.Module, sharded: bool, seed: int) -> dict:
    """fully_shard `module` (when sharded), then 3 AdamW steps with E4M3 states on given gradients: the snapshot."""
    if sharded:
        from torch.distributed.fsdp import fully_shard
        fully_shard(module)
    optimizer = fp8mp.optim.AdamW(module.parameters(), state_dtype=torch.float8_e4m3fn, seed=seed)
    for step in range(3):
        set_grads(module, global_grads(module, step))
        optimizer.step()
    return snapshot(module, optimizer)


def empty_shard_step(sharded: bool) -> dict:
    """A bf16 weight of one row of 256 (over 2 ranks: rank 1's shard is empty) and E4M3 states: 3 steps on given
    gradients, the snapshot (the empty shard steps nothing and still counts the step)."""
    torch.manual_seed(0)
    return fp8_state_steps(torch.nn.Linear(256, 1, bias=False).bfloat16(), sharded, seed=9)


def experts_step(sharded: bool) -> dict:
    """An fp8mp.nn.GroupedLinear of 3 experts (weight [3, 64, 128], bias [3, 64], bf16; FSDP2 shards both along
    the experts: 2 on rank 0, 1 on rank 1) and E4M3 states: 3 AdamW steps on given gradients, the snapshot."""
    torch.manual_seed(0)
    return fp8_state_steps(fp8mp.nn.GroupedLinear(3, 128, 64).bfloat16(), sharded, seed=11)


def frozen_fp8(sharded: bool) -> dict:
    """A frozen base stored in FP8 (fp8mp.convert(frozen_weights="fp8")) under a trainable head, fully_shard on
    the base and the root: 4 steps' losses, and what a rank holds of a frozen weight."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, DIM))
    model = torch.nn.Sequential(base, torch.nn.Linear(DIM, DIM)).bfloat16()
    base.requires_grad_(False)
    fp8mp.convert(model, frozen_weights="fp8")
    if sharded:
        from torch.distributed.fsdp import fully_shard
        for module in (base, model):
            fully_shard(module)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    optimizer = fp8mp.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    losses, gathered = [], []
    for step in range(4):
        counting = count_collective_bytes() if sharded else contextlib.nullcontext(CollectiveBytes())
        counts = counting.__enter__()
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(GLOBAL_BATCH, DIM, generator=gen).bfloat16(), torch.randn(GLOBAL_BATCH, DIM, generator=gen)
        rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
        with fp8mp.fp8_autocast(fp8_group=dist.group.WORLD if sharded else None):
            loss = ((model(x[rows]).float() - y[rows]) ** 2).sum() / y.numel()
        loss.backward()
        counting.__exit__(None, None, None)
        gathered.append(counts.all_gathered)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        if sharded:
            dist.all_reduce(total)
        losses.append(total.item())
    weight = local(base[0].weight)
    return {"losses": losses, "held": type(weight).__name__, "held_dtype": weight.dtype, "gathered": gathered,
            "held_bytes": fp8mp.quantized.frozen_weight.tensor_bytes([weight])}  # its storages' bytes


def dcp_round_trip(directory: str) -> dict:
    """Train 2 steps, checkpoint through DCP, load into a fresh model and optimizer, step both once more."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def fresh():
        model = make_model(torch.bfloat16, True)
        return model, make_optimizer("adamw", model)

    model, optimizer = fresh()
    for step in range(2):
        set_grads(model, global_grads(model, step))
        optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    restored, restored_optimizer = fresh()
    model_state, optim_state = get_state_dict(restored, restored_optimizer)
    loaded = {"model": model_state, "optim": optim_state}
    dcp.load(loaded, checkpoint_id=directory)
    set_state_dict(restored, restored_optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    for m in (model, restored):
        set_grads(m, global_grads(m, 2))
    optimizer.step()
    restored_optimizer.step()
    return {"original": snapshot(model, optimizer), "restored": snapshot(restored, restored_optimizer)}


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name in ("adamw", "lion"):
            results[f"bits_{dtype}_{name}"] = step_given_grads(dtype, name, sharded=True)
        results[f"train_{dtype}"] = train(dtype, sharded=True)
    results["train_fp32_states"] = train(torch.float32, sharded=True, state_dtype=torch.float32)
    results["nonfinite"] = nonfinite()
    results["unaligned"] = unaligned_step(sharded=True)
    results["frozen"] = frozen_fp8(sharded=True)
    results["empty_shard"] = empty_shard_step(sharded=True)
    results["experts"] = experts_step(sharded=True)
    with tempfile.TemporaryDirectory() as directory:
        shared = [directory]
        dist.broadcast_object_list(shared)  # rank 0's folder: one checkpoint for both
        results["dcp"] = dcp_round_trip(shared[0])
        dist.barrier()
    torch.save(results, os.path.join(out_dir, f"rank-{dist.get_rank()}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
