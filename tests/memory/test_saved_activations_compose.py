"""FP8-saved activations with the rest of a training step: checkpointing, autocast, fp8_autocast, torch.compile,
threads, convert/unconvert, the demo GPT, the byte counter, and bad arguments."""
from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import weakref

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from transformers.activations import NewGELUActivation
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import fp8mp
from fp8mp.memory import saved_activations
from fp8mp.memory.saved_activations import (disable_fp8_saved_activations, enable_fp8_saved_activations,
                                        has_fp8_saved_activations, is_fp8_saved_activation_module)
from fp8mp.memory.saved_tensors import saved_tensor_bytes

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gpt_model import GPT, GPTConfig  # noqa: E402

FP8_BYTES = 1 + 4 / 128


def block(norm=torch.nn.LayerNorm, act=torch.nn.GELU, width=128) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, 2 * width), norm(2 * width), act(), torch.nn.Linear(2 * width, width))


def grads(model, x, wrap=None):
    model.zero_grad()
    out = wrap(model, x) if wrap is not None else model(x)
    out.square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def checkpointed(model, x):
    return checkpoint(model, x, use_reentrant=False)


# ---------------------------------------------------------------- checkpointing


@pytest.mark.parametrize("norm", [torch.nn.LayerNorm, torch.nn.RMSNorm])
def test_checkpoint_recomputes_the_fp8_copies_and_keeps_none(norm, monkeypatch):
    """Inside a non-reentrant checkpoint the FP8 copies go to the checkpoint's hooks: none outlives the forward,
    backward recomputes the same bits (torch's RMSNorm saves x twice: one copy, read by two nodes)."""
    model = block(norm)
    x = torch.randn(32, 128)
    checkpoint_inputs = saved_tensor_bytes(lambda: checkpointed(model, x))["total"]  # what the checkpoint keeps
    enable_fp8_saved_activations(model, norm_format="e4m3")
    expected = grads(model, x)
    assert saved_tensor_bytes(lambda: checkpointed(model, x))["total"] == checkpoint_inputs
    made = []
    quantize = saved_activations.quantize_saved

    def tracked(t):
        data, scale_inv = quantize(t)
        made.append(weakref.ref(data))
        return data, scale_inv

    monkeypatch.setattr(saved_activations, "quantize_saved", tracked)
    model.zero_grad()
    out = checkpointed(model, x)
    assert made and all(ref() is None for ref in made), "an FP8 copy outlived the checkpointed forward"
    out.square().mean().backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))
    # Forward, then recomputation: the norm's input (and torch's RMSNorm's normalized x) and GELU's input.
    assert len(made) == 2 * (2 + (norm is torch.nn.RMSNorm)), "the recomputation quantizes again"


@pytest.mark.parametrize("norm", [torch.nn.LayerNorm, torch.nn.RMSNorm, LlamaRMSNorm])
def test_checkpoint_over_bf16_norms_gives_the_bits_without_it(norm):
    """Norms storing bf16 (the default) inside a non-reentrant checkpoint: a tensor the norm saves twice (its fp32
    input, for pow and mul) is stored once and unpacked by two nodes, each piece through the checkpoint once."""
    model = enable_fp8_saved_activations(block(norm))
    x = torch.randn(32, 128)
    expected = grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(grads(model, x, checkpointed), expected))


def test_checkpoint_of_a_checkpoint_and_of_the_whole_demo_gpt():
    model = enable_fp8_saved_activations(block())
    x = torch.randn(16, 128)
    expected = grads(model, x)
    nested = grads(model, x, lambda m, t: checkpoint(lambda u: checkpointed(m, u), t, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(nested, expected))


# ---------------------------------------------------------------- autocast, fp8_autocast


def small_gpt(**convert) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(d_model=128, n_layers=2, n_heads=4, context=32))
    return fp8mp.convert(model, **convert) if convert else model


def categories(module) -> str:
    name = type(module).__name__
    if name.endswith("LayerNorm"):
        return "norm"
    return "activation" if isinstance(module, torch.nn.GELU) else "other"


