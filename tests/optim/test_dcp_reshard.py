"""fp8mp's whole training state through torch.distributed.checkpoint, saved on 4 ranks and loaded on 4, 2 and 1
(fully_shard on a 1-rank mesh): one torchrun launch per world size of tests/optim/dcp_reshard_worker.py (gloo, CPU).

* Same world size: the resumed run's next steps are the uninterrupted run's, bit for bit (losses, every
  parameter and optimizer state shard, FP8 scaling buffers, the LossScaler).
* 2 and 1 ranks: the checkpoint's scaler and FP8 scaling state arrive as saved, and training goes on: the
  losses are finite, lower than before the checkpoint, and within RESHARD_RTOL of what the 4 ranks computed for the same steps
  (bf16 parameters: the gradients' sums run in another order, and a bf16 rounding of a weight moves the loss
  about 1e-3, as in tests/optim/test_fsdp.py).
* A world size whose shards the FP8 states' 128-element blocks cannot follow is refused, naming the
  parameter; so is a plain (unsharded) model, whose FP8 scales have another shape than the sharded layout, and
  a save whose FP8 scaling buffers differ between the ranks (fp8_autocast without fp8_group).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dcp_reshard_worker
from torchrun_launch import launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")

TIMEOUT_S = 120
RESHARD_RTOL = 2e-3
WORLDS = (4, 2, 1)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[int, list[dict]]:
    out_dir, ckpt_dir = tmp_path_factory.mktemp("dcp-out"), tmp_path_factory.mktemp("dcp-ckpt")
    found = {}
    for world in WORLDS:  # in this order: the 4 ranks write the checkpoints the others read
        launch("dcp_reshard_worker.py", world, [str(out_dir), str(ckpt_dir)], TIMEOUT_S)
        found[world] = [torch.load(out_dir / f"world-{world}-rank-{r}.pt", weights_only=False) for r in range(world)]
    return found


def test_same_world_size_resumes_bit_exact(worlds):
    for rank in worlds[4]:
        uninterrupted, resumed = rank["uninterrupted"], rank["resumed"]
        assert resumed["losses"] == uninterrupted["losses"][dcp_reshard_worker.SAVE_AT:]
        assert resumed["scaler"] == uninterrupted["scaler"]
        assert resumed["fp8_state"].keys() == uninterrupted["fp8_state"].keys()
        for key, value in uninterrupted["fp8_state"].items():
            assert torch.equal(resumed["fp8_state"][key], value), key
        assert resumed["shards"].keys() == uninterrupted["shards"].keys()
        for name, (start, param, states) in uninterrupted["shards"].items():
            assert resumed["shards"][name][0] == start and torch.equal(resumed["shards"][name][1], param), name
            assert states.keys() == resumed["shards"][name][2].keys()
            for key, value in states.items():
                assert torch.equal(resumed["shards"][name][2][key], value), (name, key)


@pytest.mark.parametrize("world", [2, 1])
def test_fewer_ranks_load_the_checkpoint_and_train_on(worlds, world):
    saved = worlds[4][0]
    want = saved["uninterrupted"]["losses"]
    for rank in worlds[world]:
        assert rank["loaded_scaler"] == saved["saved_scaler"]
        losses = torch.tensor(rank["resumed"]["losses"])
        assert losses.isfinite().all()
        # each step draws a new random batch: the loss falls on average, below the steps before the checkpoint
        assert losses.mean() < torch.tensor(want[:dcp_reshard_worker.SAVE_AT]).mean() - 0.05
        torch.testing.assert_close(losses, torch.tensor(want[dcp_reshard_worker.SAVE_AT:]), rtol=RESHARD_RTOL,
                                   atol=0)
        states = rank["resumed"]["shards"]["blocks.0.fc1.weight"][2]
        assert int(states["step"].view(torch.int64)) == dcp_reshard_worker.SAVE_AT + dcp_reshard_worker.AFTER


def test_fp8_scaling_state_is_the_same_on_every_rank_of_every_world_size(worlds):
    """Whatever the world size, the ranks train on from the checkpoint with equal scales and amax histories (the
    newest raw amax, `amax`, is each rank's own until the next fp8_autocast entry reduces it)."""
    for world, ranks in worlds.items():
        first = ranks[0]["resumed"]["fp8_state"]
        assert any(key.endswith("amax_history") for key in first)
        for rank in ranks[1:]:
            for key, value in first.items():
                if not key.endswith(".amax"):
                    assert torch.equal(rank["resumed"]["fp8_state"][key], value), (world, key)


def test_a_world_size_the_fp8_blocks_cannot_follow_is_refused_naming_the_parameter(worlds):
    for rank in worlds[2]:
        assert rank["odd_error"].startswith("ValueError: fp8mp.optim: parameter 0 of param group 0 (global shape "
                                            "[5, 64]) is sharded in chunks of 3 rows of 64 elements")
    assert worlds[1][0]["odd_error"] is None  # one rank holds every row: its blocks are the whole tensor's


def test_fp8_scaling_state_that_differs_between_ranks_is_not_saved(worlds):
    """fp8_autocast without fp8_group: each rank's scales are its own, and a checkpoint would keep rank 0's."""
    for rank in worlds[4]:
        assert rank["unreduced_error"].startswith("ValueError: fp8mp: the FP8 scaling buffer fp8_meta.amax differs "
                                                  "between ranks")
        assert "fp8_autocast(fp8_group=...)" in rank["unreduced_error"]


def test_a_plain_model_is_refused_naming_the_state(worlds):
    error = worlds[1][0]["plain_error"]
    assert error is not None and "weight.exp_avg_scale" in error and "Size mismatch" in error
