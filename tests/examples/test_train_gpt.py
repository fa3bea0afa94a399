"""examples/train_gpt.py: a tiny config trains, and its FP8 run really computes in FP8."""
from __future__ import annotations

import dataclasses
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
    with pytest.raises(ValueError, match="'bf16_gemm'"):
        TrainConfig(bf16_gemm="bf16")
    with pytest.raises(ValueError, match="'bf16_gemm' 'fp32' is a CPU path"):
        TrainConfig(device="cuda", bf16_gemm="fp32")


def test_the_bf16_run_says_which_kernel_its_matmuls_ran_on_and_both_give_bf16s_numbers(fp8_result):
    from fp8mp.nn.bf16_via_fp32 import cpu_has_bf16_matmul_units
    from gpt_report import report_table
    from train_gpt import RunResult

    short = dataclasses.replace(TINY_TRAIN, steps=3, eval_every=3)
    runs = {gemm: train(TINY_MODEL, dataclasses.replace(short, bf16_gemm=gemm), PRECISIONS["bf16"])
            for gemm in ("fp32", "torch", "auto")}
    assert runs["fp32"].matmul_kernel == "fp32 GEMM of bf16 operands"
    assert runs["torch"].matmul_kernel == "torch bf16 matmul"
    assert runs["auto"].matmul_kernel == runs["torch" if cpu_has_bf16_matmul_units() else "fp32"].matmul_kernel
    assert fp8_result.matmul_kernel is None and fp8_result.label == "FP8"  # the FP8 run keeps torch's own kernels
    # The same products, fp32 sums and roundings to bf16 (only the order of the additions differs): the first
    # step's loss agrees to bf16's precision, far closer than BF16 and FP32 or FP8 are (~1e-2 here).
    first = [runs[gemm].train_losses[0] for gemm in ("fp32", "torch")]
    assert abs(first[0] - first[1]) < 2e-3 * first[1], first

    def run(name: str, val: float, kernel=None) -> RunResult:
        return RunResult(name, [3.0, val], [0, 1], [3.0, val], [0.01, 0.01], 100.0, matmul_kernel=kernel)

    for kernel in ("fp32 GEMM of bf16 operands", "torch bf16 matmul"):
        lines = report_table([run("FP8", 2.0), run("BF16", 2.0, kernel), run("FP32", 2.0)]).splitlines()
        assert lines[2].startswith(f"BF16 ({kernel})  ")
        # an emulated BF16's step time is said not to be torch's bf16 path's
        said = [line for line in lines if line.startswith("BF16 (fp32 GEMM of bf16 operands): ")]
        assert len(said) == (kernel != "torch bf16 matmul") and all("--bf16-gemm torch" in line for line in said)


def test_torchao_peer_run_swaps_in_float8linear_with_the_same_init_and_learns():
    from torchao.float8.float8_linear import Float8Linear
    from train_gpt import PEERS, with_torchao_float8

    torch.manual_seed(0)
    reference = GPT(TINY_MODEL)
    torch.manual_seed(0)
    peer = with_torchao_float8(GPT(TINY_MODEL), "rowwise")
    linears = [m for m in peer.modules() if isinstance(m, Float8Linear)]
    assert len(linears) == 4 * TINY_MODEL.n_layers and not any(isinstance(m, fp8mp.nn.Linear) for m in peer.modules())
    assert linears[0].config.emulate and linears[0].config.cast_config_input.scaling_granularity.value == "axiswise"
    peer_params = dict(peer.named_parameters())
    assert peer_params.keys() == dict(reference.named_parameters()).keys()
    assert all(torch.equal(p, peer_params[name]) for name, p in reference.named_parameters())
    with pytest.raises(ValueError, match="no torchao Float8Linear recipe matches --recipe 'mxfp8'"):
        with_torchao_float8(GPT(TINY_MODEL), "mxfp8")
    result = train(TINY_MODEL, TINY_TRAIN, PEERS["torchao"])
    first, last = first_and_last(result.train_losses)
    assert last < first - 0.5 and result.name == "torchao FP8"


def test_seed_table_reports_fp8_against_the_peer_per_seed_and_the_mean_against_bf16():
    from gpt_report import seed_table

    table = seed_table([{"FP8": 2.0, "torchao FP8": 2.02, "BF16": 1.9}, {"FP8": 2.2, "torchao FP8": 2.2, "BF16": 2.3}],
                       "torchao FP8")
    lines = table.splitlines()
    assert lines[0] == "| seed | FP8 | torchao FP8 | BF16 | FP8 vs torchao FP8 | FP8 vs BF16 |"
    assert lines[2] == "| 0 | 2.0000 | 2.0200 | 1.9000 | -0.99% | +5.26% |"
    assert lines[4] == "| mean of 2 | 2.1000 | 2.1100 | 2.1000 | -0.47% | +0.00% |"


