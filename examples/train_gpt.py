"""Train one small GPT three times -- FP8, BF16, FP32 -- with the same seed and batches, and compare.

    python examples/train_gpt.py            # the `make demo` run (3-4 minutes on 2 CPU cores, AVX2-only ones too)
    python examples/train_gpt.py --quick    # a smaller model, under a minute
    python examples/train_gpt.py --peer torchao --seeds 5   # FP8 runs vs torchao's per seed, vs BF16 over 5 seeds
    python examples/train_gpt.py --device cuda --steps 50   # on a GPU (peak GPU memory per run in the table)

FP8: every projection (fp8mp.nn.Linear) computes in FP8 inside `fp8mp.fp8_autocast`
(DelayedScaling, Format.HYBRID: E4M3 forward, E5M2 gradients) while the rest of
the model runs under torch.autocast(bfloat16), so activations are bf16. BF16: the
same torch.autocast(bfloat16) without FP8; on a CPU without bf16 matrix units (--bf16-gemm auto) its
matmuls run as fp32 GEMMs of their bf16 operands rounded to bf16 (fp8mp.nn.bf16_via_fp32): the numbers of
torch's bf16 matmul, which there is oneDNN's emulation and ~100x slower. The table names the kernel that ran;
its step time is then not torch's bf16 path's (--bf16-gemm torch runs that). FP32: no autocast. All three keep fp32
master weights and AdamW state. Each run executes in its own process, so its
peak memory (max RSS) is its own. Results: a table on stdout, loss curves and the
FP8 numerics monitor's pictures under --out.

--peer torchao adds a run of the same GPT (same init, same batches) with torchao's
Float8Linear (emulate=True) in place of fp8mp.nn.Linear, under the recipe that matches
--recipe (tensorwise dynamic scaling for delayed and current, torchao's "rowwise" for
rowwise). --seeds N repeats FP8, the peer, FP8 memory-lean, its peer and BF16 for seeds
0..N-1 and prints one row per seed plus the means: at 200 steps this model's loss is chaotic
(FP8 vs BF16 moves by several percent from seed to seed), so each FP8 run is compared with its
peer per seed and with BF16 over the seeds' mean.

FP8 memory-lean (--seeds only) stores what the others keep in fp32 in fewer bytes: bf16
parameters (model.to(torch.bfloat16), ordinary nn.Parameters), fp8mp.optim.AdamW with FP8
states rounding them stochastically, FP8 Linear compute under fp8_autocast, no torch.autocast.
With --peer torchao its peer is torchao's nearest equivalent: Float8Linear on bf16 parameters
with torchao.optim.AdamWFp8(bf16_stochastic_round=True).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import multiprocessing
import os
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mp  # noqa: E402
from corpus import make_corpus  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402
from fp8mp.nn.bf16_via_fp32 import bf16_matmul_via_fp32  # noqa: E402
from fp8mp.recipe import BlockScaling, CurrentScaling, DelayedScaling, Format, MXFP8Scaling, RowwiseScaling  # noqa: E402


@dataclass(frozen=True)
class Precision:
    """How a run computes and stores: `autocast_dtype` for torch.autocast (None: off), `fp8` for
    fp8mp.fp8_autocast, the parameters' dtype and the optimizer (a key of OPTIMIZERS)."""

    name: str
    autocast_dtype: torch.dtype | None
    fp8: bool
    peer: str | None = None  # a peer library's FP8 Linear in place of fp8mp's (PEERS)
    param_dtype: torch.dtype = torch.float32
    optimizer: str = "torch AdamW"
    fp8_saved_activations: bool = False  # fp8mp.convert(model, fp8_saved_activations=True)


