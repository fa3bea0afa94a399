"""benchmarks/bench_train_memory.py: its byte counts against formulas (element sizes, AdamW's two states, FP8
states with one float32 scale per 128 elements), its --quick CLI, and a row that says why a run did not run."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import fp8mp  # noqa: E402
import bench_train_memory as bench  # noqa: E402

RUNS = {run.name: run for run in bench.RUNS}


def tiny_gpt_figures() -> tuple[int, int, list[int]]:
    """(parameter count, buffer bytes, numel of each parameter tensor) of the --quick demo GPT, built here."""
    model, _ = bench.build_model("gpt", bench.QUICK_MODELS["gpt"])
    numels = [p.numel() for p in model.parameters()]
    return sum(numels), sum(b.numel() * b.element_size() for b in model.buffers()), numels


def test_fp32_and_bf16_amp_count_four_bytes_a_parameter_and_two_fp32_adamw_states():
    numel, buffer_bytes, numels = tiny_gpt_figures()
    for name in ("FP32", "BF16 AMP"):
        figures = bench.measure("gpt", RUNS[name], quick=True, device="cpu")
        b = figures["bytes"]
        assert figures["params_numel"] == numel
        assert b["params"] == 4 * numel + buffer_bytes, name  # the tied LM head counted once
        assert b["grads"] == 4 * numel, name
        # exp_avg and exp_avg_sq in fp32, and torch's 0-dim float32 step per parameter tensor
        assert b["optimizer"] == 2 * 4 * numel + 4 * len(numels), name
        assert b["saved"] > 0
    fp32, amp = (bench.measure("gpt", RUNS[n], quick=True, device="cpu")["bytes"]["saved"] for n in ("FP32", "BF16 AMP"))
    assert amp < fp32  # autocast saves bf16 copies where FP32 saves fp32 activations


def test_memory_lean_counts_bf16_parameters_and_fp8_states_with_a_scale_per_128():
    numel, buffer_bytes, numels = tiny_gpt_figures()
    figures = bench.measure("gpt", RUNS["fp8mp memory-lean"], quick=True, device="cpu")
    b = figures["bytes"]
    assert figures["param_dtypes"] == ["torch.bfloat16"]
    assert b["params"] == 2 * numel + buffer_bytes  # fp8mp's scaling state stays fp32
    assert b["grads"] == 2 * numel
    # two E4M3 states (1 byte) with a float32 scale per 128 elements each, plus int64 step and seed per tensor
    assert b["optimizer"] == sum(2 * (n + 4 * math.ceil(n / 128)) + 16 for n in numels)


def test_saved_for_backward_of_a_linear_layer():
    """fp32 nn.Linear saves its input (the weight is a parameter, not counted again); fp8mp's FP8 Linear saves the
    input's E4M3 copy and three 1-element scales (the weight's inverse scale and scale, the input's inverse scale):
    backward casts the weight again rather than holding an FP8 copy of it."""
    x = torch.randn(32, 64, requires_grad=True)
    linear = torch.nn.Linear(64, 48)
    counter = bench.StorageCounter()
    for p in linear.parameters():
        counter.add("params", p)
    _, saved = bench.count_saved(lambda: linear(x))
    for t in saved:
        if not counter.holds(t):
            counter.add("saved", t)
    assert counter.bytes["saved"] == 32 * 64 * 4

    fp8_linear = fp8mp.nn.Linear(64, 48)
    counter = bench.StorageCounter()
    for t in [*fp8_linear.parameters(), *fp8_linear.buffers()]:
        counter.add("params", t)
    with fp8mp.fp8_autocast():
        _, saved = bench.count_saved(lambda: fp8_linear(x))
    for t in saved:
        if not counter.holds(t):
            counter.add("saved", t)
    assert counter.bytes["saved"] == 32 * 64 + 3 * 4


def test_a_storage_is_counted_once_and_a_freed_category_is_forgotten():
    counter = bench.StorageCounter()
    w = torch.zeros(10, 10)
    counter.add("params", w)
    counter.add("params", w.t())  # a view of the same storage
    counter.add("grads", w[0])
    assert counter.bytes == {"params": 400, "grads": 0, "optimizer": 0, "saved": 0}
    saved = torch.zeros(5)
    counter.add("saved", saved)
    counter.forget("saved")
    assert not counter.holds(saved) and counter.bytes["saved"] == 20


def test_a_tensor_subclass_is_counted_by_its_inner_tensors():
    pytest.importorskip("torchao")
    from torchao.optim.subclass_fp8 import OptimStateFp8

    state = OptimStateFp8.zeros((4, 256), 128, "cpu")
    counter = bench.StorageCounter()
    counter.add("optimizer", state)
    assert counter.bytes["optimizer"] == 4 * 256 + 4 * (4 * 256 // 128)  # E4M3 codes + float32 scale per 128


def test_a_run_that_cannot_run_gets_a_row_saying_why(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    bench.child(["gpt", "torchao Float8 + AdamWFp8", "--quick"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    row = json.loads(line.removeprefix("RESULT "))
    assert row["run"] == "torchao Float8 + AdamWFp8" and "torchao is not installed" in row["unavailable"]
    bench.add_totals([row])
    assert "not run: torchao is not installed" in bench.table([row], "cpu")


def test_quick_cli_prints_the_table_with_the_goals_and_records_json(tmp_path, capsys):
    path = tmp_path / "figures.json"
    bench.main(["--quick", "--models", "gpt", "--runs", "BF16 AMP,fp8mp memory-lean", "--rounds", "1",
                "--json", str(path)])
    out = capsys.readouterr().out
    assert "| BF16 AMP |" in out and "| fp8mp memory-lean |" in out
    assert "fp8mp memory-lean: " in out and "bytes of training state per parameter" in out
    assert "torch / fp8mp" in out
    figures = json.loads(path.read_text())["train_memory"]
    amp, lean = figures["memory"]["gpt"]
    assert amp["total_vs_bf16_amp"] == 1.0
    assert lean["total_bytes"] == sum(lean["bytes"].values())
    assert 0 < lean["total_vs_bf16_amp"] < 1
    assert lean["peak_rss_mib"] >= lean["rss_at_start_mib"] > 0  # measured in its own process
    step = figures["optimizer_step"][0]
    assert step["params_numel"] == amp["params_numel"] and step["peer_over_fp8mp"] > 0


def test_chunked_loss_and_step_in_backward_rows_count_what_they_drop():
    """The chunked loss drops at least the fp32 log-softmax of every token from what is saved for backward; the
    step in backward holds at most the largest gradient (the tied embedding's, bf16) at once."""
    spec = bench.QUICK_MODELS["llama"]
    lean = bench.measure("llama", RUNS["fp8mp memory-lean"], quick=True, device="cpu")["bytes"]
    chunked = bench.measure("llama", RUNS["fp8mp memory-lean + chunked loss"], quick=True, device="cpu")["bytes"]
    both = bench.measure("llama", RUNS["fp8mp memory-lean + step in backward + chunked loss"], quick=True,
                         device="cpu")["bytes"]
    tokens, vocab, hidden = spec.batch * spec.seq, spec.config["vocab_size"], spec.config["hidden_size"]
    # per token the chunked loss keeps a float32 log-sum-exp, an int64 target and a bool flag
    assert lean["saved"] - chunked["saved"] >= 4 * tokens * vocab - (4 + 8 + 1) * tokens - 64
    assert chunked["grads"] == lean["grads"] and both["saved"] == chunked["saved"]
    assert both["grads"] == 2 * vocab * hidden < lean["grads"]
    gpt = bench.QUICK_MODELS["gpt"]
    gpt_lean, gpt_chunked = (bench.measure("gpt", RUNS[name], quick=True, device="cpu")["bytes"]["saved"]
                             for name in ("fp8mp memory-lean", "fp8mp memory-lean + chunked loss"))
    assert gpt_lean - gpt_chunked >= 4 * gpt.batch * gpt.seq * 256 - (4 + 8 + 1) * gpt.batch * gpt.seq - 64


def test_every_lever_row_saves_the_mlp_multiply_and_attention_in_fp8():
    """Against the chunked-loss + step-in-backward row: per layer the MLP keeps gate and up in FP8 instead of the
    activation's FP8 input and act(gate) and up in bf16, and attention keeps q, k, v in FP8 instead of q, k, v
    and its output in bf16 (and the fp32 log-sum-exps)."""
    for key in ("llama", "gpt"):
        spec = bench.QUICK_MODELS[key]
        before = bench.measure(key, RUNS["fp8mp memory-lean + step in backward + chunked loss"], quick=True,
                               device="cpu")["bytes"]
        every = bench.measure(key, RUNS[bench.EVERY_LEVER], quick=True, device="cpu")["bytes"]
        tokens = spec.batch * spec.seq
        layers = spec.config.get("num_hidden_layers", spec.config.get("n_layers"))
        hidden = spec.config.get("hidden_size", spec.config.get("d_model"))
        fp8 = 1 + 4 / 128
        attention = tokens * hidden * (4 * 2 - 3 * fp8)  # q, k, v, out in bf16 -> q, k, v in FP8
        mlp = tokens * spec.config["intermediate_size"] * (fp8 + 2 + 2 - 2 * fp8) if key == "llama" else 0
        assert before["saved"] - every["saved"] >= layers * (attention + mlp) - 64, key
        assert every["grads"] == before["grads"] and every["optimizer"] == before["optimizer"]