@pytest.mark.parametrize("fp8", [False, True])
def test_demo_gpt_under_autocast_stores_norm_and_activation_inputs_by_the_formula(fp8):
    """Under bf16 autocast the residual stream (fp32, LayerNorm runs in fp32) and the GELU input (bf16) are what
    norms and activations save: stored, the norms' cost 2 bytes an element (bf16) and the GELU's 1 + 4/128 (E4M3),
    the statistics unchanged."""
    idx = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    tokens = idx.numel()

    def run(model):
        with torch.autocast("cpu", dtype=torch.bfloat16), fp8mp.fp8_autocast(enabled=fp8):
            return model(idx, idx)[1]

    plain_model, fp8_model = small_gpt(), small_gpt(fp8_saved_activations=True)
    plain = saved_tensor_bytes(lambda: run(plain_model), plain_model, categories)
    stored = saved_tensor_bytes(lambda: run(fp8_model), fp8_model, categories)
    norms, statistics = 2 * 2 + 1, 2 * tokens * 4  # per norm: mean and rstd, fp32
    assert plain["norm"] == norms * (tokens * 128 * 4 + statistics)
    assert stored["norm"] == norms * (tokens * 128 * 2 + statistics)
    assert plain["activation"] == 2 * tokens * 512 * 2
    assert stored["activation"] == 2 * tokens * 512 * FP8_BYTES
    assert stored["other"] == plain["other"]
    loss_plain, loss_fp8 = run(plain_model), run(fp8_model)
    assert torch.equal(loss_plain, loss_fp8), "the forward is unchanged"
    loss_plain.backward()
    loss_fp8.backward()
    for (name, a), b in zip(plain_model.named_parameters(), fp8_model.parameters()):
        assert torch.isfinite(b.grad).all(), name
        # In bf16 every gradient stays within 5% (norm-wise; 0.5% to 2.2% measured). With FP8 Linears the E5M2
        # gradient casts (spacing 2^-2) round differently for any change upstream: no such bound there.
        assert fp8 or (a.grad - b.grad).norm() <= 0.05 * a.grad.norm(), name


# ---------------------------------------------------------------- torch.compile


def test_torch_compile_runs_as_without_the_hooks():
    """While torch.compile traces, the hooks do nothing: the compiled graph decides what it saves."""
    x = torch.randn(16, 128)
    plain = block()
    expected = grads(torch.compile(plain, backend="aot_eager", fullgraph=True), x)
    torch._dynamo.reset()
    hooked = enable_fp8_saved_activations(block())
    got = grads(torch.compile(hooked, backend="aot_eager", fullgraph=True), x)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    eager = grads(hooked, x)
    assert not all(torch.equal(a, b) for a, b in zip(eager, expected)), "eager runs store in FP8"


# ---------------------------------------------------------------- threads