# Memory-lean: bf16 nn.Parameters (model.to(torch.bfloat16)), no torch.autocast, fp8mp.nn.Linear in FP8,
# fp8mp.optim.AdamW with FP8 states rounding the bf16 parameters stochastically (6.06 bytes of training state a
# parameter against the other runs' 16), and the norms and GELUs saving for backward in FP8
# (benchmarks/bench_train_memory.py).
PRECISIONS = {
    "fp8": Precision("FP8", torch.bfloat16, fp8=True),
    "fp8-lean": Precision("FP8 memory-lean", None, fp8=True, param_dtype=torch.bfloat16, optimizer="fp8mp AdamW FP8",
                          fp8_saved_activations=True),
    "bf16": Precision("BF16", torch.bfloat16, fp8=False),
    "fp32": Precision("FP32", None, fp8=False),
}

# --peer: torchao's Float8Linear (emulate=True: its exact CPU emulation) under the same torch.autocast(bfloat16).
PEERS = {"torchao": Precision("torchao FP8", torch.bfloat16, fp8=False, peer="torchao")}
# The memory-lean run's nearest torchao peer, compared per seed by --seeds with --peer torchao: the same three
# choices (FP8 Linear compute, FP8 AdamW states, bf16 parameters rounded stochastically) in torchao's
# implementation: Float8Linear and AdamWFp8(bf16_stochastic_round=True) on bf16 parameters.
LEAN_PEERS = {"torchao": Precision("torchao FP8 memory-lean", None, fp8=False, peer="torchao",
                                   param_dtype=torch.bfloat16, optimizer="torchao AdamWFp8")}


# --recipe: per-tensor (delayed, current; HYBRID) or fine-grained (rowwise, block, mxfp8; their E4M3 default).
RECIPES = {
    "delayed": DelayedScaling(fp8_format=Format.HYBRID),
    "current": CurrentScaling(fp8_format=Format.HYBRID),
    "rowwise": RowwiseScaling(),
    "block": BlockScaling(),
    "mxfp8": MXFP8Scaling(),
}


# --bf16-gemm: how the BF16 run's CPU matmuls compute (bf16_matmul_via_fp32's `enabled`). "auto": as fp32 GEMMs of
# their bf16 operands where the CPU has no bf16 matrix units (fp8mp.nn.bf16_via_fp32.cpu_has_bf16_matmul_units),
# else torch's bf16 matmul; "torch": always torch's; "fp32": always the fp32 GEMMs. Both give BF16's numbers (the
# same products, fp32 sums, one rounding to bf16); only the speed differs. On a GPU the BF16 run is always torch's.
BF16_GEMMS = {"auto": None, "torch": False, "fp32": True}


@dataclass(frozen=True)
class TrainConfig:
    """Optimization and data settings shared by all runs."""

    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 25
    eval_batches: int = 4
    corpus_bytes: int = 400_000
    monitor_every: int = 5
    recipe: str = "delayed"  # the FP8 run's recipe, a key of RECIPES
    device: str = "cpu"  # where the model and the batches live: "cpu" or "cuda"
    bf16_gemm: str = "auto"  # the BF16 run's matmuls on CPU, a key of BF16_GEMMS

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"TrainConfig: argument 'recipe' must be one of {sorted(RECIPES)}, got {self.recipe!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"TrainConfig: argument 'device' must be 'cpu' or 'cuda', got {self.device!r}")
        if self.bf16_gemm not in BF16_GEMMS:
            raise ValueError(f"TrainConfig: argument 'bf16_gemm' must be one of {sorted(BF16_GEMMS)}, got {self.bf16_gemm!r}")
        if self.bf16_gemm == "fp32" and self.device != "cpu":
            raise ValueError("TrainConfig: argument 'bf16_gemm' 'fp32' is a CPU path; on a GPU the BF16 run takes "
                             "torch's bf16 matmul")
        for name in ("steps", "batch_size", "eval_every", "eval_batches", "corpus_bytes", "monitor_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TrainConfig: argument '{name}' must be an int >= 1, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig: argument 'lr' must be > 0, got {self.lr!r}")


