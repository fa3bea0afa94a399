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


def test_cli_prints_a_table_per_model_and_records_json(tmp_path, capsys):
    path = tmp_path / "figures.json"
    threads = torch.get_num_threads()
    parity.main(["--steps", "2", "--seeds", "1", "--threads", "1", "--json", str(path)])
    assert torch.get_num_threads() == threads  # put back
    out = capsys.readouterr().out
    for model in ("gpt", "llama"):
        assert f"### final validation loss, {model}, 1 seeds" in out
        assert f"{model}: every lever's mean final loss" in out
    figures = json.loads(path.read_text())["loss_parity_memory_lean"]
    assert len(figures["rows"]) == 2 * len(parity.RUNS)
    assert all(len(row["train_losses"]) == 2 and row["final_val"] > 0 for row in figures["rows"])
