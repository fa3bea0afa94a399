"""Bit digests of short training runs: proof that a restructuring of fp8mp changed no bit of what it computes.

Runs a fixed set of configurations for a few steps on the CPU and prints, per configuration, one SHA-256 digest
of every loss, parameter, gradient, optimizer state and FP8 scaling state (scales, amaxes, amax histories), and
one digest per part, so that a difference says where it is:

    python benchmarks/bit_digests.py --out before.json              # at the commit a change starts from
    python benchmarks/bit_digests.py --compare before.json          # after it: exit 1 on any difference

The configurations use fp8mp's public API only (fp8mp.nn, convert, fp8_autocast, fp8mp.recipe, fp8mp.optim,
step_in_backward, the integrations, save/load_checkpoint), so the script runs unchanged across a move of
fp8mp's internal files: the demo GPT under each of the five recipes, LayerNormLinear, the memory-lean recipe
(bf16 parameters, FP8 AdamW states, FP8 saved activations), the step in backward with the chunked loss, a
Qwen3-MoE and a Mixtral through the experts hook, a frozen-FP8 LoRA, a save/load resume, and under torchrun on
two gloo ranks FSDP2 with FP8 all-gather and tensor parallel.

Digests hash values in a fixed order (the modules' and the optimizer's), never key names: a renamed buffer
keeps its digest. They are bit-exact on one machine; another CPU may sum some high-precision parts (torch's own
bf16 and fp32 kernels) in another order, so compare digests recorded on the same machine and torch.
benchmarks/bit_digests.json holds one such record (its machine, torch and commit inside; benchmarks/RESULTS.md).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The checkout's fp8mp (built in place: make build), not an installed wheel of another commit.
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
import fp8mp  # noqa: E402
from fp8mp import recipe as fp8_recipes  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402

STEPS = 3
TINY_GPT = dict(vocab_size=256, context=32, n_layers=2, d_model=64, n_heads=2)
RECIPES = {
    "delayed": lambda: fp8_recipes.DelayedScaling(),
    "current": lambda: fp8_recipes.CurrentScaling(),
    "rowwise": lambda: fp8_recipes.RowwiseScaling(),
    "block": lambda: fp8_recipes.BlockScaling(),
    "mxfp8": lambda: fp8_recipes.MXFP8Scaling(),
}


# ---------------------------------------------------------------- digests
class Digest:
    """SHA-256 per part (losses, params, grads, optimizer, fp8_state) and of all parts together."""

    PARTS = ("losses", "params", "grads", "optimizer", "fp8_state")

    def __init__(self):
        self.parts = {part: hashlib.sha256() for part in self.PARTS}
        self.counts = dict.fromkeys(self.PARTS, 0)

    def add(self, part: str, tensor: torch.Tensor) -> None:
        tensor = _full(tensor).detach().cpu().contiguous()
        h = self.parts[part]
        h.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.numel():
            h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
        self.counts[part] += 1

    def add_model(self, model: torch.nn.Module) -> None:
        for p in model.parameters():
            self.add("params", p)
            if p.grad is not None:
                self.add("grads", p.grad)
        for b in model.buffers():  # FP8 scaling state: scales, amaxes, amax histories, flags
            self.add("fp8_state", b)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for p_state in optimizer.state.values():
            for key in sorted(p_state):
                value = p_state[key]
                self.add("optimizer", value if isinstance(value, torch.Tensor) else torch.tensor(float(value)))

    def add_losses(self, losses: list[float]) -> None:
        self.add("losses", torch.tensor(losses, dtype=torch.float64))

    def result(self) -> dict:
        whole = hashlib.sha256()
        out = {}
        for part in self.PARTS:
            out[part] = f"{self.parts[part].hexdigest()[:16]} ({self.counts[part]})"
            whole.update(self.parts[part].digest())
        out["all"] = whole.hexdigest()[:16]
        return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (every rank's shard gathered, as bytes: gloo gathers no float8); a plain tensor as
    it is (rank-local state: every rank's digest counts, run_ranks)."""
    if not hasattr(t, "full_tensor"):
        return t
    from torch.distributed.tensor import DTensor

    local = t.to_local()
    if local.element_size() != 1:
        return t.full_tensor()
    as_bytes = DTensor.from_local(local.view(torch.uint8), t.device_mesh, t.placements, shape=t.shape,
                                  stride=t.stride())
    return as_bytes.full_tensor().view(t.dtype)


# ---------------------------------------------------------------- the runs
def tokens(step: int, batch: int = 4, context: int = TINY_GPT["context"], vocab: int = 256):
    gen = torch.Generator().manual_seed(1000 + step)
    window = torch.randint(0, vocab, (batch, context + 1), generator=gen)
    return window[:, :-1], window[:, 1:]


def train(model, optimizer, step_fn, steps: int = STEPS, in_backward=None) -> list[float]:
    """`steps` training steps of `step_fn(model, step) -> loss`: backward and optimizer.step(), or
    `in_backward.backward(loss)` (an fp8mp.step_in_backward handle, which steps inside backward); the losses."""
    losses = []
    for step in range(steps):
        loss = step_fn(model, step)
        if in_backward is not None:
            in_backward.backward(loss)
        else:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())
    return losses


