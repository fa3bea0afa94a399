"""examples/hf_trainer.py: one tiny run per precision goes through, reload check included."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import hf_trainer  # noqa: E402


def test_a_short_run_in_each_precision(tmp_path):
    bf16 = hf_trainer.run("gpt2", "bf16", seed=0, steps=4, out=str(tmp_path / "bf16"), eval_size=64)
    fp8 = hf_trainer.run("gpt2", "fp8", seed=0, steps=4, out=str(tmp_path / "fp8"), eval_size=64)  # asserts the reload evaluates the same
    assert 0 < fp8 < 6 and abs(fp8 - bf16) / bf16 < 0.05
    assert os.path.isfile(tmp_path / "fp8" / "final" / "model.safetensors")
