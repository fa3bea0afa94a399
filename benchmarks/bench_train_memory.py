"""Bytes of a training step by category, for FP32, BF16 AMP, fp8mp (compute-only and memory-lean) and torchao's
peers, on the demo GPT and a ~110M-parameter Hugging Face Llama; plus the optimizer step's time.

Each run is one training step (forward, backward, optimizer step) in a fresh process, so that its peak RSS (and on
a GPU, torch.cuda.max_memory_allocated) is its own. Every tensor is counted once, by its storage (tied weights,
views and a tensor subclass's inner tensors included), in the first category that holds it:

  params + buffers        the model's parameters and buffers (FP8 scaling state included)
  grads                   the parameters' .grad after backward (with the step in backward, where no .grad is left:
                          the most bytes of .grad held at once during backward)
  optimizer state         every tensor in optimizer.state after the step (moments, block scales, step counters)
  saved for backward      what autograd saved during the forward (torch.autograd.graph.saved_tensors_hooks), less
                          parameters and buffers: activations, FP8 copies of inputs and weights, norm statistics

Training state is the first three; its bytes per parameter are set against the goal of 6.2 (BF16 AMP: 16), and
the total (training state + saved for backward) against BF16 AMP's in the same table (goal on the Llama: <= 0.45x).

Runs (RUNS): FP32; BF16 AMP (fp32 parameters, torch.autocast(bfloat16), torch.optim.AdamW); fp8mp compute-only
(the same with fp8mp's Linear layers under fp8mp.fp8_autocast); fp8mp memory-lean (model.to(torch.bfloat16): bf16
nn.Parameters, fp8mp's Linear layers under fp8_autocast(fp8_recipe=RowwiseScaling()), fp8mp.optim.AdamW with FP8
states and stochastically rounded bf16 parameters, the activation functions saving for backward in FP8 and the
norms in bf16: fp8mp.convert(model, fp8_saved_activations=True)); the same with the LM head
and loss chunked (fp8mp.integrations.hf.use_chunked_loss: the Llama only), and with the optimizer step in backward
too (fp8mp.step_in_backward: the LM head's, the FP8 Linear weights' and an untied embedding's gradients, the last
through fp8mp.nn.embedding_grad_in_row_blocks, stepped a block of rows of at most 1 MiB at a time); torchao's peers: Float8 training (convert_to_float8_training, emulated on the CPU) with
AdamWFp8, AdamW8bit, and bf16 parameters with its bf16 stochastic-rounding AdamW (torchao.optim._AdamW). The peers
keep bf16 parameters where the fp8mp memory-lean run does, and round them stochastically as it does. A run that
cannot run here gets a row that says why.

Models (MODELS): the demo GPT (examples/gpt_model.py: 4 layers, d_model 512, 8 heads, byte vocabulary, tied LM
head; batch 8 x 128) and a Llama from a transformers config (hidden 768, 12 layers, 12 heads of 64, intermediate
2048, vocabulary 32000, tied embeddings: 109.5M parameters; batch 4 x 256). The LM heads stay in high precision.

The optimizer step's time (bench_optimizer.py's parameters and timing) at each model's parameter shapes: the
memory-lean run's fp8mp.optim.AdamW (FP8 states, bf16 parameters) against BF16 AMP's torch.optim.AdamW(foreach=True)
(fp32 parameters), timed in turn in one process; ratio torch / fp8mp (> 1: fp8mp faster; goal >= 1.0).

    python benchmarks/bench_train_memory.py [--quick] [--device cpu|cuda] [--models gpt,llama] [--json PATH]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import traceback
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))

from results_json import record  # noqa: E402
from timing import markdown_table, time_peers, where  # noqa: E402

MIB = 2**20
CATEGORIES = ("params", "grads", "optimizer", "saved")
STATE_GOAL_BYTES_PER_PARAM = 6.2
TOTAL_GOAL_VS_BF16 = 0.45
LR = 1e-4


@dataclass(frozen=True)
class Run:
    """One way of training: parameter dtype, autocast, FP8 Linear layers and optimizer."""

    name: str
    param_dtype: torch.dtype = torch.float32
    autocast: bool = False  # torch.autocast(bfloat16) around the forward
    fp8: str | None = None  # "fp8mp" (fp8mp.convert, fp8_autocast) or "torchao" (convert_to_float8_training)
    optimizer: str = "torch AdamW"  # a key of OPTIMIZERS
    fp8_saved_activations: bool = False  # fp8mp.convert(..., fp8_saved_activations=True): norms, activations in FP8
    step_in_backward: bool = False  # fp8mp.step_in_backward(optimizer): each parameter steps as its gradient is ready
    chunked_loss: bool = False  # use_chunked_loss(model) / GPTConfig(chunked_loss=True): no [tokens, vocab] fp32 logits
    # The MLP's gated multiply and attention save FP8 (fp8mp.integrations.hf.use_fp8_saved_activations; the demo GPT:
    # GPTConfig(fp8_saved_attention=True))
    fp8_saved_functional: bool = False
    rowwise: bool = False  # fp8_autocast(fp8_recipe=RowwiseScaling()), the memory-lean recipe's (else its default)


EVERY_LEVER = "fp8mp memory-lean + FP8-saved MLP and attention + step in backward + chunked loss"
RUNS = [
    Run("FP32"),
    Run("BF16 AMP", autocast=True),
    Run("fp8mp compute-only", autocast=True, fp8="fp8mp"),
    Run("fp8mp memory-lean", param_dtype=torch.bfloat16, fp8="fp8mp", optimizer="fp8mp AdamW FP8",
        fp8_saved_activations=True, rowwise=True),
    Run("fp8mp memory-lean + chunked loss", param_dtype=torch.bfloat16, fp8="fp8mp", optimizer="fp8mp AdamW FP8",
        fp8_saved_activations=True, chunked_loss=True, rowwise=True),
    Run("fp8mp memory-lean + step in backward + chunked loss", param_dtype=torch.bfloat16, fp8="fp8mp",
        optimizer="fp8mp AdamW FP8", fp8_saved_activations=True, step_in_backward=True, chunked_loss=True,
        rowwise=True),
    Run(EVERY_LEVER, param_dtype=torch.bfloat16,
        fp8="fp8mp", optimizer="fp8mp AdamW FP8", fp8_saved_activations=True, step_in_backward=True,
        chunked_loss=True, fp8_saved_functional=True, rowwise=True),
    Run("torchao Float8 + AdamWFp8", param_dtype=torch.bfloat16, fp8="torchao", optimizer="torchao AdamWFp8"),
    Run("torchao AdamW8bit", param_dtype=torch.bfloat16, autocast=True, optimizer="torchao AdamW8bit"),
    Run("torchao bf16 SR AdamW", param_dtype=torch.bfloat16, autocast=True, optimizer="torchao bf16 SR AdamW"),
]
BASELINE = "BF16 AMP"
# Goals of the every-lever run against BF16 AMP's row: total bytes, training state a parameter, saved for backward.
EVERY_LEVER_TOTAL_GOAL, EVERY_LEVER_STATE_GOAL, EVERY_LEVER_SAVED_GOAL = 0.33, 4.1, 0.45


def _torchao_optimizer(name: str, **kwargs):
    """A maker of torchao's optimizer `name`; torchao is imported only when a run asks for it (the GPU check's
    machine has none, and this module's other runs must not need it)."""

    def make(params):
        try:
            import torchao.optim
        except ImportError as error:
            raise RunUnavailable(f"torchao is not installed ({error})") from None
        # torchao's optimizers take the learning rate as a tensor (an LR schedule then fills it in place).
        return getattr(torchao.optim, name)(params, lr=torch.tensor(LR), bf16_stochastic_round=True, **kwargs)

    return make