def digest_of(model, optimizer, losses) -> dict:
    d = Digest()
    d.add_losses(losses)
    d.add_model(model)
    if optimizer is not None:
        d.add_optimizer(optimizer)
    return d.result()


def gpt(config: dict | None = None) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY_GPT, **(config or {})}))


def gpt_loss(recipe, autocast_bf16: bool = True):
    def step(model, i):
        x, y = tokens(i)
        with contextlib.ExitStack() as stack:
            if autocast_bf16:
                stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            stack.enter_context(fp8mp.fp8_autocast(fp8_recipe=recipe))
            return model(x, y)[1]
    return step


def run_gpt(recipe_name: str) -> dict:
    recipe = RECIPES[recipe_name]()
    model = fp8mp.convert(gpt(), recipe=recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return digest_of(model, optimizer, train(model, optimizer, gpt_loss(recipe)))


def run_layernorm_linear() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(fp8mp.nn.LayerNormLinear(64, 128), torch.nn.GELU(), fp8mp.nn.Linear(128, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(m, i):
        gen = torch.Generator().manual_seed(2000 + i)
        x, target = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
        with fp8mp.fp8_autocast(fp8_recipe=fp8_recipes.DelayedScaling()):
            return torch.nn.functional.mse_loss(m(x), target)
    return digest_of(model, optimizer, train(model, optimizer, step))


def fp8_state_adamw(params):
    return fp8mp.optim.AdamW(params, lr=1e-3, state_dtype=torch.float8_e4m3fn)


def run_memory_lean() -> dict:
    recipe = fp8_recipes.RowwiseScaling()
    model = fp8mp.convert(gpt().to(torch.bfloat16), recipe=recipe, fp8_saved_activations=True)
    optimizer = fp8_state_adamw(model.parameters())
    return digest_of(model, optimizer, train(model, optimizer, gpt_loss(recipe, autocast_bf16=False)))


def run_step_in_backward_chunked_loss() -> dict:
    recipe = fp8_recipes.RowwiseScaling()
    model = fp8mp.convert(gpt({"chunked_loss": True}).to(torch.bfloat16), recipe=recipe)
    optimizer = fp8_state_adamw(model.parameters())
    losses = train(model, optimizer, gpt_loss(recipe, autocast_bf16=False),
                   in_backward=fp8mp.step_in_backward(optimizer))
    return digest_of(model, optimizer, losses)


def moe_config(family: str):
    import transformers

    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, bos_token_id=0,
                  eos_token_id=0, pad_token_id=0, num_key_value_heads=2, head_dim=16, num_experts_per_tok=2)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                                           num_experts=8, decoder_sparse_step=1, mlp_only_layers=[])
    return transformers.MixtralConfig(**common, intermediate_size=32, num_local_experts=8)


def run_moe(family: str) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from fp8mp.integrations import hf

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(moe_config(family)).to(torch.bfloat16)
    model = hf.prepare(model)
    optimizer = fp8_state_adamw(model.parameters())

    def step(m, i):
        ids = torch.randint(1, 128, (2, 24), generator=torch.Generator().manual_seed(3000 + i))
        with fp8mp.fp8_autocast():
            return m(input_ids=ids, labels=ids).loss
    return digest_of(model, optimizer, train(model, optimizer, step))


def run_lora_frozen_fp8() -> dict:
    torch.manual_seed(0)
    model = fp8mp.convert(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)))
    fp8mp.nn.lora.apply_lora(model, rank=8, alpha=16.0, targets=["0", "2"], fp8_base_weight=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)

    def step(m, i):
        gen = torch.Generator().manual_seed(4000 + i)
        x, target = torch.randn(32, 64, generator=gen), torch.randn(32, 64, generator=gen)
        with fp8mp.fp8_autocast():
            return torch.nn.functional.mse_loss(m(x), target)
    return digest_of(model, optimizer, train(model, optimizer, step))


def run_resume() -> dict:
    """STEPS steps, a save_checkpoint, then a fresh model and optimizer that load it and train STEPS more."""
    recipe = fp8_recipes.DelayedScaling()

    def fresh():
        model = fp8mp.convert(gpt().to(torch.bfloat16), recipe=recipe)
        return model, fp8_state_adamw(model.parameters())

    model, optimizer = fresh()
    losses = train(model, optimizer, gpt_loss(recipe, autocast_bf16=False))
    with tempfile.TemporaryDirectory() as folder:
        fp8mp.training.save_checkpoint(folder, model, optimizer)
        model, optimizer = fresh()
        fp8mp.training.load_checkpoint(folder, model, optimizer)
    losses += train(model, optimizer, gpt_loss(recipe, autocast_bf16=False))
    return digest_of(model, optimizer, losses)


# ---------------------------------------------------------------- two gloo ranks
class RankModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 64)) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def rank_batch(step: int, rank: int, world: int):
    gen = torch.Generator().manual_seed(5000 + step)
    x, target = torch.randn(8, 4, 64, generator=gen), torch.randn(8, 4, 64, generator=gen)
    share = x.shape[0] // world
    return x[rank * share:(rank + 1) * share], target[rank * share:(rank + 1) * share]


