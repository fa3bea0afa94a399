"""examples/train_moe.py: both runs of the tiny Qwen3-MoE learn, FP8 runs its experts in FP8, the table is well formed."""
from __future__ import annotations

import math
import os
import re
import sys

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import fp8mp.integrations.hf_moe as hf_moe  # noqa: E402
import train_moe  # noqa: E402
from train_gpt import PRECISIONS, TrainConfig, train  # noqa: E402

TINY_TRAIN = TrainConfig(steps=12, batch_size=8, lr=3e-3, warmup_steps=2, eval_every=12, eval_batches=2,
                         corpus_bytes=20_000, monitor_every=4)


def test_fp8_and_bf16_runs_learn_and_fp8_runs_the_experts_in_fp8(monkeypatch):
    grouped_calls = []

    def counting(meta, x2d, *args, **kwargs):
        grouped_calls.append(x2d.shape)
        return meta_grouped_linear(meta, x2d, *args, **kwargs)

    meta_grouped_linear = hf_moe.meta_grouped_linear
    monkeypatch.setattr(hf_moe, "meta_grouped_linear", counting)
    config = train_moe.MoEConfig()
    runs = {}
    for name in ("fp8", "bf16"):
        grouped_calls.clear()
        runs[name] = train(config, TINY_TRAIN, PRECISIONS[name], build_model=train_moe.build_moe)
        if name == "fp8":  # gate_up and down of every layer in each forward (training steps, validation batches)
            forwards = TINY_TRAIN.steps + TINY_TRAIN.eval_batches
            rows = TINY_TRAIN.batch_size * config.context * config.top_k
            assert grouped_calls == [torch.Size([rows, config.d_model]), torch.Size([rows, config.expert_width])] \
                * config.n_layers * forwards
        else:  # transformers' grouped_mm experts
            assert grouped_calls == []
    for name, run in runs.items():
        losses = run.train_losses + run.val_losses
        assert all(math.isfinite(v) for v in losses), (name, losses)
        first, last = sum(run.train_losses[:3]) / 3, sum(run.train_losses[-3:]) / 3
        assert last < first - 0.3, (name, first, last)  # from ~ln(256) = 5.5 down
    assert runs["fp8"].fp8_amax_nonzero  # the attention projections ran in FP8
    # Same seed, same batches: the first step's losses (before any update) agree to FP8's error.
    assert abs(runs["fp8"].train_losses[0] - runs["bf16"].train_losses[0]) < 0.02 * runs["bf16"].train_losses[0]


def test_same_seed_gives_both_runs_the_same_weights():
    torch.manual_seed(3)
    fp8 = train_moe.build_moe(train_moe.MoEConfig(), PRECISIONS["fp8"])
    torch.manual_seed(3)
    bf16 = train_moe.build_moe(train_moe.MoEConfig(), PRECISIONS["bf16"])
    assert fp8.lm.config._experts_implementation == hf_moe.EXPERTS_IMPLEMENTATION
    assert bf16.lm.config._experts_implementation != hf_moe.EXPERTS_IMPLEMENTATION
    weights = {k: v for k, v in fp8.state_dict().items() if "fp8_meta" not in k and "_extra_state" not in k}
    assert weights.keys() == bf16.state_dict().keys()
    assert all(torch.equal(v, bf16.state_dict()[k]) for k, v in weights.items())


def test_script_prints_a_well_formed_seed_table(capsys):
    train_moe.main(["--seeds", "2", "--steps", "4", "--batch-size", "4", "--eval-batches", "2"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert rows[0] == "| seed | FP8 | BF16 | FP8 vs BF16 |" and rows[1] == "|---|---|---|---|"
    number, gap = r"\d+\.\d{4}", r"[+-]\d+\.\d\d%"
    for seed, row in enumerate(rows[2:4]):
        assert re.fullmatch(rf"\| {seed} \| {number} \| {number} \| {gap} \|", row), row
    assert re.fullmatch(rf"\| mean of 2 \| {number} \| {number} \| {gap} \|", rows[4]), rows[4]
    assert len(rows) == 5
    cells = [[float(c) for c in row.strip("| ").split(" | ")[1:3]] for row in rows[2:]]
    assert all(math.isfinite(v) and 0 < v < 6 for row in cells for v in row)
    assert cells[2] == pytest.approx([(cells[0][i] + cells[1][i]) / 2 for i in range(2)], abs=1e-4)
    assert re.search(r"FP8 mean final val loss vs BF16: [+-]\d+\.\d{3}%, (within|NOT within) the 0\.5% goal", out)