OPTIMIZERS = {
    "torch AdamW": lambda params: torch.optim.AdamW(params, lr=LR, foreach=True),
    "fp8mp AdamW FP8": lambda params: __import__("fp8mp").optim.AdamW(params, lr=LR, state_dtype=torch.float8_e4m3fn),
    "torchao AdamWFp8": _torchao_optimizer("AdamWFp8"),
    "torchao AdamW8bit": _torchao_optimizer("AdamW8bit"),
    "torchao bf16 SR AdamW": _torchao_optimizer("_AdamW"),
}


# ------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelSpec:
    """A model to build and the batch it trains on."""

    name: str
    batch: int
    seq: int
    config: dict  # GPTConfig or LlamaConfig arguments


MODELS = {
    "gpt": ModelSpec("demo GPT", 8, 128, dict(n_layers=4, d_model=512, n_heads=8, context=128)),
    "llama": ModelSpec("Llama", 4, 256, dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                             num_key_value_heads=12, intermediate_size=2048, vocab_size=32000,
                                             tie_word_embeddings=True, max_position_embeddings=256)),
    "llama97m": ModelSpec("Llama, vocab 8192", 4, 256, dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                         num_key_value_heads=12, intermediate_size=2048, vocab_size=8192,
                                                         tie_word_embeddings=False, max_position_embeddings=256)),
}
QUICK_MODELS = {
    "gpt": ModelSpec("demo GPT (quick)", 2, 32, dict(n_layers=2, d_model=64, n_heads=2, context=32)),
    "llama": ModelSpec("Llama (quick)", 2, 32, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=4, intermediate_size=128, vocab_size=256,
                                                    tie_word_embeddings=True, max_position_embeddings=32)),
    "llama97m": ModelSpec("Llama, vocab 8192 (quick)", 2, 32, dict(hidden_size=128, num_hidden_layers=2,
                                                                 num_attention_heads=2, num_key_value_heads=2,
                                                                 intermediate_size=256, vocab_size=256,
                                                                 tie_word_embeddings=False, max_position_embeddings=32)),
}