def test_threads_run_one_model_at_once_and_leave_no_state():
    model = enable_fp8_saved_activations(block())
    inputs = [torch.randn(16, 128, generator=torch.Generator().manual_seed(i)) for i in range(4)]

    def grads_of(x):
        out = model(x).square().mean()
        return torch.autograd.grad(out, list(model.parameters()))

    expected = [grads_of(x) for x in inputs]
    results = [None] * len(inputs)
    start = threading.Barrier(len(inputs))

    def work(i):
        start.wait()
        for _ in range(3):
            results[i] = grads_of(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


class WaitingGELU(torch.nn.GELU):
    """A GELU whose forward waits until told, so that another thread can look meanwhile."""

    def __init__(self):
        super().__init__()
        self.inside, self.go = threading.Event(), threading.Event()

    def forward(self, x):
        self.inside.set()
        self.go.wait(timeout=30)
        return super().forward(x)


def test_hooks_are_per_thread():
    module = enable_fp8_saved_activations(WaitingGELU())
    assert has_fp8_saved_activations(module)
    worker = threading.Thread(target=lambda: module(torch.randn(8, 128, requires_grad=True) * 1))
    worker.start()
    assert module.inside.wait(timeout=30)
    try:
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None, "the hooks leaked to this thread"
        assert saved_activations._stack() == [], "the worker's call is on this thread's stack"
        x = torch.randn(8, 128).requires_grad_() * 1
        assert saved_tensor_bytes(lambda: torch.nn.functional.gelu(x))["total"] == x.numel() * 4
    finally:
        module.go.set()
        worker.join()
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_a_raising_forward_leaves_no_hooks_behind():
    module = enable_fp8_saved_activations(torch.nn.LayerNorm(128))
    with pytest.raises(RuntimeError):
        module(torch.randn(4, 64, requires_grad=True) * 1)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert saved_activations._stack() == []


# ---------------------------------------------------------------- which modules, convert, unconvert


class SwiGLU(torch.nn.Module):
    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up


def test_which_modules_store_in_fp8():
    chosen = [torch.nn.LayerNorm(8), torch.nn.RMSNorm(8), fp8mp.nn.LayerNorm(8), fp8mp.nn.RMSNorm(8),
              fp8mp.nn.LayerNormLinear(16, 16), LlamaRMSNorm(8), torch.nn.GELU(), torch.nn.SiLU(), torch.nn.ReLU(),
              torch.nn.Tanh(), torch.nn.GLU(), NewGELUActivation(), SwiGLU()]
    left = [torch.nn.Linear(8, 8), fp8mp.nn.Linear(16, 16), torch.nn.Softmax(-1), torch.nn.LogSoftmax(-1),
            torch.nn.MultiheadAttention(8, 2), torch.nn.Embedding(4, 8), torch.nn.Dropout(), torch.nn.Sequential()]
    assert all(is_fp8_saved_activation_module(m) for m in chosen)
    assert not any(is_fp8_saved_activation_module(m) for m in left)


def test_swiglu_module_stores_its_halves_once():
    module = enable_fp8_saved_activations(SwiGLU())
    x = torch.randn(32, 512).requires_grad_() * 1
    # silu saves gate, mul saves silu(gate) and up: three [32, 256] tensors (gate and up: strided views of x).
    assert saved_tensor_bytes(lambda: module(x))["total"] == 3 * 32 * 256 * FP8_BYTES


def hooked(model) -> list[str]:
    return [name for name, m in model.named_modules() if has_fp8_saved_activations(m)]


def test_convert_hooks_the_demo_gpt_norms_and_gelus_and_unconvert_removes_them():
    model = small_gpt()
    assert hooked(model) == []
    fp8mp.convert(model, fp8_saved_activations=True)
    names = hooked(model)
    assert names == [n for n, m in model.named_modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.GELU))]
    assert len(names) == 2 * 3 + 1
    fp8mp.convert(model, fp8_saved_activations=True)
    assert hooked(model) == names and all(len(m._forward_pre_hooks) <= 1 for m in model.modules()), "idempotent"
    twin = copy.deepcopy(model)
    fp8mp.unconvert(model)
    assert hooked(model) == [] and all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert hooked(twin) == names, "a deep copy keeps its own hooks"
    x = torch.randn(8, 128).requires_grad_() * 1
    assert saved_tensor_bytes(lambda: twin.blocks[0].norm1(x))["total"] < saved_tensor_bytes(lambda: model.blocks[0].norm1(x))["total"]


def test_convert_with_norms_and_a_filter():
    model = small_gpt(convert_norms=True, fp8_saved_activations=True,
                      module_filter=lambda name, m: not name.startswith("blocks.1"))
    names = hooked(model)
    assert names == ["blocks.0.norm1", "blocks.0.norm2", "blocks.0.mlp.act", "norm_f"]
    assert all(isinstance(model.get_submodule(n), (fp8mp.nn.LayerNorm, torch.nn.GELU)) for n in names)
    assert isinstance(model.blocks[1].norm1, torch.nn.LayerNorm), "the filter keeps blocks.1's norms as they are"
    fp8mp.unconvert(model)
    assert hooked(model) == [] and isinstance(model.norm_f, torch.nn.LayerNorm)


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="'fp8_saved_activations'"):
        fp8mp.convert(small_gpt(), fp8_saved_activations="yes")
    with pytest.raises(TypeError, match="'model'"):
        enable_fp8_saved_activations("model")
    with pytest.raises(TypeError, match="'module_filter'"):
        enable_fp8_saved_activations(torch.nn.GELU(), module_filter=3)
    with pytest.raises(ValueError, match="'norm_format'.*'fp16'"):
        enable_fp8_saved_activations(torch.nn.LayerNorm(8), norm_format="fp16")
    with pytest.raises(TypeError, match="'model'"):
        disable_fp8_saved_activations(None)
    with pytest.raises(TypeError, match="'fn'"):
        saved_tensor_bytes(3)
    with pytest.raises(ValueError, match="'model' and 'category'"):
        saved_tensor_bytes(lambda: None, model=torch.nn.GELU())
    with pytest.raises(TypeError, match="'model'"):
        saved_tensor_bytes(lambda: None, model="x", category=str)
    with pytest.raises(TypeError, match="'category'"):
        saved_tensor_bytes(lambda: None, model=torch.nn.GELU(), category=3)