@dataclass
class RunResult:
    """What one run measured."""

    name: str
    train_losses: list[float]
    val_steps: list[int]
    val_losses: list[float]
    step_seconds: list[float]
    peak_rss_mib: float
    peak_gpu_mib: float | None = None  # torch.cuda.max_memory_allocated of the run's process (CUDA runs)
    fp8_modules: int = 0
    fp8_amax_nonzero: bool = False
    matmul_kernel: str | None = None  # the BF16 run's: "torch bf16 matmul" or "fp32 GEMM of bf16 operands"
    monitor_summary: str = ""
    files: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The run's name, with the matmul kernel its bf16 matmuls ran on where that is said."""
        return f"{self.name} ({self.matmul_kernel})" if self.matmul_kernel else self.name

    @property
    def final_train(self) -> float:
        """Mean training loss over the last 10% of steps (at least one): every run sees the same batches there."""
        tail = self.train_losses[-max(1, len(self.train_losses) // 10) :]
        return sum(tail) / len(tail)

    @property
    def final_val(self) -> float:
        return self.val_losses[-1]

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_seconds)


def load_data(config: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The generated corpus as byte ids, split 90% train / 10% validation."""
    data = torch.frombuffer(bytearray(make_corpus(config.corpus_bytes)), dtype=torch.uint8).long()
    split = int(0.9 * len(data))
    return data[:split], data[split:]


def batch_starts(data: torch.Tensor, count: int, batch_size: int, context: int, seed: int) -> torch.Tensor:
    """[count, batch_size] random window starts; the same seed gives every run the same batches."""
    if len(data) <= context + 1:
        raise ValueError(f"the corpus ({len(data)} bytes) is too short for context {context}; raise --corpus-bytes")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(len(data) - context - 1, (count, batch_size), generator=gen)


def get_batch(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = starts[:, None] + torch.arange(context + 1)
    window = data[offsets]
    return window[:, :-1], window[:, 1:]


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def precision_context(precision: Precision, recipe: DelayedScaling, device_type: str = "cpu"):
    """torch.autocast (if any) around fp8mp.fp8_autocast; yields the fp8_autocast state."""
    stack = contextlib.ExitStack()
    if precision.autocast_dtype is not None:
        stack.enter_context(torch.autocast(device_type, dtype=precision.autocast_dtype))
    state = stack.enter_context(fp8mp.fp8_autocast(enabled=precision.fp8, fp8_recipe=recipe))
    return stack, state


@torch.no_grad()
def evaluate(model: GPT, val: torch.Tensor, starts: torch.Tensor, precision: Precision, recipe,
             device: str = "cpu") -> float:
    """Mean validation loss over the fixed validation batches, in the run's own precision.

    In FP8 these forwards also push their amaxes into the layers' delayed-scaling history,
    as any forward inside fp8_autocast does.
    """
    model.eval()
    losses = []
    for batch_starts_ in starts:
        x, y = get_batch(val, batch_starts_, model.config.context)
        x, y = x.to(device), y.to(device)
        stack, _ = precision_context(precision, recipe, device)
        with stack:
            losses.append(model(x, y)[1].item())
    model.train()
    return sum(losses) / len(losses)


BETAS = (0.9, 0.95)


def _torchao_adamw_fp8(params, config: "TrainConfig"):
    from torchao.optim import AdamWFp8

    # torchao's optimizers take the learning rate as a tensor (set_lr fills it in place).
    return AdamWFp8(params, lr=torch.tensor(config.lr), betas=BETAS, weight_decay=config.weight_decay,
                    bf16_stochastic_round=True)


OPTIMIZERS = {
    "torch AdamW": lambda params, config: torch.optim.AdamW(params, lr=config.lr, betas=BETAS,
                                                            weight_decay=config.weight_decay),
    "fp8mp AdamW FP8": lambda params, config: fp8mp.optim.AdamW(params, lr=config.lr, betas=BETAS,
                                                                weight_decay=config.weight_decay,
                                                                state_dtype=torch.float8_e4m3fn),
    "torchao AdamWFp8": _torchao_adamw_fp8,
}


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def train_step(model, optimizer, x, y, precision, recipe, grad_clip: float, device_type: str = "cpu") -> tuple[float, int]:
    """One forward/backward/clip/update; returns (loss, number of modules that ran in FP8)."""
    stack, state = precision_context(precision, recipe, device_type)
    with stack:
        _, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item(), len(state.modules) if precision.fp8 else 0


# The torchao recipe matching each --recipe; BlockScaling and MXFP8 have no torchao Float8Linear twin.
TORCHAO_RECIPES = {"delayed": "tensorwise", "current": "tensorwise", "rowwise": "rowwise"}


def with_torchao_float8(model: torch.nn.Module, recipe: str) -> torch.nn.Module:
    """`model` with torchao's Float8Linear (emulate=True) in place of each fp8mp.nn.Linear, sharing the weights."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if recipe not in TORCHAO_RECIPES:
        raise ValueError(f"--peer torchao: no torchao Float8Linear recipe matches --recipe {recipe!r}; "
                         f"use one of {sorted(TORCHAO_RECIPES)}")
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[recipe]), emulate=True)
    return convert_to_float8_training(fp8mp.unconvert(model), config=config)


