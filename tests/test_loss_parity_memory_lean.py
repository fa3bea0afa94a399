"""benchmarks/loss_parity_memory_lean.py: its CLI on two steps of one seed (the table, the goal line, the JSON), and
that the every-lever run trains the models it says (FP8-saved attention, chunked loss, step in backward)."""
from __future__ import annotations

import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import loss_parity_memory_lean as parity  # noqa: E402


def test_every_lever_run_wires_each_lever():
    every = next(run for run in parity.RUNS if run.every_lever)
    gpt, _, _, gpt_stepper = parity.prepared("gpt", every, seed=0)
    assert gpt.config.fp8_saved_attention and gpt.config.chunked_loss and gpt_stepper is not None
    llama, _, _, llama_stepper = parity.prepared("llama", every, seed=0)
    import fp8mp.integrations.hf as fp8_hf

    assert fp8_hf.uses_fp8_saved_activations(llama) and fp8_hf.uses_chunked_loss(llama) and llama_stepper is not None
    assert {p.dtype for p in llama.parameters()} == {torch.bfloat16}


def test_ablation_runs_take_the_recipe_apart():
    fp8_only, lean_optimizer, delayed, e4m3_norms = parity.ABLATIONS
    model, _, optimizer, stepper = parity.prepared("llama", fp8_only, seed=0)
    import fp8mp
    import fp8mp.memory.saved_activations as saved

    assert stepper is None and type(optimizer) is torch.optim.AdamW
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    linears = [m for m in model.modules() if isinstance(m, fp8mp.nn.Linear)]
    assert linears and model.get_output_embeddings() not in linears
    assert not any(map(saved.has_fp8_saved_activations, model.modules()))
    model, _, optimizer, _ = parity.prepared("llama", lean_optimizer, seed=0)
    assert isinstance(optimizer, fp8mp.optim.AdamW) and optimizer.state_dtype == torch.float8_e4m3fn
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(map(saved.has_fp8_saved_activations, model.modules()))
    lean, _, _, _ = parity.prepared("llama", parity.RUNS[1], seed=0)
    assert any(map(saved.has_fp8_saved_activations, lean.modules()))
    # What a norm stores (what it hands to an enclosing saved-tensor hook): bf16 in memory-lean, E4M3 in the variant
    for run, stored in ((parity.RUNS[1], torch.bfloat16), (e4m3_norms, torch.float8_e4m3fn)):
        model, _, _, _ = parity.prepared("llama", run, seed=0)
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.dtype) or t, lambda t: t):
            model.model.norm(torch.randn(2, 8, 128, dtype=torch.bfloat16, requires_grad=True) * 1)
        assert stored in seen and (torch.float8_e4m3fn in seen) == (stored == torch.float8_e4m3fn)
    assert all(run.recipe == "rowwise" for run in parity.RUNS if run.lean) and delayed.lean
    assert isinstance(parity.RECIPES["rowwise"], fp8mp.recipe.RowwiseScaling)
    assert isinstance(parity.RECIPES[delayed.recipe], fp8mp.recipe.DelayedScaling)


def test_cli_prints_a_table_per_model_and_records_json(tmp_path, capsys):
    path = tmp_path / "figures.json"
    threads = torch.get_num_threads()
    parity.main(["--steps", "2", "--seeds", "1", "--threads", "1", "--ablations", "--json", str(path)])
    assert torch.get_num_threads() == threads  # put back
    out = capsys.readouterr().out
    for model in ("gpt", "llama"):
        assert f"### final validation loss, {model}, 1 seeds" in out
        assert f"{model}: every lever's mean final loss" in out
    figures = json.loads(path.read_text())["loss_parity_memory_lean"]
    assert len(figures["rows"]) == 2 * len(parity.RUNS + parity.ABLATIONS)
    for model in ("gpt", "llama"):
        assert f"### the memory-lean recipe taken apart, {model}" in out
        assert set(figures["summary"][model]["ablations_vs_bf16"]) == {run.name for run in parity.RUNS + parity.ABLATIONS}
    assert all(len(row["train_losses"]) == 2 and row["final_val"] > 0 for row in figures["rows"])