# ---------------------------------------------------------------- the byte counter


def test_saved_tensor_bytes_counts_each_storage_once_and_no_parameters():
    linear = torch.nn.Linear(64, 3 * 64, bias=False)
    x = torch.randn(10, 64).requires_grad_() * 1

    def attention_like():
        q, k, v = linear(x).split(64, dim=-1)  # three views of one [10, 192] storage
        return (q * k * v).sum()

    counts = saved_tensor_bytes(attention_like, linear, lambda m: "linear" if m is linear else "outside")
    # linear saves x (its weight is a parameter); the products save q, k, v and q * k: one storage of
    # [10, 192] floats, and one [10, 64].
    assert counts == {"linear": 10 * 64 * 4, "outside": 10 * 192 * 4 + 10 * 64 * 4, "total": 10 * (64 + 192 + 64) * 4}
    assert saved_tensor_bytes(attention_like) == {"total": counts["total"]}
    assert not linear._forward_pre_hooks and not linear._forward_hooks, "the counter's module hooks are removed"


@pytest.mark.parametrize("norm_format, stored_bytes, weight_error_bound", [("e4m3", FP8_BYTES, 2.0 ** -4),
                                                                           ("bf16", 2, 2.0 ** -8)])
@pytest.mark.parametrize("recipe", [fp8mp.recipe.DelayedScaling(), fp8mp.recipe.BlockScaling()], ids=["delayed", "block"])
def test_layernorm_linear_fused_paths_store_the_norm_input(recipe, norm_format, stored_bytes, weight_error_bound):
    """fp8mp.nn.LayerNormLinear's fused paths (the norm writes FP8 for the Linear) keep the norm's input for
    backward: stored in E4M3 or bf16, only the norm's weight gradient reads it; the FP8 Linear's saved tensors stay."""
    torch.manual_seed(0)
    plain = fp8mp.nn.LayerNormLinear(256, 256)
    x = torch.randn(64, 256)

    def step(module):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            return module(x * 1)

    for _ in range(2):  # delayed scaling runs fused from its second step
        step(plain).square().sum().backward()
    hooked = enable_fp8_saved_activations(copy.deepcopy(plain), norm_format=norm_format)
    assert (saved_tensor_bytes(lambda: step(copy.deepcopy(plain)))["total"]
            - saved_tensor_bytes(lambda: step(copy.deepcopy(hooked)))["total"]) == x.numel() * (4 - stored_bytes)
    for module in (plain, hooked):
        module.zero_grad()
        step(module).square().sum().backward()
    assert torch.equal(plain.linear.weight.grad, hooked.linear.weight.grad)
    assert torch.equal(plain.norm.bias.grad, hooked.norm.bias.grad)
    weight_error = (plain.norm.weight.grad - hooked.norm.weight.grad).norm() / plain.norm.weight.grad.norm()
    assert 0 < weight_error < weight_error_bound


def test_where_saved_tensor_hooks_are_disabled_nothing_is_stored_in_fp8():
    module = enable_fp8_saved_activations(torch.nn.GELU())
    x = torch.randn(8, 128).requires_grad_() * 1
    with torch.autograd.graph.disable_saved_tensors_hooks("no hooks here"):
        out = module(x)
    assert saved_activations._stack() == []
    assert torch.equal(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(torch.nn.functional.gelu(x).sum(), x)[0])
