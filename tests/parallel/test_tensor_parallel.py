"""fp8mp Linear under torch's tensor parallel, on CPU with gloo: one torchrun launch of tests/parallel/tp_worker.py on
2 processes (TP 2: column-/row-wise, and sequence parallel with the LayerNorms, its input all-gathered in FP8) and one on 4 (FSDP2 2 x TP 2),
compared here with one process on the global batch (fp32 parameters, the same optimizers).

* The FP8 amaxes are max-reduced over fp8_autocast(fp8_group=WORLD), so every rank holds the same FP8 state,
  bit for bit, and that state is one process's: after the first step the weight scales (the whole weights' amaxes
  from the shards') and the first layer's input scale are one process's bits; later ones differ where the
  activations and gradients differ in their last bits (partial sums added in another order).
* Losses within 1e-4 relative of one process's over STEPS steps.
* Every step runs the FP8 GEMMs: three fp8_gemm calls per Linear (forward, input and weight gradients).
* Under sequence parallel, Fp8ColwiseParallel all-gathers the input as FP8 codes with the same results, bit for
  bit, as gathering it in its own dtype.
"""
from __future__ import annotations

import pathlib

import pytest
import torch
import torch.distributed as dist

import fp8mp
import tp_worker
from torchrun_launch import one_thread, run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")

TIMEOUT_S = 180
WORKER = pathlib.Path(__file__).with_name("tp_worker.py")
LINEARS = 4  # two blocks of fc1, fc2
LAYOUTS = {"tp": 2, "sp": 2, "sp_hp_gather": 2, "fsdp_tp": 4}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, list[dict]]:
    return {n: run_ranks(WORKER, n, tmp_path_factory.mktemp(f"tp{n}"), TIMEOUT_S) for n in (2, 4)}


@pytest.fixture(scope="module")
def one_process() -> dict:
    with one_thread():
        return tp_worker.train(None, None)


@pytest.fixture(scope="module")
def one_process_current() -> dict:
    with one_thread():
        return tp_worker.train(None, None, fp8mp.recipe.CurrentScaling())


def test_current_scaling_matches_one_process(ranks, one_process_current):
    """CurrentScaling reduces each amax over fp8_group before its cast: the scales every rank casts with are one
    process's, the losses too."""
    want = one_process_current
    results = [r["train_sp_current"] for r in ranks[2]]
    for got in results:
        assert same_bits(got["last"], results[0]["last"])
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-4, atol=0)
        for key in want["first"]:
            if key.endswith(".scale"):
                torch.testing.assert_close(got["first"][key], want["first"][key], rtol=1e-4, atol=0, msg=key)
        assert got["ops"]["fp8mp.fp8_gemm"] == 3 * LINEARS


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_rank_holds_the_same_fp8_state(ranks, layout):
    results = [r[f"train_{layout}"] for r in ranks[LAYOUTS[layout]]]
    for got in results[1:]:
        assert same_bits(got["first"], results[0]["first"]) and same_bits(got["last"], results[0]["last"])
    assert any(k.endswith("amax_history") for k in results[0]["last"])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_first_step_scales_are_one_process_bits(ranks, one_process, layout):
    got, want = ranks[LAYOUTS[layout]][0][f"train_{layout}"]["first"], one_process["first"]
    assert got.keys() == want.keys()
    for key in want:
        if key.endswith(".scale"):  # columns: input, weight, output gradient
            name = key.split(".fp8_meta")[0]
            assert torch.equal(got[key][1], want[key][1]), key  # the weight's: shards' amaxes reduced
            if name == "blocks.0.fc1":
                assert torch.equal(got[key][0], want[key][0]), key  # its input: the same values
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=0)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_losses_match_one_process_on_the_global_batch(ranks, one_process, layout):
    want = torch.tensor(one_process["losses"])
    assert want[-1] < want[0]  # it trains
    for rank in ranks[LAYOUTS[layout]]:
        got = rank[f"train_{layout}"]
        torch.testing.assert_close(torch.tensor(got["losses"]), want, rtol=1e-4, atol=0)
        for key, value in one_process["last"].items():  # scales and amax histories stay close
            torch.testing.assert_close(got["last"][key], value, rtol=1e-3, atol=0, msg=key)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_fp8_gemms_run(ranks, one_process, layout):
    assert one_process["ops"]["fp8mp.fp8_gemm"] == 3 * LINEARS
    for rank in ranks[LAYOUTS[layout]]:
        assert rank[f"train_{layout}"]["ops"]["fp8mp.fp8_gemm"] == 3 * LINEARS