def train(model_config: GPTConfig, config: TrainConfig, precision: Precision, out_dir: str | None = None,
          build_model=None) -> RunResult:
    """Train a fresh GPT (seed `config.seed`) on the fixed batches in `precision`; returns its measurements.

    build_model(model_config, precision), if given, builds the model instead of GPT(model_config): one called as
    GPT is (model(x, y) -> (logits, loss), `config.context`), e.g. train_moe.py's transformers MoE."""
    train_data, val_data = load_data(config)
    starts = batch_starts(train_data, config.steps, config.batch_size, model_config.context, config.seed + 1)
    val_starts = batch_starts(val_data, config.eval_batches, config.batch_size, model_config.context, config.seed + 2)
    torch.manual_seed(config.seed)
    # initialized on the CPU: the same weights on every device
    model = GPT(model_config) if build_model is None else build_model(model_config, precision)
    if precision.peer is not None:
        model = with_torchao_float8(model, config.recipe)
    if precision.fp8_saved_activations:
        model = fp8mp.convert(model, fp8_saved_activations=True)
    model = model.to(device=config.device, dtype=precision.param_dtype)
    optimizer = OPTIMIZERS[precision.optimizer](model.parameters(), config)
    recipe = RECIPES[config.recipe]
    monitor = fp8mp.monitor.attach(model, every=config.monitor_every) if precision.fp8 else None
    result = RunResult(precision.name, [], [], [], [], peak_rss_mib=0.0)
    with bf16_matmul_via_fp32(_bf16_gemm_enabled(precision, config)) as bf16_matmul:
        _train_loop(model, optimizer, monitor, recipe, precision, config, model_config.context, train_data, val_data,
                    starts, val_starts, result)
    if is_bf16_baseline(precision):
        result.matmul_kernel = bf16_matmul.kernel
    _finish(result, model, monitor, out_dir)
    return result


def is_bf16_baseline(precision: Precision) -> bool:
    """Whether `precision` is a BF16 baseline: torch.autocast(bfloat16) around torch's own modules, no FP8."""
    return precision.autocast_dtype == torch.bfloat16 and not precision.fp8 and precision.peer is None


def _bf16_gemm_enabled(precision: Precision, config: TrainConfig) -> bool | None:
    """bf16_matmul_via_fp32's `enabled` for a run: config.bf16_gemm's for a BF16 baseline on CPU, else off (the
    FP8 runs and the peers are measured on torch's own kernels, a GPU always on torch's bf16 matmul)."""
    if config.device != "cpu" or not is_bf16_baseline(precision):
        return False
    return BF16_GEMMS[config.bf16_gemm]


