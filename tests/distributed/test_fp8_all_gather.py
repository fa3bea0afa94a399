"""FP8 all-gather under FSDP2 (`fp8mp.convert(model, fp8_all_gather=True)`): 2 processes on CPU (gloo,
loopback), one torchrun launch of tests/distributed/fp8_all_gather_worker.py.

* The same training with and without FP8 all-gather, DelayedScaling and CurrentScaling (with and without
  precompute_fp8_weight_scales): losses, every parameter shard and every FP8 scaling buffer bit-identical.
* The FP8 weight the GEMMs take is the cast of the unsharded weight: its codes equal torch's
  float8_e4m3fn cast of (weight * scale) saturated to +-448, with the scale the run without all-gather
  used for that weight in that step.
* The bytes FSDP2 all-gathers a step (counted at the collectives): the E4M3 weights' one byte an element
  instead of two, so at most 0.55x on this tiny model (whose norms and biases still gather in bf16).
* torch.distributed.checkpoint: the state_dict holds plain tensors; a save / load round trip resumes bit-exact.
* What is refused names what is wrong: no fp8_group or one that is not the shard group under delayed
  scaling, a fine-grained recipe.
"""
from __future__ import annotations


import pytest
import torch
import torch.distributed as dist

from torchrun_launch import REPO, run_ranks

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")

TIMEOUT_S = 240
WORLD = 2
FP8_MAX = 448.0


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    return run_ranks(REPO / "tests" / "distributed" / "fp8_all_gather_worker.py", WORLD,
                     tmp_path_factory.mktemp("fp8_all_gather"), TIMEOUT_S)


@pytest.mark.parametrize("recipe,with_all_gather", [("delayed", True), ("current", True),
                                                    ("current", "no_precompute")])
def test_losses_weights_and_scales_are_those_of_the_run_without_fp8_all_gather(ranks, recipe, with_all_gather):
    for rank in ranks:
        want, got = rank["runs"][(recipe, False)], rank["runs"][(recipe, with_all_gather)]
        linears = {name for name in got["weight_types"] if name != "embed.weight"}
        assert len(linears) == 5 and {got["weight_types"][name] for name in linears} == {"Fp8AllGatherWeight"}
        assert set(want["weight_types"].values()) == {"Tensor"} and got["weight_types"]["embed.weight"] == "Tensor"
        assert got["losses"] == want["losses"]
        assert len(set(got["losses"])) == len(got["losses"])  # it trains: every step's loss differs
        assert got["params"].keys() == want["params"].keys()
        for name, value in want["params"].items():
            assert torch.equal(got["params"][name], value), name
        assert got["meta"].keys() == want["meta"].keys() and len(want["meta"]) == 5 * 5
        for name, value in want["meta"].items():
            assert torch.equal(got["meta"][name], value), name
    # and training moved the weights away from their start
    assert not torch.equal(ranks[0]["gathered"][(recipe, False)][0]["whole"],
                           ranks[0]["gathered"][(recipe, False)][-1]["whole"])


def e4m3_reference(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """torch's own float8_e4m3fn cast (round to nearest even) of weight * scale in fp32, saturated as fp8mp's."""
    return (weight.float() * scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_the_gemm_takes_the_cast_of_the_unsharded_weight(ranks, recipe):
    for rank in ranks:
        with_ag, without = rank["gathered"][(recipe, True)], rank["gathered"][(recipe, False)]
        for step, (got, want) in enumerate(zip(with_ag, without)):
            kind, codes, scale_inv = got["seen"]
            scale = want["seen"]  # the scale the layer's own cast of the unsharded weight used
            assert kind == "Fp8GatheredWeight"
            assert codes.shape == got["whole"].shape
            assert torch.equal(codes.view(torch.uint8), e4m3_reference(got["whole"], scale).view(torch.uint8)), step
            assert torch.equal(scale_inv, scale.reciprocal()), step
            assert torch.equal(got["whole"], want["whole"])


def test_about_half_the_bytes_are_all_gathered(ranks):
    """Each rank counts the bytes of the all-gather outputs: the Linear weights in E4M3 (1 byte an element) and
    the rest (embedding, norms, biases) in bf16; reduce-scatters unchanged (bf16 gradients)."""
    for rank in ranks:
        for recipe in ("delayed", "current"):
            want, got = rank["runs"][(recipe, False)]["bytes"], rank["runs"][(recipe, True)]["bytes"]
            for (gathered, scattered), (gathered_bf16, scattered_bf16) in zip(got, want):
                assert scattered == scattered_bf16 > 0
                assert 0.5 * gathered_bf16 < gathered <= 0.55 * gathered_bf16, (gathered, gathered_bf16)


def test_what_cannot_gather_in_fp8_is_refused_by_name(ranks):
    for rank in ranks:
        errors = rank["errors"]
        assert "FP8 all-gather under delayed scaling needs fp8_autocast(fp8_group=...)" in errors["no_group"]
        assert "got fp8_group=None" in errors["no_group"] and ".weight" in errors["no_group"]
        assert "is not the data-parallel group the weight is sharded over (ranks [0, 1])" in errors["other_group"]
        assert "BlockScaling, which scales the weight per block" in errors["block_recipe"]
        assert errors["convert_block_recipe"].startswith("argument 'fp8_all_gather'")


def test_dcp_round_trip_holds_plain_tensors_and_resumes_bit_exact(ranks):
    for rank in ranks:
        got = rank["dcp"]
        assert got["held"] == ["Tensor"]  # the checkpoint holds the weights' values, not the subclass
        assert got["type"] == "Fp8AllGatherWeight"  # and loading keeps the parameter what it was
        assert got["losses"][0] == got["losses"][1] and got["differ"] == []