def test_sequence_parallel_gathers_the_input_in_fp8(ranks):
    """Fp8ColwiseParallel(input_layouts=Shard(1)) all-gathers fc1's input as FP8 codes cast from each shard with the
    shared scale: the same losses and FP8 state, bit for bit, as gathering it in fp32 first, a quarter of its
    bytes (the step's other all-gathers, fc2's output gradients, are the same in both)."""
    local_numel = tp_worker.GLOBAL_BATCH * tp_worker.SEQ // tp_worker.TP * tp_worker.DIM
    for rank in ranks[2]:
        fp8, fp32 = rank["train_sp"], rank["train_sp_hp_gather"]
        assert fp8["losses"] == fp32["losses"]
        assert same_bits(fp8["first"], fp32["first"]) and same_bits(fp8["last"], fp32["last"])
        assert fp32["ops"]["gathered_bytes"] - fp8["ops"]["gathered_bytes"] == 2 * local_numel * (4 - 1)
        # fc1's input cast without its transpose (the gathered codes are transposed as bytes)
        assert fp8["ops"]["fp8mp.cast_to_fp8"] == fp32["ops"]["fp8mp.cast_to_fp8"] + 2


def test_errors(ranks):
    for rank, result in enumerate(ranks[2]):
        errors = result["errors"]
        # a torch Linear under Fp8ColwiseParallel(input_layouts=Shard(1)): its input gathered by the style, as torch's
        difference, placements = errors["plain_linear_sequence_parallel"]
        assert difference < 1e-6 and [str(p) for p in placements] == ["(Replicate(),)"]
        assert errors["torch_colwise"].startswith("TypeError: fp8mp: this module's FP8 scaling buffers (fp8_meta) are "
                                                  "DTensors: torch's ColwiseParallel"), errors["torch_colwise"]
        assert "fp8mp.nn.tensor_parallel.Fp8ColwiseParallel / Fp8RowwiseParallel" in errors["torch_colwise"]
        assert errors["no_group"].startswith("ValueError: fp8mp.nn.Linear: the weight is sharded by tensor parallel "
                                             "over ranks [0, 1]"), errors["no_group"]
        assert "pass fp8_autocast(fp8_group=...) a ProcessGroup that contains them" in errors["no_group"]
        assert errors["own_rank_only"].startswith(
            f"ValueError: fp8mp.nn.Linear: argument 'fp8_group' of fp8_autocast holds ranks [{rank}], but the weight "
            f"is sharded by tensor parallel over ranks [0, 1]: ranks [{1 - rank}]"), errors["own_rank_only"]
        assert errors["fine_grained"].startswith("NotImplementedError: fp8mp.nn.Linear: RowwiseScaling under tensor "
                                                 "parallel is not supported"), errors["fine_grained"]
        assert errors["adamw_rowwise"].startswith(
            "ValueError: fp8mp.optim: parameter 0 of param group 0 (global shape [64, 128]) has placements "
            "(Shard(dim=1),);"), errors["adamw_rowwise"]
        assert "step the others (row-wise Shard(1) weights, FSDP2 x tensor parallel) with a torch.optim" \
            in errors["adamw_rowwise"]
    for result in ranks[4]:  # FSDP2 over a column-wise weight: dim 0 sharded twice
        assert result["adamw_fsdp_tp"].startswith(
            "ValueError: fp8mp.optim: parameter 0 of param group 0 (global shape [128, 64]) has placements "
            "(_StridedShard(dim=0, sf=2), Shard(dim=0));"), result["adamw_fsdp_tp"]
