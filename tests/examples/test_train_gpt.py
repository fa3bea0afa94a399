"""examples/train_gpt.py: a tiny config trains, and its FP8 run really computes in FP8."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import fp8mp  # noqa: E402
from gpt_model import GPT, GPTConfig  # noqa: E402
from train_gpt import PRECISIONS, TrainConfig, batch_starts, load_data, train  # noqa: E402

TINY_MODEL = GPTConfig(n_layers=2, d_model=64, n_heads=2, context=32)
TINY_TRAIN = TrainConfig(steps=25, batch_size=8, lr=1e-2, warmup_steps=3, eval_every=25, eval_batches=2, corpus_bytes=20_000, monitor_every=5)


@pytest.fixture(scope="module")
def fp8_result(tmp_path_factory):
    return train(TINY_MODEL, TINY_TRAIN, PRECISIONS["fp8"], str(tmp_path_factory.mktemp("out")))


def first_and_last(losses: list[float], k: int = 5) -> tuple[float, float]:
    return sum(losses[:k]) / k, sum(losses[-k:]) / k


def test_fp8_run_learns_and_uses_fp8(fp8_result):
    first, last = first_and_last(fp8_result.train_losses)
    assert last < first - 0.5, (first, last)  # from ~ln(256) = 5.5 down
    assert fp8_result.fp8_modules == 4 * TINY_MODEL.n_layers  # qkv, attn proj, fc, mlp proj per block
    assert fp8_result.fp8_amax_nonzero
    assert len(fp8_result.monitor_summary.splitlines()) == 1 + 4 * TINY_MODEL.n_layers
    for path in fp8_result.files:
        assert os.path.getsize(path) > 0


def test_fp32_run_uses_no_fp8_and_tracks_fp8(fp8_result):
    fp32 = train(TINY_MODEL, TINY_TRAIN, PRECISIONS["fp32"])
    assert fp32.fp8_modules == 0 and not fp32.fp8_amax_nonzero and fp32.monitor_summary == ""
    first, last = first_and_last(fp32.train_losses)
    assert last < first - 0.5
    assert abs(fp8_result.final_train - fp32.final_train) / fp32.final_train < 0.05  # loose: 25 tiny steps


def test_same_seed_same_batches_and_init():
    train_data, _ = load_data(TINY_TRAIN)
    a = batch_starts(train_data, 4, 8, 32, seed=7)
    assert torch.equal(a, batch_starts(train_data, 4, 8, 32, seed=7))
    assert not torch.equal(a, batch_starts(train_data, 4, 8, 32, seed=8))
    torch.manual_seed(0)
    m1 = GPT(TINY_MODEL)
    torch.manual_seed(0)
    m2 = GPT(TINY_MODEL)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))


def test_gpt_outside_fp8_autocast_matches_torch_linear_model():
    torch.manual_seed(0)
    model = GPT(TINY_MODEL)
    idx = torch.randint(0, 256, (2, 16))
    logits, _ = model(idx)
    with fp8mp.fp8_autocast():
        fp8_logits, _ = model(idx)
    assert logits.shape == (2, 16, 256)
    assert not torch.equal(logits, fp8_logits)  # FP8 changes the numbers ...
    assert torch.allclose(logits, fp8_logits, atol=0.05)  # ... a little


def test_bad_configs():
    with pytest.raises(ValueError, match="'d_model'"):
        GPTConfig(d_model=100, n_heads=3)
    with pytest.raises(ValueError, match="'steps'"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="'idx'"):
        GPT(TINY_MODEL)(torch.zeros(1, 33, dtype=torch.long))