def _train_loop(model, optimizer, monitor, recipe, precision: Precision, config: TrainConfig, context: int, train_data,
                val_data, starts, val_starts, result: RunResult) -> None:
    """config.steps training steps of `model` in `precision`, each step's loss and time and the evaluations into
    `result`."""
    for step in tqdm(range(config.steps), desc=f"{precision.name:>4}", unit="step", dynamic_ncols=True, leave=True):
        set_lr(optimizer, lr_at(step, config))
        x, y = get_batch(train_data, starts[step], context)
        x, y = x.to(config.device), y.to(config.device)
        t0 = time.perf_counter()
        loss, fp8_modules = train_step(model, optimizer, x, y, precision, recipe, config.grad_clip, config.device)
        result.step_seconds.append(time.perf_counter() - t0)
        result.train_losses.append(loss)
        result.fp8_modules = max(result.fp8_modules, fp8_modules)
        if monitor is not None:
            monitor.record_step()
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            with monitor.pause() if monitor is not None else contextlib.nullcontext():
                result.val_losses.append(evaluate(model, val_data, val_starts, precision, recipe, config.device))
            result.val_steps.append(step + 1)


def _finish(result: RunResult, model: GPT, monitor, out_dir: str | None) -> None:
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    if next(model.parameters()).is_cuda:
        result.peak_gpu_mib = torch.cuda.max_memory_allocated() / 2**20
    linears = [m for m in model.modules() if isinstance(m, fp8mp.nn.Linear)]
    result.fp8_amax_nonzero = bool(linears) and all(bool((m.fp8_meta.amax > 0).all()) for m in linears)
    if monitor is None:
        return
    monitor.detach()
    result.monitor_summary = monitor.summary()
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        result.files = [monitor.to_csv(os.path.join(out_dir, "fp8_monitor.csv")), *monitor.plot(out_dir)]


def run_all(model_config: GPTConfig, config: TrainConfig, out_dir: str | None,
            precisions: list[Precision] | None = None, build_model=None) -> list[RunResult]:
    """The runs (default FP8, BF16, FP32), in that order, one process each (so max RSS is per run)."""
    results = []
    for precision in precisions or list(PRECISIONS.values()):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            results.append(pool.submit(train, model_config, config, precision, out_dir, build_model).result())
    return results


def run_seeds(model_config: GPTConfig, config: TrainConfig, seeds: int, peer: Precision | None,
              lean_peer: Precision | None = None, build_model=None, lean: bool = True) -> str:
    """FP8, the peer (if any), FP8 memory-lean (if `lean`), its peer (if any) and BF16 for seeds 0..seeds-1; returns
    the per-seed table with the means. build_model(model_config, precision): the model of each run (default GPT)."""
    from gpt_report import seed_table

    lean_runs = [PRECISIONS["fp8-lean"], *([lean_peer] if lean_peer is not None else [])] if lean else []
    precisions = [PRECISIONS["fp8"], *([peer] if peer is not None else []), *lean_runs, PRECISIONS["bf16"]]
    per_seed = []
    for seed in range(seeds):
        results = run_all(model_config, dataclasses.replace(config, seed=seed), None, precisions, build_model)
        per_seed.append({r.name: r.final_val for r in results})
        print(f"seed {seed}: " + ", ".join(f"{r.label} {r.final_val:.4f}" for r in results), flush=True)
    return seed_table(per_seed, peer.name if peer is not None else None,
                      lean_peer.name if lean_peer is not None else None)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--layers", type=int, default=GPTConfig.n_layers)
    parser.add_argument("--d-model", type=int, default=GPTConfig.d_model)
    parser.add_argument("--heads", type=int, default=GPTConfig.n_heads)
    parser.add_argument("--context", type=int, default=GPTConfig.context)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    parser.add_argument("--quick", action="store_true", help="2 layers, d=128, context 64, 30 steps: under a minute")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default=TrainConfig.recipe, help="the FP8 run's recipe")
    parser.add_argument("--peer", choices=sorted(PEERS), default=None,
                        help="also train with this library's FP8 Linear under the matching recipe")
    parser.add_argument("--seeds", type=int, default=None,
                        help="FP8, FP8 memory-lean, their peers and BF16 for seeds 0..N-1: per-seed final val "
                             "losses and their means")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--bf16-gemm", choices=list(BF16_GEMMS), default=TrainConfig.bf16_gemm,
                        help="the BF16 run's CPU matmuls: 'fp32' GEMMs of its bf16 operands (BF16's numbers at fp32 "
                             "speed), 'torch' bf16 matmul, or 'auto': fp32 where the CPU has no bf16 matrix units")
    parser.add_argument("--json", default=None,
                        help="add each run's losses, step time and peak memory to this JSON file (benchmarks/results_json.py)")
    return parser.parse_args(argv)


