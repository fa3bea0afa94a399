"""fp8mp.integrations.accelerate with the real accelerate (one CPU process, mixed_precision="bf16").

A two-Linear MLP trains through accelerate's own loop (prepare, autocast, backward, clip_grad_norm_, optimizer step):
its Linear GEMMs run in FP8 (the fp8mp ops counted), the loss falls, a batch holding an Inf (saturated by the E4M3
cast, so the loss stays finite) is skipped by fp8mp's loss scaler (`optimizer.step_was_skipped`), and
`accelerator.save_state` / `load_state` into fresh objects resume bit-exact: FP8 scaling buffers, loss scaler state,
fp8mp.optim.AdamW's FP8 states, weights and the losses after the checkpoint.
"""
from __future__ import annotations

import pytest
import torch

import framework_helpers as fh
import fp8mp

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState  # noqa: E402

import fp8mp.integrations.accelerate as fp8_accelerate  # noqa: E402

EPOCH = 6
INF_STEP = 2


@pytest.fixture
def fresh_accelerator():
    """accelerate keeps one AcceleratorState per process: each Accelerator of a test starts from a clean one."""
    def make(**kwargs):
        AcceleratorState._reset_state(reset_partial_state=True)
        return accelerate.Accelerator(cpu=True, **kwargs)

    yield make
    AcceleratorState._reset_state(reset_partial_state=True)


def setup(make, seed):
    accelerator = make(mixed_precision="bf16")
    data = fh.regression_data(EPOCH)
    data.tensors[0][INF_STEP * fh.BATCH, 0] = float("inf")
    net = fh.mlp(seed)
    optimizer = fp8mp.optim.AdamW(net.parameters(), lr=2e-2)
    loader = torch.utils.data.DataLoader(data, batch_size=fh.BATCH)
    model, optimizer, loader = fp8_accelerate.prepare(accelerator, net, optimizer, loader)
    return accelerator, model, optimizer, loader


def train_epoch(accelerator, model, optimizer, loader):
    losses, skipped = [], []
    for x, y in loader:
        with fp8_accelerate.autocast(accelerator):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        skipped.append(optimizer.step_was_skipped)
    return losses, skipped


def test_accelerate_trains_in_fp8_skips_the_inf_step_and_save_state_resumes_bit_exact(tmp_path, fresh_accelerator):
    accelerator, model, optimizer, loader = setup(fresh_accelerator, 0)
    assert isinstance(model[0], fp8mp.nn.Linear) and isinstance(accelerator.scaler, fp8mp.LossScaler)
    with fh.Fp8OpCount() as ops:
        first, skipped = train_epoch(accelerator, model, optimizer, loader)
    assert ops.counts["fp8mp.fp8_gemm"] == EPOCH * fh.fp8_gemms_per_step(2)
    assert skipped == [step == INF_STEP for step in range(EPOCH)] and accelerator.scaler.num_fp8_skipped_steps == 1
    accelerator.save_state(str(tmp_path / "state"))
    second, _ = train_epoch(accelerator, model, optimizer, loader)
    assert sum(second) < 0.7 * sum(first)  # the same batches, an epoch later

    accelerator_2, model_2, optimizer_2, loader_2 = setup(fresh_accelerator, 5)
    accelerator_2.load_state(str(tmp_path / "state"))
    assert accelerator_2.scaler.state_dict()["num_steps"] == EPOCH
    assert fh.same_bits(train_epoch(accelerator_2, model_2, optimizer_2, loader_2)[0], second)
    assert fh.same_bits(model_2.state_dict(), model.state_dict())  # weights and FP8 scaling buffers
    assert any(".fp8_meta.amax_history" in k for k in model.state_dict())
    assert fh.same_bits(optimizer_2.state_dict(), optimizer.state_dict())
    assert fh.same_bits(accelerator_2.scaler.state_dict(), accelerator.scaler.state_dict())


def test_autocast_enters_bf16_and_fp8_autocast(fresh_accelerator):
    accelerator = fresh_accelerator(mixed_precision="bf16")
    with fp8_accelerate.autocast(accelerator, recipe=fp8mp.recipe.CurrentScaling()):
        assert fp8mp.is_fp8_enabled() and isinstance(fp8mp.get_fp8_recipe(), fp8mp.recipe.CurrentScaling)
        assert fp8mp.get_fp8_group() is None  # one process: nothing to reduce over
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not fp8mp.is_fp8_enabled()


def test_accelerates_own_fp8_is_refused_with_the_argument_named(fresh_accelerator):
    accelerator = fresh_accelerator(mixed_precision="fp8")
    with pytest.raises(ValueError, match="argument 'accelerator'.*mixed_precision='fp8'"):
        fp8_accelerate.prepare(accelerator, fh.mlp())
    with pytest.raises(TypeError, match="argument 'accelerator'"):
        fp8_accelerate.prepare(object(), fh.mlp())