def rank_run(name: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    recipe = fp8_recipes.DelayedScaling()
    if name == "fsdp2_fp8_all_gather":
        from torch.distributed.fsdp import fully_shard

        model = fp8mp.convert(RankModel().to(torch.bfloat16), recipe=recipe, fp8_all_gather=True)
        for module in (*model.blocks, model):
            fully_shard(module)
        batch_rank, batch_world = rank, world
    else:  # tensor parallel: every rank sees the whole batch
        from torch.distributed.tensor.parallel import parallelize_module
        from fp8mp.nn.tensor_parallel import Fp8ColwiseParallel, Fp8RowwiseParallel

        model = fp8mp.convert(RankModel(), recipe=recipe)
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            parallelize_module(block, mesh, {"1": Fp8ColwiseParallel(), "3": Fp8RowwiseParallel()})
        batch_rank, batch_world = 0, 1
    if name == "fsdp2_fp8_all_gather":
        # FP8 states on the matrices; vectors (a norm's 64 elements, 32 a shard) are no whole 128-element block.
        matrices = [p for p in model.parameters() if p.dim() == 2]
        vectors = [p for p in model.parameters() if p.dim() != 2]
        optimizer = fp8mp.optim.AdamW([{"params": matrices}, {"params": vectors, "state_dtype": torch.bfloat16}],
                                      lr=1e-3, state_dtype=torch.float8_e4m3fn)
    else:  # row-wise Shard(1) weights: torch's optimizer (fp8mp's fused ones step Shard(0) DTensors)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(m, i):
        x, target = rank_batch(i, batch_rank, batch_world)
        with fp8mp.fp8_autocast(fp8_group=dist.group.WORLD):
            out = m(x.to(next(m.parameters()).dtype))
            return torch.nn.functional.mse_loss(out.float(), target)
    losses = train(model, optimizer, step)
    return digest_of(model, optimizer, losses)


def rank_worker(name: str, out_file: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        result = rank_run(name)
        pathlib.Path(f"{out_file}.rank{dist.get_rank()}").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(name: str, timeout_s: float = 240.0) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out_file = os.path.join(folder, "digest.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), __file__, "--rank-worker", name, out_file]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
            "PYTHONPATH", "")])}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun {name} failed (rc={proc.returncode}):\n{proc.stdout[-6000:]}\n"
                               f"{proc.stderr[-6000:]}")
        ranks = [json.loads(pathlib.Path(f"{out_file}.rank{r}").read_text()) for r in range(2)]
    # Each rank's digest holds its local state too (FP8 scaling buffers, sharded optimizer scales): both count.
    return {part: "/".join(dict.fromkeys(rank[part] for rank in ranks)) for part in ranks[0]}


CONFIGS = {
    **{f"gpt_{name}": (lambda name=name: run_gpt(name)) for name in RECIPES},
    "layernorm_linear": run_layernorm_linear,
    "memory_lean": run_memory_lean,
    "step_in_backward_chunked_loss": run_step_in_backward_chunked_loss,
    "qwen3_moe_experts": lambda: run_moe("qwen3_moe"),
    "mixtral_experts": lambda: run_moe("mixtral"),
    "lora_frozen_fp8": run_lora_frozen_fp8,
    "resume": run_resume,
    "fsdp2_fp8_all_gather": lambda: run_ranks("fsdp2_fp8_all_gather"),
    "tensor_parallel": lambda: run_ranks("tensor_parallel"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names (default: all)")
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", help="a JSON file of an earlier run: exit 1 if any digest differs")
    parser.add_argument("--rank-worker", nargs=2, metavar=("NAME", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_worker:
        rank_worker(*args.rank_worker)
        return 0
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"argument --configs: unknown {unknown}; choose from {list(CONFIGS)}")
    torch.set_num_threads(1)  # one summation order whatever the machine's core count
    results = {"machine": _machine(), "torch": torch.__version__, "digests": {}}
    for name in names:
        started = time.perf_counter()
        results["digests"][name] = CONFIGS[name]()
        print(f"{name:32s} {results['digests'][name]['all']}  ({time.perf_counter() - started:.1f} s)", flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if args.compare:
        return _compare(json.loads(pathlib.Path(args.compare).read_text()), results)
    return 0


def _machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def _compare(before: dict, now: dict) -> int:
    if before.get("machine") != now["machine"] or before.get("torch") != now["torch"]:
        print(f"note: recorded on {before.get('machine')} with torch {before.get('torch')}, compared on "
              f"{now['machine']} with torch {now['torch']}: high-precision sums may differ in order")
    differ = []
    for name, digest in now["digests"].items():
        old = before["digests"].get(name)
        if old is None:
            print(f"{name}: not in the earlier run")
            differ.append(name)
        elif old != digest:
            parts = [p for p in Digest.PARTS if old.get(p) != digest.get(p)]
            print(f"{name}: DIFFERS in {', '.join(parts)}")
            differ.append(name)
    print(f"{len(now['digests']) - len(differ)} identical, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