def configs_from(args: argparse.Namespace) -> tuple[GPTConfig, TrainConfig]:
    if args.quick:
        return GPTConfig(n_layers=2, d_model=128, n_heads=4, context=64), TrainConfig(steps=30, batch_size=8, eval_every=10, seed=args.seed,
                                                                                    recipe=args.recipe, device=args.device,
                                                                                    bf16_gemm=args.bf16_gemm)
    model_config = GPTConfig(n_layers=args.layers, d_model=args.d_model, n_heads=args.heads, context=args.context)
    return model_config, TrainConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed,
                                     eval_every=min(TrainConfig.eval_every, args.steps), recipe=args.recipe,
                                     device=args.device, bf16_gemm=args.bf16_gemm)


def main(argv=None) -> None:
    from gpt_report import plot_losses, report_table

    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    model_config, config = configs_from(args)
    print(f"fp8mp {fp8mp.__version__} | torch {torch.__version__} | {torch.get_num_threads()} CPU threads")
    print(f"model: {model_config}\ntrain: {config}\n")
    t0 = time.perf_counter()
    peer = PEERS[args.peer] if args.peer is not None else None
    if args.seeds is not None:
        if args.seeds < 1:
            raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
        print(run_seeds(model_config, config, args.seeds, peer, LEAN_PEERS.get(args.peer)))
        print(f"total wall time {time.perf_counter() - t0:.0f} s")
        return
    precisions = [PRECISIONS["fp8"], *([peer] if peer is not None else []), PRECISIONS["bf16"], PRECISIONS["fp32"]]
    results = run_all(model_config, config, args.out, precisions)
    fp8 = results[0]
    print(f"\nFP8 numerics (fp8mp.monitor, every {config.monitor_every} steps; {fp8.fp8_modules} FP8 modules):")
    print(fp8.monitor_summary)
    print()
    print(report_table(results))
    files = [plot_losses(results, os.path.join(args.out, "loss_curves.png")), *fp8.files]
    print(f"\nwrote {', '.join(os.path.relpath(f) for f in files)}")
    print(f"total wall time {time.perf_counter() - t0:.0f} s")
    if args.json:
        record_runs(args.json, results)
    diverged = [r.name for r in results if not all(math.isfinite(v) for v in r.train_losses + r.val_losses)]
    if diverged:
        raise SystemExit(f"non-finite loss in {', '.join(diverged)}")


def record_runs(path: str, results: list[RunResult]) -> None:
    """Each run's final losses, median step and peak memory under the key "gpt", in the JSON file at `path`."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
    from results_json import record

    record(path, "gpt", [{"run": r.name, "steps": len(r.train_losses), "final_train_loss": r.final_train,
                          "final_val_loss": r.final_val, "median_step_s": r.median_step_s, "peak_rss_mib": r.peak_rss_mib,
                          "peak_gpu_mib": r.peak_gpu_mib, "matmul_kernel": r.matmul_kernel} for r in results])


if __name__ == "__main__":
    main()
