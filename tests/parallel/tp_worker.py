"""Worker for tests/parallel/test_tensor_parallel.py, launched by torchrun (gloo, CPU):

    python -m torch.distributed.run --nproc_per_node 2 ... tests/parallel/tp_worker.py OUT_DIR      (tensor parallel 2)
    python -m torch.distributed.run --nproc_per_node 4 ... tests/parallel/tp_worker.py OUT_DIR      (FSDP2 2 x TP 2)

fp8mp Linear layers under tensor parallel (parallelize_module with fp8mp's Fp8ColwiseParallel /
Fp8RowwiseParallel, torch's SequenceParallel on the LayerNorms), fp32 parameters, the FP8 amaxes reduced over
fp8_autocast(fp8_group=WORLD). Every rank writes OUT_DIR/rank-<r>.pt with what the test compares between the
ranks and against one process on the global batch (`train(layout, None)`):

* "train_<layout>": STEPS training steps: losses, the FP8 state (amaxes, histories, scales) after the first
  step and after the last, the fp8mp ops and all-gathered bytes of one step. Layouts: "tp" (column-wise fc1,
  row-wise fc2, replicated activations), "sp" (sequence parallel: the LayerNorms on sequence shards, fc1
  all-gathering its input as FP8 codes, fc2 reduce-scattering its output), "sp_hp_gather" (the same, fc1's
  input gathered in its own dtype, fp32, by the style), on 2 ranks; "fsdp_tp" (the "sp" plan on a 2 x 2 mesh,
  fully_shard over the data-parallel dimension) on 4;
* "train_sp_current": "sp" under CurrentScaling (every amax reduced before its cast);
* "errors": a torch Linear under Fp8ColwiseParallel with a sequence-parallel input, and what fp8mp raises for
  torch's own ColwiseParallel (FP8 buffers made DTensors), a missing or too small fp8_group, a fine-grained
  recipe, and fp8mp.optim.AdamW on parameters it cannot step (row-wise Shard(1), FSDP2 x TP).
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fp8mp
from fp8mp.memory.saved_activations import enable_fp8_saved_activations

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integrations"))
from framework_helpers import Fp8OpCount  # noqa: E402  (the count of fp8mp ops the framework tests use)

DIM, HIDDEN, SEQ, GLOBAL_BATCH, STEPS, LR = 64, 128, 4, 4, 4, 1e-2
TP = 2


class Block(torch.nn.Module):
    """x + fc2(gelu(fc1(norm(x)))): the layers a tensor-parallel plan names."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc1 = torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def plan(layout: str) -> dict:
    """Each block's tensor-parallel plan: fp8mp's styles for its Linear layers, torch's SequenceParallel."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel
    from fp8mp.parallel.tensor_parallel import Fp8ColwiseParallel, Fp8RowwiseParallel
    if layout == "tp":
        return {"fc1": Fp8ColwiseParallel(), "fc2": Fp8RowwiseParallel()}
    return {"norm": SequenceParallel(),
            "fc1": Fp8ColwiseParallel(input_layouts=Shard(1), fp8_all_gather=layout != "sp_hp_gather"),
            "fc2": Fp8RowwiseParallel(output_layouts=Shard(1))}


def make_model(layout: str | None):
    """The fp8mp model (fp32, FP8 saved activations), parallelized for `layout` (None: one process), and the
    data-parallel (rank, size) of this process."""
    torch.manual_seed(0)
    # The norm's saved input in E4M3 (norm_format: bf16 by default), a DTensor under SequenceParallel
    model = enable_fp8_saved_activations(fp8mp.convert(Model()), norm_format="e4m3")
    if layout is None:
        return model, (0, 1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    if layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (dist.get_world_size() // TP, TP), mesh_dim_names=("dp", "tp"))
        tp_mesh = mesh["tp"]
    else:
        mesh = tp_mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    for block in model.blocks:
        parallelize_module(block, tp_mesh, plan(layout))
    if layout != "fsdp_tp":
        return model, (0, 1)
    from torch.distributed.fsdp import fully_shard
    for module in (*model.blocks, model):
        fully_shard(module, mesh=mesh["dp"])
        # Sum, don't average; force_sum: a custom factor otherwise needs PREMUL_SUM, which gloo lacks.
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return model, (mesh["dp"].get_local_rank(), mesh["dp"].size())


class StepCount(Fp8OpCount):
    """The fp8mp ops by name, and `gathered`: the bytes this rank contributes to all-gathers (its shards)."""

    def __init__(self):
        super().__init__()
        self.gathered = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func.overloadpacket):  # (FSDP2's take lists)
            sent = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            self.gathered += sum(t.numel() * t.element_size() for t in sent if isinstance(t, torch.Tensor))
        return super().__torch_dispatch__(func, types, args, kwargs)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, SEQ, DIM, generator=gen), torch.randn(GLOBAL_BATCH, SEQ, DIM, generator=gen)


def rank_slice(t: torch.Tensor, layout: str | None, dp: tuple[int, int]) -> torch.Tensor:
    """This rank's part of a global [batch, seq, dim] tensor: its data-parallel rows, and under sequence
    parallel its tensor-parallel chunk of the sequence."""
    rank, size = dp
    t = t[rank * GLOBAL_BATCH // size:(rank + 1) * GLOBAL_BATCH // size]
    if layout in ("sp", "sp_hp_gather", "fsdp_tp"):
        tp_rank = dist.get_rank() % TP  # the tp dimension is the mesh's last: consecutive ranks
        t = t[:, tp_rank * SEQ // TP:(tp_rank + 1) * SEQ // TP]
    return t


def make_optimizers(model, layout: str | None) -> list[torch.optim.Optimizer]:
    """fp8mp.optim.AdamW (fp32 states) for every parameter it steps under tensor parallel (Shard(0), Replicate,
    plain), torch.optim.AdamW for the row-wise (Shard(1)) weights; under FSDP2 x TP torch's for all."""
    if layout == "fsdp_tp":
        return [torch.optim.AdamW(model.parameters(), lr=LR)]
    rowwise = [p for name, p in model.named_parameters() if name.endswith("fc2.weight")]
    others = [p for name, p in model.named_parameters() if not name.endswith("fc2.weight")]
    return [fp8mp.optim.AdamW(others, lr=LR, state_dtype=torch.float32), torch.optim.AdamW(rowwise, lr=LR)]