def build_model(key: str, spec: ModelSpec, run: Run | None = None):
    """(model, loss function of a batch of token ids); the weights are drawn on the CPU, the same in every run."""
    torch.manual_seed(0)
    if key == "gpt":
        from gpt_model import GPT, GPTConfig

        levers = dict(fp8_saved_attention=run.fp8_saved_functional, chunked_loss=run.chunked_loss) if run else {}
        model = GPT(GPTConfig(**spec.config, **levers))
        return model, lambda m, ids: m(ids, ids)[1]
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        raise RunUnavailable(f"transformers is not installed ({error})") from None
    model = LlamaForCausalLM(LlamaConfig(**spec.config, attn_implementation="sdpa"))
    return model, lambda m, ids: m(input_ids=ids, labels=ids).loss


def output_embedding(model) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def to_fp8(model: torch.nn.Module, run: Run, device: str) -> torch.nn.Module:
    """The run's FP8 Linear layers; the LM head (a transformers model's output embedding) stays in high precision.

    The demo GPT's Linear layers are fp8mp.nn.Linear already (fp8mp.convert swaps nothing there): this is the one
    place where a run's fp8mp.convert options apply to both models.
    """
    import fp8mp

    head = output_embedding(model)
    if run.fp8 == "fp8mp":
        return fp8mp.convert(model, module_filter=lambda name, m: m is not head,
                             fp8_saved_activations=run.fp8_saved_activations)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as error:
        raise RunUnavailable(f"torchao is not installed ({error})") from None
    config = Float8LinearConfig(emulate=device == "cpu")  # torchao's exact emulation where there is no FP8 GEMM
    return convert_to_float8_training(fp8mp.unconvert(model), config=config,
                                      module_filter_fn=lambda m, name: m is not head)


class RunUnavailable(RuntimeError):
    """A run that cannot run here; its message says why."""


