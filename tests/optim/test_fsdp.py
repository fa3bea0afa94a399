"""fp8mp.optim.AdamW and Lion under FSDP2 (fully_shard per block and the root): 2 processes on CPU (gloo,
loopback), one torchrun launch of tests/optim/fsdp_worker.py, compared here with one process.

* Given the same global gradients, the sharded steps write the bits of the unsharded ones: every parameter,
  FP8 state and block scale of every shard (the uneven embedding's included) equals the rows of the whole
  tensor stepped in one process: the stochastic rounding is keyed by the global element index and the FP8
  blocks are the whole tensor's.
* Training on a global batch split between the ranks (FP8 casts with fp8_group, gradients summed and clipped
  with torch.nn.utils.clip_grad_norm_ over the mesh): losses of one process on the global batch within 2e-3
  relative with bf16 parameters, 1e-3 with fp32 parameters. Here the gradients differ in their last bits
  (the batch's sum is two GEMMs and a reduction instead of one GEMM, in an order the CPU's GEMM path picks);
  the next FP8 casts (E4M3: 2^-4 relative steps) and E4M3 states then round some elements the other way, and
  AdamW's step m / sqrt(v) amplifies that: measured at step 8 with fp32 parameters and states, 5.7e-6 on an
  AMX Xeon and 4.9e-4 on an AVX2 EPYC; with E4M3 states 2.1e-4. That the sharded step itself adds nothing is
  the bit-for-bit test above.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fp8mp
import fsdp_worker
from torchrun_launch import launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")

TIMEOUT_S = 180
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("fsdp")
    launch("fsdp_worker.py", WORLD, [str(out_dir)], TIMEOUT_S)
    return [torch.load(out_dir / f"rank-{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The references run like the workers, on one thread (torch's global setting, restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_shards_are_rows_of(shards: dict, whole: dict, model) -> None:
    """Every shard's parameter and state bytes are the bytes of its rows of the unsharded tensor; FP8 scales
    those of its blocks; step and seed equal."""
    shapes = {name: p.shape for name, p in model.named_parameters()}
    for name, (row_start, param, states) in shards.items():
        _, whole_param, whole_states = whole[name]
        shape = shapes[name]
        row_numel = shape.numel() // shape[0]
        numel = param.numel() * shape.numel() // whole_param.numel()  # the shard's elements
        first = row_start * row_numel
        size = whole_param.numel() // shape.numel()
        assert torch.equal(param, whole_param[first * size:(first + numel) * size]), name
        assert states.keys() == whole_states.keys()
        for key, value in states.items():
            want = whole_states[key]
            if key in ("step", "seed"):
                assert torch.equal(value, want), (name, key)
            elif key.endswith("_scale"):  # float32 scales, one per 128 elements; the DTensor pads the last group
                blocks = -(-numel // 128)
                assert torch.equal(value[:blocks * 4], want[first // 128 * 4:(first // 128 + blocks) * 4]), (name, key)
                assert not value[blocks * 4:].any()
            else:
                item = want.numel() // shape.numel()
                assert torch.equal(value, want[first * item:(first + numel) * item]), (name, key)


@pytest.mark.parametrize("optimizer", ["adamw", "lion"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sharded_steps_write_the_unsharded_bits(ranks, dtype, optimizer):
    whole = fsdp_worker.step_given_grads(dtype, optimizer, sharded=False)
    model = fsdp_worker.make_model(dtype, sharded=False)
    for rank in ranks:
        assert_shards_are_rows_of(rank[f"bits_{dtype}_{optimizer}"], whole, model)
    embed = [rank[f"bits_{dtype}_{optimizer}"]["embed.weight"][0] for rank in ranks]
    assert embed == [0, 65]  # uneven: 65 and 64 of the 129 rows


@pytest.mark.parametrize("dtype,state_dtype,rtol", [(torch.bfloat16, torch.float8_e4m3fn, 2e-3),
                                                    (torch.float32, torch.float32, 1e-3),
                                                    (torch.float32, torch.float8_e4m3fn, 1e-3)])
def test_training_matches_one_process_on_the_global_batch(ranks, dtype, state_dtype, rtol):
    key = "train_fp32_states" if state_dtype == torch.float32 else f"train_{dtype}"
    want = fsdp_worker.train(dtype, sharded=False, state_dtype=state_dtype)
    for rank in ranks:
        got = rank[key]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=rtol, atol=0)
        # clip_grad_norm_ over the mesh: the first step's norm (before any update) is the whole gradient's, to
        # within its dtype's rounding (bf16: 2^-8 relative), and above MAX_NORM, so the clipping acted.
        torch.testing.assert_close(got["norms"][0], want["norms"][0], rtol=1e-5 if dtype == torch.float32 else 2**-7,
                                   atol=0)
        assert want["norms"][0] > fsdp_worker.MAX_NORM
        assert got["state_types"] == sorted(f"{k}:DTensor" for k in ("exp_avg", "exp_avg_sq") + (
            ("exp_avg_scale", "exp_avg_sq_scale") if state_dtype == torch.float8_e4m3fn else ())) \
            + ["seed:Tensor", "step:Tensor"]


def test_fp8_saved_activations_are_stored_under_fully_shard(ranks):
    """fp8_saved_activations=True (the LayerNorms' inputs in E4M3) under fully_shard: each rank stores as many
    saved tensors in FP8 as one process does (the losses above are those of these runs)."""
    want = fsdp_worker.train(torch.bfloat16, sharded=False)["fp8_saved_activations"]
    assert want == fsdp_worker.STEPS * 2  # the input of one LayerNorm a block, two blocks, each step
    for rank in ranks:
        assert rank[f"train_{torch.bfloat16}"]["fp8_saved_activations"] == want


def test_moe_experts_sharded_along_the_experts_step_the_unsharded_bits(ranks):
    """A GroupedLinear's 3-D weight [experts, out, in] under fully_shard (Shard(0): whole experts a rank,
    uneven) stepped by AdamW with E4M3 states: every shard's bits are its experts' of one process's step."""
    whole = fsdp_worker.experts_step(sharded=False)
    experts = fp8mp.nn.GroupedLinear(3, 128, 64)
    for rank in ranks:
        assert_shards_are_rows_of(rank["experts"], whole, experts)
    assert [rank["experts"]["weight"][0] for rank in ranks] == [0, 2]