def fp8_state(model, group) -> dict[str, torch.Tensor]:
    """The FP8 state (amaxes, histories, scales) as the next step starts from it: the last amaxes reduced over
    `group`, as entering fp8_autocast(fp8_group=group) does (a context with no module in it)."""
    with fp8mp.fp8_autocast(fp8_group=group):
        pass
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".fp8_meta." in k}


def train(layout: str | None, group, recipe=None) -> dict:
    """STEPS steps on the global batch (this rank's part of it) under `recipe` (None: DelayedScaling): the global
    mean loss of each step, the FP8 state after the first step and after the last, and the fp8mp ops of step 1
    by name, with the bytes it all-gathered ("gathered_bytes")."""
    model, dp = make_model(layout)
    optimizers = make_optimizers(model, layout)
    losses, first, ops = [], None, None
    for step in range(STEPS):
        x, y = (rank_slice(t, layout, dp) for t in batch(step))
        counter = StepCount()
        with counter:
            with fp8mp.fp8_autocast(fp8_group=group, fp8_recipe=recipe):
                out = model(x)
            loss = ((out - y) ** 2).sum() / (GLOBAL_BATCH * SEQ * DIM)  # this rank's share of the global mean
            loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        total = loss.detach().clone()
        if layout in ("sp", "sp_hp_gather", "fsdp_tp"):  # shares of the loss: data-parallel rows, sequence chunks
            dist.all_reduce(total)
        losses.append(total.item())
        if step == 0:
            first = fp8_state(model, group)
        if step == 1:
            ops = dict(counter.counts, gathered_bytes=counter.gathered)
    return {"losses": losses, "first": first, "last": fp8_state(model, group), "ops": ops}