# ------------------------------------------------------------------------------------------------- counting
def leaf_tensors(value) -> list[torch.Tensor]:
    """The plain tensors holding `value`'s bytes: a tensor subclass (torchao's FP8 and 8-bit states, Float8
    training tensors) is flattened into its inner tensors."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not isinstance(value, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(value):
        names, _ = value.__tensor_flatten__()
        return [leaf for name in names for leaf in leaf_tensors(getattr(value, name))]
    return [value]


class StorageCounter:
    """Bytes by category, each storage counted once, in the first category that holds it."""

    def __init__(self):
        self.seen: dict[tuple[str, int], str] = {}
        self.bytes = dict.fromkeys(CATEGORIES, 0)

    def add(self, category: str, value) -> None:
        for t in leaf_tensors(value):
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in self.seen:
                continue
            self.seen[key] = category
            self.bytes[category] += storage.nbytes()

    def holds(self, t: torch.Tensor) -> bool:
        return all((str(leaf.device), leaf.untyped_storage().data_ptr()) in self.seen for leaf in leaf_tensors(t))

    def forget(self, category: str) -> None:
        """Drop the addresses of a category whose storages are freed (what backward saved), so that a storage
        allocated later at the same address is counted; its bytes stay."""
        self.seen = {key: c for key, c in self.seen.items() if c != category}


def count_saved(forward) -> tuple[object, list[torch.Tensor]]:
    """(forward's result, the tensors autograd saved while it ran)."""
    saved: list[torch.Tensor] = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = forward()
    return result, saved


def forward_context(run: Run, device: str):
    import contextlib

    stack = contextlib.ExitStack()
    if run.autocast:
        stack.enter_context(torch.autocast(device, dtype=torch.bfloat16))
    if run.fp8 == "fp8mp":
        import fp8mp

        stack.enter_context(fp8mp.fp8_autocast(fp8_recipe=fp8mp.recipe.RowwiseScaling() if run.rowwise else None))
    return stack


def measure(model_key: str, run: Run, quick: bool, device: str) -> dict:
    """One training step of `run` on the model; its bytes by category, parameter count and peak memory."""
    spec = (QUICK_MODELS if quick else MODELS)[model_key]
    rss_at_start_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    model, loss_of = build_model(model_key, spec, run)
    if run.fp8 is not None:
        model = to_fp8(model, run, device)
    model = model.to(device=device, dtype=run.param_dtype)
    if model_key != "gpt" and (run.chunked_loss or run.fp8_saved_functional):
        import fp8mp.integrations.hf

        if run.chunked_loss:
            fp8mp.integrations.hf.use_chunked_loss(model)
        if run.fp8_saved_functional:
            fp8mp.integrations.hf.use_fp8_saved_activations(model)
    optimizer = OPTIMIZERS[run.optimizer](model.parameters())
    stepper = None
    if run.step_in_backward:
        import fp8mp

        embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        head = output_embedding(model)
        if type(embedding) is torch.nn.Embedding and embedding.weight is not getattr(head, "weight", None):
            fp8mp.nn.embedding_grad_in_row_blocks(embedding)  # an untied embedding: its gradient a block of rows at a time
        stepper = fp8mp.step_in_backward(optimizer)
    vocab = spec.config.get("vocab_size", 256)
    ids = torch.randint(vocab, (spec.batch, spec.seq), generator=torch.Generator().manual_seed(1)).to(device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    counter = StorageCounter()
    for t in [*model.parameters(), *model.buffers()]:
        counter.add("params", t)
    with forward_context(run, device):
        loss, saved = count_saved(lambda: loss_of(model, ids))
    for t in saved:
        if not counter.holds(t):
            counter.add("saved", t)
    del saved
    counter.forget("saved")  # backward frees them
    if stepper is None:
        loss.backward()
        optimizer.step()
        for p in model.parameters():
            counter.add("grads", p.grad)
    else:  # no .grad is left: the most gradient bytes held at once during backward
        stepper.backward(loss)
        counter.bytes["grads"] += stepper.peak_grad_bytes
    for state in optimizer.state.values():
        for value in state.values():
            counter.add("optimizer", value)
    if not torch.isfinite(loss):
        raise RuntimeError(f"{run.name}: non-finite loss {loss.item()}")
    numel = sum(p.numel() for p in model.parameters())
    return {"model": spec.name, "run": run.name, "params_numel": numel, "batch": spec.batch, "seq": spec.seq,
            "bytes": counter.bytes, "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "rss_at_start_mib": rss_at_start_mib, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / MIB if device == "cuda" else None}


def child(argv: list[str]) -> None:
    """`--child MODEL RUN [--quick] [--device D]`: one run, its figures as the last line of stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("run")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    run = next(r for r in RUNS if r.name == args.run)
    try:
        result = measure(args.model, run, args.quick, args.device)
    except RunUnavailable as error:
        result = {"run": run.name, "unavailable": str(error)}
    except Exception as error:  # a peer that fails here gets a row saying how, not a silent omission
        traceback.print_exc()
        result = {"run": run.name, "unavailable": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
    print("RESULT " + json.dumps(result))


def run_in_fresh_process(model_key: str, run: Run, quick: bool, device: str) -> dict:
    import fp8mp

    command = [sys.executable, os.path.abspath(__file__), "--child", model_key, run.name, "--device", device]
    # The child imports the fp8mp this process imported (an in-place build rather than an installed one).
    fp8mp_root = os.path.dirname(os.path.dirname(os.path.abspath(fp8mp.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [fp8mp_root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command + (["--quick"] if quick else []), capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {"run": run.name, "unavailable": f"the process failed (exit {done.returncode}): {tail}"}
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------------------------------------- report
def add_totals(rows: list[dict]) -> None:
    """Training state, total, bytes per parameter, and the total against the BF16 AMP row of the same model."""
    measured = [r for r in rows if "bytes" in r]
    for r in measured:
        b = r["bytes"]
        r["training_state_bytes"] = b["params"] + b["grads"] + b["optimizer"]
        r["total_bytes"] = r["training_state_bytes"] + b["saved"]
        r["state_bytes_per_param"] = r["training_state_bytes"] / r["params_numel"]
    baseline = next((r for r in measured if r["run"] == BASELINE), None)
    for r in measured:
        r["total_vs_bf16_amp"] = r["total_bytes"] / baseline["total_bytes"] if baseline else None


def table(rows: list[dict], device: str) -> str:
    spec = next((r for r in rows if "bytes" in r), None)
    title = "training memory by category, MiB" + (
        f": {spec['model']}, {spec['params_numel'] / 1e6:.1f}M parameters, batch {spec['batch']} x {spec['seq']}, "
        f"{where(device)}" if spec else "")
    gpu = any(r.get("peak_gpu_mib") is not None for r in rows)
    headers = ["run", "params + buffers", "grads", "optimizer state", "saved for backward", "total", "vs BF16 AMP",
               "state bytes / param", "peak RSS", "peak RSS over start"] + (["peak GPU"] if gpu else [])
    cells = []
    for r in rows:
        if "bytes" not in r:
            cells.append([r["run"], f"not run: {r['unavailable']}"] + [""] * (len(headers) - 2))
            continue
        b = r["bytes"]
        ratio = "n/a" if r["total_vs_bf16_amp"] is None else f"{r['total_vs_bf16_amp']:.2f}"
        cells.append([r["run"], *(f"{b[c] / MIB:.1f}" for c in CATEGORIES), f"{r['total_bytes'] / MIB:.1f}", ratio,
                      f"{r['state_bytes_per_param']:.2f}", f"{r['peak_rss_mib']:.0f}",
                      f"{r['peak_rss_mib'] - r['rss_at_start_mib']:.0f}"]
                     + ([f"{r['peak_gpu_mib']:.0f}"] if gpu else []))
    return markdown_table(title, headers, cells)


def every_lever_goals(rows: list[dict]) -> str:
    """The every-lever run against BF16 AMP's row: total, training state a parameter, saved for backward."""
    lean = next((r for r in rows if r["run"] == EVERY_LEVER and "bytes" in r), None)
    base = next((r for r in rows if r["run"] == BASELINE and "bytes" in r), None)
    if lean is None or base is None:
        return "every lever: not measured (it or BF16 AMP did not run)"
    figures = [("total", lean["total_bytes"] / base["total_bytes"], EVERY_LEVER_TOTAL_GOAL, "x BF16 AMP"),
               ("training state", lean["state_bytes_per_param"], EVERY_LEVER_STATE_GOAL, " bytes/param"),
               ("saved for backward", lean["bytes"]["saved"] / base["bytes"]["saved"], EVERY_LEVER_SAVED_GOAL,
                "x BF16 AMP's")]
    return "every lever: " + "; ".join(f"{name} {value:.3f}{unit} ({'within' if value <= goal else 'NOT within'} "
                                       f"{goal})" for name, value, goal, unit in figures)


def goals(rows: list[dict]) -> str:
    lean = next((r for r in rows if r["run"] == "fp8mp memory-lean" and "bytes" in r), None)
    if lean is None:
        return "fp8mp memory-lean did not run"
    per_param = lean["state_bytes_per_param"]
    line = (f"fp8mp memory-lean: {per_param:.2f} bytes of training state per parameter "
            f"({'within' if per_param <= STATE_GOAL_BYTES_PER_PARAM else 'NOT within'} the goal of "
            f"{STATE_GOAL_BYTES_PER_PARAM})")
    if lean["total_vs_bf16_amp"] is not None:
        ratio = lean["total_vs_bf16_amp"]
        line += (f"; total {ratio:.2f}x BF16 AMP ({'within' if ratio <= TOTAL_GOAL_VS_BF16 else 'NOT within'} the "
                 f"goal of {TOTAL_GOAL_VS_BF16}x)")
    return line


def optimizer_step_times(model_key: str, quick: bool, device: str, rounds: int) -> dict:
    """fp8mp.optim.AdamW (FP8 states, bf16 parameters) against torch.optim.AdamW(foreach=True) (fp32 parameters)
    on the model's parameter shapes, with bench_optimizer.py's random parameters and gradients."""
    from bench_optimizer import make_params

    import fp8mp

    spec = (QUICK_MODELS if quick else MODELS)[model_key]
    model, _ = build_model(model_key, spec)
    shapes = [tuple(p.shape) for p in model.parameters()]
    del model
    optimizers = {
        "torch AdamW foreach, fp32 params": torch.optim.AdamW(make_params(shapes, torch.float32, device), lr=LR,
                                                              foreach=True),
        "fp8mp AdamW FP8 states, bf16 params": fp8mp.optim.AdamW(make_params(shapes, torch.bfloat16, device), lr=LR,
                                                                 state_dtype=torch.float8_e4m3fn),
    }
    for opt in optimizers.values():
        opt.step()  # create the states
    times = time_peers({name: opt.step for name, opt in optimizers.items()}, device, rounds=rounds, min_repeats=3,
                       min_seconds=0.2 if quick else 1.0)
    (peer, peer_s), (ours, ours_s) = ((name, times[name][0]) for name in optimizers)
    return {"model": spec.name, "params_numel": sum(torch.Size(s).numel() for s in shapes), "peer": peer,
            "peer_ms": peer_s * 1e3, "fp8mp": ours, "fp8mp_ms": ours_s * 1e3, "peer_over_fp8mp": peer_s / ours_s}


def step_time_table(rows: list[dict], device: str) -> str:
    cells = [[r["model"], f"{r['params_numel'] / 1e6:.1f}M", f"{r['peer_ms']:.1f}", f"{r['fp8mp_ms']:.1f}",
              f"{r['peer_over_fp8mp']:.2f}x"] for r in rows]
    return markdown_table(f"optimizer step: fp8mp.optim.AdamW (FP8 states, bf16 params) against "
                          f"torch.optim.AdamW(foreach=True) (fp32 params), {where(device)}",
                          ["model", "parameters", "torch ms", "fp8mp ms", "torch / fp8mp"], cells)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return {}
    from tqdm import tqdm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (what the tests run)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", default="gpt,llama", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--runs", default=None, help="comma-separated run names (default: all of RUNS)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the optimizer-step timing")
    parser.add_argument("--json", default=None, help="add the rows to this JSON file (benchmarks/results_json.py)")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    for key in models:
        if key not in MODELS:
            parser.error(f"argument --models: {key!r} is not one of {', '.join(MODELS)}")
    runs = RUNS if args.runs is None else [r for r in RUNS if r.name in args.runs.split(",")]
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    figures = {"memory": {}, "optimizer_step": []}
    jobs = [(key, run) for key in models for run in runs]
    for key, run in tqdm(jobs, desc="runs", unit="run", dynamic_ncols=True):
        figures["memory"].setdefault(key, []).append(run_in_fresh_process(key, run, args.quick, args.device))
    for key in tqdm(models, desc="optimizer step", unit="model", dynamic_ncols=True):
        try:
            figures["optimizer_step"].append(optimizer_step_times(key, args.quick, args.device, args.rounds))
        except RunUnavailable as error:
            print(f"optimizer step on {key}: not run: {error}")
    for key, rows in figures["memory"].items():
        add_totals(rows)
        print(table(rows, args.device))
        print(goals(rows))
        print(every_lever_goals(rows))
        print()
    if figures["optimizer_step"]:
        print(step_time_table(figures["optimizer_step"], args.device))
    record(args.json, "train_memory", figures)
    return figures


if __name__ == "__main__":
    main()
