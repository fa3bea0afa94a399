"""Memory-lean FP8 training of a small HF Llama under FSDP2, with resharded checkpoints: what to copy.

    torchrun --nproc_per_node 2 examples/train_fsdp.py                       # CPU: gloo; CUDA: nccl, a GPU a rank
    torchrun --nproc_per_node 2 examples/train_fsdp.py --resume              # on from the newest checkpoint
    torchrun --nproc_per_node 4 examples/train_fsdp.py --tp 2                # 2-D mesh: 2 data-parallel x 2 tensor-parallel
    torchrun --nproc_per_node 2 examples/train_fsdp.py --fp8-all-gather      # FSDP2 all-gathers E4M3 weights

The recipe (docs/distributed.md, "Memory-lean training under FSDP2"):

* bf16 parameters (ordinary nn.Parameters), every projection an fp8mp Linear computing in FP8 under
  ``fp8_autocast(fp8_group=<data-parallel group>)`` (amaxes reduced over it: every rank the same scales),
  norms and activation functions saving their inputs for backward in FP8 (``fp8_saved_activations=True``);
* ``fully_shard`` on each decoder layer and on the root (FSDP2: parameters, gradients and optimizer states
  sharded over the data-parallel ranks);
* fp8mp.optim.AdamW with E4M3 states (2.06 bytes a parameter) for the matrices and bf16 states for the vectors
  (norm weights, whose shards need not start on the FP8 states' 128-element blocks);
* a checkpoint every --checkpoint-every steps through torch.distributed.checkpoint
  (fp8mp.training.save_checkpoint: model, FP8 scaling buffers, optimizer states and their scales, loss scaler),
  one folder per step; ``--resume`` loads the newest on any number of ranks (resharded) and goes on, with the
  data of the step it stopped at;
* ``--tp N``: a 2-D DeviceMesh (dp x tp), fp8mp's Fp8ColwiseParallel (q, k, v, gate, up) / Fp8RowwiseParallel
  (o, down) on every layer, then fully_shard over the dp dimension; the amaxes reduced over every rank
  (``fp8_group=dist.group.WORLD``: a column-wise weight shows each rank its rows only), torch.optim.AdamW
  (fp8mp.optim does not step parameters sharded by FSDP2 and tensor parallel at once), the gradient norm
  clipped over both meshes (projections on dp x tp, embeddings and norms on dp);
* ``--fp8-all-gather``: ``fp8mp.convert(..., fp8_all_gather=True)``, FSDP2 all-gathering the trainable
  weights as E4M3 codes and a scale instead of bf16.

--out FILE writes each step's global loss (JSON) from rank 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mp  # noqa: E402
from corpus import make_corpus  # noqa: E402

STEP_FOLDER = "step-{:06d}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="train up to this step")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences a step, over all data-parallel ranks")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="0: no checkpoints")
    parser.add_argument("--resume", action="store_true", help="go on from the newest checkpoint in --checkpoint-dir")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (divides the world size)")
    parser.add_argument("--fp8-all-gather", action="store_true", help="FSDP2 all-gathers FP8 weights")
    parser.add_argument("--out", default=None, help="JSON file for the losses (rank 0)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "context", "hidden", "layers", "tp"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name.replace('_', '-')} must be >= 1")
    return args


def build_model(args, device: torch.device) -> torch.nn.Module:
    """A byte-level Llama: vocab 256, GQA (4 heads, 2 key/value heads), SwiGLU MLP; bf16 parameters."""
    import transformers

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=args.context)
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    options = {"fp8_all_gather": True} if args.fp8_all_gather else {}
    return fp8mp.convert(model, fp8_saved_activations=True, **options)


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh) -> None:
    """torch's plan for a Llama layer: q/k/v and gate/up split by output features, o and down by input
    features (one all-reduce each of attention and MLP). HF's attention reshapes to (-1, head_dim), so each
    rank computes its share of the heads."""
    from torch.distributed.tensor.parallel import parallelize_module
    from fp8mp.nn.tensor_parallel import Fp8ColwiseParallel, Fp8RowwiseParallel

    plan = {"self_attn.q_proj": Fp8ColwiseParallel(), "self_attn.k_proj": Fp8ColwiseParallel(),
            "self_attn.v_proj": Fp8ColwiseParallel(), "self_attn.o_proj": Fp8RowwiseParallel(),
            "mlp.gate_proj": Fp8ColwiseParallel(), "mlp.up_proj": Fp8ColwiseParallel(),
            "mlp.down_proj": Fp8RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def make_optimizer(model: torch.nn.Module, lr: float, tp: int) -> torch.optim.Optimizer:
    """fp8mp.optim.AdamW with E4M3 states; under --tp torch.optim.AdamW (fp32 states), since fp8mp.optim does
    not step parameters sharded by FSDP2 and tensor parallel at once (it raises naming the placements)."""
    if tp > 1:
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return fp8mp.optim.AdamW([{"params": matrices}, {"params": vectors, "state_dtype": torch.bfloat16}], lr=lr,
                             weight_decay=0.1, state_dtype=torch.float8_e4m3fn)


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ for gradients on several meshes, which it cannot stack: under --tp the projections'
    live on the 2-D dp x tp mesh, the embeddings' and norms' on the dp mesh. Each mesh's norm is computed apart
    (reduced over it), then they are combined."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    by_mesh: dict = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float())
    total = torch.stack(norms).norm()
    coef = min(1.0, max_norm / (total.item() + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def batch(data: torch.Tensor, step: int, args, dp_rank: int, dp_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's rows of step `step`'s global batch (a function of the step: a resumed run
    reads what the uninterrupted one would)."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, data.numel() - args.context - 1, (args.batch_size,), generator=gen)
    rows = starts[dp_rank * args.batch_size // dp_size:(dp_rank + 1) * args.batch_size // dp_size]
    x = torch.stack([data[s:s + args.context] for s in rows.tolist()])
    y = torch.stack([data[s + 1:s + 1 + args.context] for s in rows.tolist()])
    return x.to(device), y.to(device)


def fp8_layers_scaled(model: torch.nn.Module) -> int:
    """How many FP8 layers have set their scales from data (a forward in FP8 under fp8_autocast)."""
    from fp8mp.scaling.fp8_meta import Fp8Meta
    return sum(1 for m in model.modules() if isinstance(m, Fp8Meta) and m.is_initialized())


def newest_checkpoint(folder: str) -> tuple[int, str] | None:
    """(step, path) of the newest complete checkpoint (DCP writes .metadata last), or None."""
    if not os.path.isdir(folder):
        return None
    found = [(int(name.split("-")[1]), os.path.join(folder, name)) for name in os.listdir(folder)
             if name.startswith("step-") and os.path.exists(os.path.join(folder, name, ".metadata"))]
    return max(found) if found else None


def main(argv=None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the world size {world}")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    dp_mesh = mesh["dp"]
    dp_group = dp_mesh.get_group()
    # the amaxes are reduced over every rank that holds a part of a tensor: the dp group, and under --tp all ranks
    fp8_group = dist.group.WORLD if args.tp > 1 else dp_group

    model = build_model(args, device)
    if args.tp > 1:
        apply_tensor_parallel(model, mesh["tp"])
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    optimizer = make_optimizer(model, args.lr, args.tp)
    scaler = fp8mp.LossScaler()

    start = 0
    found = newest_checkpoint(args.checkpoint_dir) if args.resume else None
    if found is not None:
        start, path = found
        fp8mp.training.load_checkpoint(path, model, optimizer, scaler)
        if rank == 0:
            print(f"resumed from {path} (step {start}) on {world} processes", flush=True)

    data = torch.frombuffer(bytearray(make_corpus(200_000, seed=args.seed)), dtype=torch.uint8).long()
    losses = {}
    for step in range(start, args.steps):
        began = time.perf_counter()
        x, y = batch(data, step, args, dp_mesh.get_local_rank(), dp_mesh.size(), device)
        with fp8mp.fp8_autocast(fp8_group=fp8_group):
            logits = model(input_ids=x).logits
        # this rank's share of the global mean: FSDP2 averages the gradients over the dp ranks
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        if args.tp > 1:
            clip_grad_norm(model.parameters(), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)
        losses[step] = total.item() / dp_mesh.size()
        if rank == 0:
            print(f"step {step} loss {losses[step]:.4f} ({time.perf_counter() - began:.2f} s)", flush=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            path = os.path.join(args.checkpoint_dir, STEP_FOLDER.format(step + 1))
            fp8mp.training.save_checkpoint(path, model, optimizer, scaler)
            if rank == 0:
                print(f"saved {path}", flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world": world, "tp": args.tp, "losses": losses,
                       "fp8_layers": fp8_layers_scaled(model)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