def test_report_table_states_the_goal_per_run_and_that_one_seed_says_little():
    from gpt_report import report_table
    from train_gpt import RunResult

    def run(name: str, val: float) -> RunResult:
        return RunResult(name, [3.0, val], [0, 1], [3.0, val], [0.01, 0.01], 100.0)

    lines = report_table([run("FP8", 2.0), run("BF16", 1.96), run("FP32", 2.0)]).splitlines()
    assert "FP8 final val loss vs BF16: +2.041%, NOT within the 0.5% goal" in lines
    assert "FP8 final val loss vs FP32: +0.000%, within the 0.5% goal" in lines
    # The single-seed verdicts come with what they are worth and the command that compares over seeds.
    assert lines[-1].startswith("These gaps are one seed's")
    assert "python examples/train_gpt.py --peer torchao --seeds 5" in lines[-1]


def test_memory_lean_run_trains_bf16_parameters_with_fp8_states_and_tracks_fp8(fp8_result):
    from train_gpt import OPTIMIZERS

    lean = PRECISIONS["fp8-lean"]
    assert (lean.param_dtype, lean.autocast_dtype, lean.fp8) == (torch.bfloat16, None, True)
    optimizer = OPTIMIZERS[lean.optimizer]([torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))], TINY_TRAIN)
    assert isinstance(optimizer, fp8mp.optim.AdamW) and optimizer.state_dtype == torch.float8_e4m3fn
    result = train(TINY_MODEL, TINY_TRAIN, lean)
    first, last = first_and_last(result.train_losses)
    assert last < first - 0.5, (first, last)
    assert result.name == "FP8 memory-lean" and result.fp8_modules == 4 * TINY_MODEL.n_layers and result.fp8_amax_nonzero
    assert abs(result.final_train - fp8_result.final_train) / fp8_result.final_train < 0.05  # loose: 25 tiny steps


def test_the_lean_peer_is_torchao_adamwfp8_on_bf16_parameters_with_stochastic_rounding_and_a_tensor_lr():
    pytest.importorskip("torchao")
    from torchao.optim import AdamWFp8
    from train_gpt import LEAN_PEERS, OPTIMIZERS, set_lr

    peer = LEAN_PEERS["torchao"]
    assert (peer.peer, peer.param_dtype, peer.autocast_dtype) == ("torchao", torch.bfloat16, None)
    optimizer = OPTIMIZERS[peer.optimizer]([torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))], TINY_TRAIN)
    assert isinstance(optimizer, AdamWFp8) and optimizer.bf16_stochastic_round
    lr = optimizer.param_groups[0]["lr"]
    set_lr(optimizer, 0.25)
    assert optimizer.param_groups[0]["lr"] is lr and lr.item() == 0.25  # filled in place, as torchao requires


def test_seed_table_adds_the_lean_run_against_its_peer_per_seed_and_bf16_on_the_mean():
    from gpt_report import seed_table

    per_seed = [{"FP8": 2.0, "torchao FP8": 2.02, "FP8 memory-lean": 2.01, "torchao FP8 memory-lean": 2.0, "BF16": 2.0},
                {"FP8": 2.2, "torchao FP8": 2.2, "FP8 memory-lean": 2.23, "torchao FP8 memory-lean": 2.2, "BF16": 2.2}]
    lines = seed_table(per_seed, "torchao FP8", "torchao FP8 memory-lean").splitlines()
    assert lines[0] == ("| seed | FP8 | torchao FP8 | FP8 memory-lean | torchao FP8 memory-lean | BF16 | FP8 vs torchao FP8 "
                        "| FP8 vs BF16 | FP8 memory-lean vs torchao FP8 memory-lean | FP8 memory-lean vs BF16 |")
    assert lines[2] == "| 0 | 2.0000 | 2.0200 | 2.0100 | 2.0000 | 2.0000 | -0.99% | +0.00% | +0.50% | +0.50% |"
    assert lines[4] == "| mean of 2 | 2.1000 | 2.1100 | 2.1200 | 2.1000 | 2.1000 | -0.47% | +0.00% | +0.95% | +0.95% |"
    assert lines[5] == "FP8 mean final val loss vs BF16: +0.000%, within the 0.5% goal"
    assert lines[6] == "FP8 memory-lean mean final val loss vs BF16: +0.952%, NOT within the 0.5% goal"
    no_peer = seed_table([{"FP8": 2.0, "FP8 memory-lean": 2.0, "BF16": 2.0}], None).splitlines()
    assert no_peer[0] == "| seed | FP8 | FP8 memory-lean | BF16 | FP8 vs BF16 | FP8 memory-lean vs BF16 |"