def test_memory_lean_bytes_per_rank(ranks):
    """bf16 parameters and gradients and E4M3 states: each rank holds its shard's 6.06 bytes a parameter
    (2 + 2 + 2 x 1 + 2 x 4 / 128), at most 6.2 / N of the whole model's parameters (the uneven embedding's
    extra row on rank 0 included)."""
    for rank in ranks:
        got = rank[f"train_{torch.bfloat16}"]
        held = got["param_bytes"] + got["grad_bytes"] + got["state_bytes"]
        assert held <= 6.2 * got["numel"] / WORLD
        assert got["state_bytes"] <= 2.07 * got["numel"] / WORLD


def test_a_nonfinite_gradient_on_one_rank_skips_the_step_on_every_rank(ranks):
    for rank in ranks:
        assert rank["nonfinite"] == {"steps": [1, 1, 2], "changed": [True, False, True]}


def test_unaligned_fp8_blocks_are_refused_and_bf16_states_step_them(ranks):
    _, whole = fsdp_worker.unaligned_step(sharded=False)
    norm = torch.nn.LayerNorm(64)
    for rank in ranks:
        error, shards = rank["unaligned"]
        assert error.startswith("fp8mp.optim: parameter 0 of param group 0 (global shape [64]) is sharded in "
                                "chunks of 32 rows of 1 elements")
        assert "'state_dtype': torch.bfloat16" in error
        assert_shards_are_rows_of(shards, whole, norm)
    assert [rank["unaligned"][1]["weight"][0] for rank in ranks] == [0, 32]


def test_an_empty_shard_steps_nothing_and_the_other_writes_the_whole(ranks):
    whole = fsdp_worker.empty_shard_step(sharded=False)
    layer = torch.nn.Linear(256, 1, bias=False)
    for rank in ranks:
        assert_shards_are_rows_of(rank["empty_shard"], whole, layer)
    assert [rank["empty_shard"]["weight"][1].numel() for rank in ranks] == [512, 0]


def test_frozen_fp8_weights_are_sharded_and_gathered_as_codes(ranks):
    """fully_shard keeps a frozen Fp8FrozenWeight what it is: each rank holds its rows of the E4M3 codes (one byte
    an element) and the scale, FSDP2 all-gathers the codes, and fp8mp Linear's GEMMs take the gathered codes as
    they are, as one process's do. Losses within 1e-4 of one process's (the trainable head's gradients are sums
    over the ranks' halves of the batch)."""
    want = fsdp_worker.frozen_fp8(sharded=False)
    assert want["held"] == "Fp8FrozenWeight" and want["held_bytes"] == fsdp_worker.HIDDEN * fsdp_worker.DIM + 4
    for rank in ranks:
        got = rank["frozen"]
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=1e-4, atol=0)
        assert (got["held"], got["held_dtype"]) == ("Fp8FrozenWeight", torch.bfloat16)
        assert got["held_bytes"] == fsdp_worker.HIDDEN // WORLD * fsdp_worker.DIM + 4
        # each step gathers the base's two weights as codes (1 byte an element) and its biases in bf16, in forward
        # and again for backward (FSDP2's backward prefetch), and the trainable head (the root's) in bf16, once
        dim, hidden = fsdp_worker.DIM, fsdp_worker.HIDDEN
        base = 2 * hidden * dim * 1 + (hidden + dim) * 2
        assert got["gathered"] == [2 * base + (dim * dim + dim) * 2] * 4


def test_dcp_round_trip_resumes_bit_exact(ranks):
    """get_state_dict -> torch.distributed.checkpoint.save / load -> set_state_dict: the restored optimizer's
    next step writes the bits of the original's (sharded DTensor states, FP8 codes and scales included)."""
    for rank in ranks:
        original, restored = rank["dcp"]["original"], rank["dcp"]["restored"]
        assert original.keys() == restored.keys()
        for name, (start, param, states) in original.items():
            assert restored[name][0] == start and torch.equal(restored[name][1], param), name
            assert states.keys() == restored[name][2].keys()
            for key, value in states.items():
                assert torch.equal(restored[name][2][key], value), (name, key)
