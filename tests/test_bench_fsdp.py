"""benchmarks/bench_fsdp.py --quick on 2 gloo ranks: its byte counts against formulas from the model's parameter
shapes (FSDP2 gathers each decoder layer in forward and again in backward, the root once; bf16: 2 bytes an
element; FP8 all-gather: 1 byte an element of each converted Linear weight), and its table."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_fsdp as bench  # noqa: E402


def quick_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(**bench.QUICK_LLAMA))


def gathered_bytes(fp8_linear_weights: bool) -> int:
    model = quick_llama()

    def layer_bytes(module) -> int:
        linear = sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))
        other = sum(p.numel() for p in module.parameters()) - linear
        return linear * (1 if fp8_linear_weights else 2) + other * 2

    layers = sum(layer_bytes(layer) for layer in model.model.layers)
    root = 2 * sum(p.numel() for name, p in model.named_parameters() if ".layers." not in name)  # the head kept bf16
    return 2 * layers + root


def test_quick_run_counts_the_bytes_of_its_formulas(tmp_path):
    out = tmp_path / "figures.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_fsdp.py"), "--quick", "--ranks",
                           "2", "--steps", "1", "--warmup", "0", "--json", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(out.read_text())["fsdp_2_ranks"]
    bf16, lean, fp8 = (figures[run] for run in bench.RUNS[:3])
    assert bf16["all_gathered"] == lean["all_gathered"] == gathered_bytes(False)
    assert fp8["all_gathered"] == gathered_bytes(True)
    assert bf16["reduce_scattered"] == lean["reduce_scattered"] == fp8["reduce_scattered"] == bf16["params"] * 2
    # bf16 parameters, gradients and AdamW's two bf16 states: 8 bytes a parameter, and a float32 step per tensor;
    # memory-lean about 6.06
    assert bf16["state"] == 8 * bf16["params"] / 2 + 4 * len(list(quick_llama().parameters()))
    assert 6.0 * lean["params"] / 2 < lean["state"] == fp8["state"] < 6.2 * lean["params"] / 2
    assert "| fp8mp memory-lean + FP8 all-gather |" in proc.stdout and "of bf16 FSDP2's all-gathered bytes" in proc.stdout
    torchao = figures[bench.RUNS[3]]
    assert "unavailable" in torchao or torchao["all_gathered"] == gathered_bytes(True)