def error_of(fn) -> str:
    try:
        fn()
    except (ValueError, NotImplementedError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def errors() -> dict[str, str]:
    """The errors of a tensor-parallel model (2 ranks) run or stepped the wrong way."""
    model, _ = make_model("tp")
    x = batch(0)[0]
    singletons = [dist.new_group([r]) for r in range(dist.get_world_size())]  # (every rank creates every group)

    def forward(group, recipe=None):
        with fp8mp.fp8_autocast(fp8_group=group, fp8_recipe=recipe):
            model(x)

    rowwise = [p for name, p in model.named_parameters() if name.endswith("fc2.weight")]
    for p in rowwise:
        p.grad = torch.zeros_like(p)
    def torch_style():
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        layer = parallelize_module(fp8mp.convert(torch.nn.Linear(DIM, HIDDEN)), model.blocks[0].fc1.weight.device_mesh,
                                   ColwiseParallel())
        with fp8mp.fp8_autocast(fp8_group=dist.group.WORLD):
            layer(x)

    def plain_linear_sequence_parallel():
        """A torch nn.Linear (not fp8mp's) under Fp8ColwiseParallel(input_layouts=Shard(1)): the style gathers its
        input: the output's largest difference from the unsharded layer's, and the input placements it got."""
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import parallelize_module
        from fp8mp.parallel.tensor_parallel import Fp8ColwiseParallel
        torch.manual_seed(1)
        whole = torch.nn.Linear(DIM, HIDDEN)
        torch.manual_seed(1)  # the same parameters
        layer = parallelize_module(torch.nn.Linear(DIM, HIDDEN), model.blocks[0].fc1.weight.device_mesh,
                                   Fp8ColwiseParallel(input_layouts=Shard(1), use_local_output=False))
        seen = []  # the input's placements as the layer gets it (after the style's own pre-hook)
        layer.register_forward_pre_hook(lambda module, args: seen.append(args[0].placements))
        with torch.no_grad():
            tp_rank = dist.get_rank()
            out = layer(x[:, tp_rank * SEQ // TP:(tp_rank + 1) * SEQ // TP]).full_tensor()
            return (out - whole(x)).abs().max().item(), seen

    return {"plain_linear_sequence_parallel": plain_linear_sequence_parallel(),
            "torch_colwise": error_of(torch_style),
            "no_group": error_of(lambda: forward(None)),
            "own_rank_only": error_of(lambda: forward(singletons[dist.get_rank()])),
            "fine_grained": error_of(lambda: forward(dist.group.WORLD, fp8mp.recipe.RowwiseScaling())),
            "adamw_rowwise": error_of(lambda: fp8mp.optim.AdamW(rowwise, state_dtype=torch.float32).step())}


def fsdp_tp_adamw_error() -> str:
    model, _ = make_model("fsdp_tp")
    params = [model.blocks[0].fc1.weight]
    for p in params:
        p.grad = torch.zeros_like(p)
    return error_of(lambda: fp8mp.optim.AdamW(params, state_dtype=torch.float32).step())


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    results = {}
    if dist.get_world_size() == TP:
        results["train_tp"] = train("tp", dist.group.WORLD)
        results["train_sp"] = train("sp", dist.group.WORLD)
        results["train_sp_hp_gather"] = train("sp_hp_gather", dist.group.WORLD)
        results["train_sp_current"] = train("sp", dist.group.WORLD, fp8mp.recipe.CurrentScaling())
        results["errors"] = errors()
    else:
        results["train_fsdp_tp"] = train("fsdp_tp", dist.group.WORLD)
        results["adamw_fsdp_tp"] = fsdp_tp_adamw_error()
    torch.save(results, os.path.join(out_dir, f"rank-{dist.get_rank()}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
