"""The FP8 scaling state in every checkpoint format users save, and across converted/unconverted models.

Each format must round-trip the whole state bit-exactly, and training resumed from it must
give the losses the uninterrupted run gives (CPU: the kernels are deterministic).
"""
from __future__ import annotations

import logging

import pytest
import torch

import fp8mp
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

FP8_STATE = ("amax", "amax_history", "scale", "scale_inv", "initialized")


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 16))


def train(model, steps: int, seed: int, recipe=None) -> list[float]:
    """SGD without momentum: the model's state_dict is the whole training state."""
    gen = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 16, generator=gen)
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def save_torch(model, path):
    torch.save(model.state_dict(), path / "ckpt.pt")


def load_torch(model, path):
    model.load_state_dict(torch.load(path / "ckpt.pt", weights_only=True), strict=True)


def save_safetensors(model, path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file(model.state_dict(), path / "model.safetensors")


def load_safetensors(model, path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    model.load_state_dict(safetensors_torch.load_file(path / "model.safetensors"), strict=True)


def save_dcp(model, path):
    import torch.distributed.checkpoint as dcp
    dcp.save(model.state_dict(), checkpoint_id=str(path / "dcp"), no_dist=True)


def load_dcp(model, path):
    import torch.distributed.checkpoint as dcp
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=True)  # loads into the model's shapes, strictly
    model.load_state_dict(state, strict=True)


FORMATS = {"torch_save_weights_only": (save_torch, load_torch), "safetensors": (save_safetensors, load_safetensors),
           "dcp": (save_dcp, load_dcp)}
RECIPES = {"default_delayed": None, "delayed_history_16": DelayedScaling(amax_history_len=16),
           "current": CurrentScaling()}


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_checkpoint_round_trips_bit_exactly_and_training_resumes(tmp_path, fmt, recipe_name):
    save, load = FORMATS[fmt]
    recipe = RECIPES[recipe_name]
    # A recipe pinned by convert sizes the history at once, so DCP (which loads into existing shapes) fits.
    model = fp8mp.convert(build(0), recipe=recipe)
    train(model, 4, seed=1)
    save(model, tmp_path)
    continued = train(model, 4, seed=2)

    fresh = fp8mp.convert(build(7), recipe=recipe)  # other weights: everything must come from the checkpoint
    load(fresh, tmp_path)
    assert all(m.is_initialized() for m in fresh.modules() if isinstance(m, fp8mp.scaling.Fp8Meta))
    resumed = train(fresh, 4, seed=2)
    assert resumed == continued
    assert_same_state(fresh, model)


def test_state_is_tensors_only_and_keeps_its_dtypes():
    model = fp8mp.convert(build(0))
    train(model, 2, seed=1)
    state = model.bfloat16().state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    meta = {k: v.dtype for k, v in state.items() if ".fp8_meta." in k}
    assert len(meta) == 3 * len(FP8_STATE)
    assert all(dtype == (torch.bool if k.endswith("initialized") else torch.float32) for k, dtype in meta.items())


def test_converted_checkpoint_loads_into_unconverted_model_with_one_log_line(caplog):
    model = fp8mp.convert(build(0))
    train(model, 2, seed=1)
    plain = fp8mp.unconvert(build(5))
    assert not any(".fp8_meta." in k for k in plain.state_dict())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        plain.load_state_dict(model.state_dict(), strict=True)  # torch alone: the FP8 state has no place
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        result = fp8mp.load_state_dict(plain, model.state_dict(), strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    lines = [r for r in caplog.records if r.name == "fp8mp"]
    assert len(lines) == 1 and "ignoring the FP8 scaling state of 3 modules" in lines[0].getMessage()
    for key, value in plain.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_unconverted_checkpoint_loads_into_converted_model_with_fresh_fp8_state(caplog):
    plain = fp8mp.unconvert(build(5))
    model = fp8mp.convert(build(0))
    train(model, 2, seed=1)  # scaled and initialized: loading must reset that
    model.load_state_dict(plain.state_dict(), strict=True)
    metas = [m for m in model.modules() if isinstance(m, fp8mp.scaling.Fp8Meta)]
    assert len(metas) == 3
    for meta in metas:
        assert not meta.is_initialized() and not bool(meta.initialized)
        assert torch.equal(meta.scale, torch.ones(3)) and not meta.amax_history.any() and not meta.amax.any()
    with caplog.at_level(logging.INFO, logger="fp8mp"):
        fp8mp.load_state_dict(model, plain.state_dict(), strict=True)
    assert [r.getMessage() for r in caplog.records if r.name == "fp8mp"] == [
        "fp8mp.load_state_dict: 3 fp8mp modules start with fresh FP8 scaling state (the checkpoint has none for them)"]
    # ... and the fresh model then trains as a model converted from scratch with those weights
    assert train(model, 3, seed=4) == train(fp8mp.convert(build(5)), 3, seed=4)


def test_checkpoint_of_fp8mp_0_1_0_with_extra_state_dict_still_loads():
    model = fp8mp.convert(build(0), recipe=DelayedScaling(amax_history_len=8))
    train(model, 3, seed=1)
    legacy = {}  # what fp8mp 0.1.0 saved: the state as a dict in "<module>.fp8_meta._extra_state"
    for key, value in model.state_dict().items():
        owner, _, name = key.rpartition(".")
        if owner.endswith("fp8_meta"):
            entry = legacy.setdefault(owner + "._extra_state", {})
            entry[name] = bool(value) if name == "initialized" else value.clone()
        else:
            legacy[key] = value
    fresh = fp8mp.convert(build(3))
    fresh.load_state_dict(legacy, strict=True)
    assert_same_state(fresh, model)


def test_load_state_dict_bad_arguments():
    with pytest.raises(TypeError, match="'model'"):
        fp8mp.load_state_dict({}, {})
    with pytest.raises(TypeError, match="'state_dict'"):
        fp8mp.load_state_dict(build(0), [1, 2])
