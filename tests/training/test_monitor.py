"""fp8mp.monitor and fp8mp.cast_stats: counts against inputs built to have known counts."""
from __future__ import annotations

import csv
import math

import pytest
import torch

import fp8mp
from fp8mp.training.cast_stats import CastCounts, count_cast_losses
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling

# Half the smallest subnormal: |x * scale| below it rounds to zero.
HALF_MIN_SUBNORMAL = {"e4m3": 2.0**-10, "e5m2": 2.0**-17}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def planted(n: int, n_big: int, n_tiny: int, n_zero: int, amax: float, big: float, tiny: float, seed: int = 0):
    """n values: n_big of magnitude `big`, n_tiny of `tiny`, n_zero zeros, the rest in [amax/8, amax] (one == amax)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=gen) * (7 / 8) + 1 / 8) * amax
    x[0] = amax
    perm = torch.randperm(n - 1, generator=gen) + 1
    x[perm[:n_big]] = big
    x[perm[n_big : n_big + n_tiny]] = tiny
    x[perm[n_big + n_tiny : n_big + n_tiny + n_zero]] = 0.0
    signs = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    return x * signs


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cast_counts_of_planted_values(fmt, dtype):
    scale = 4.0
    n_big, n_tiny = 7, 11
    big = 2 * FP8_MAX[fmt] / scale  # |x * scale| = 2 fp8_max: clipped
    tiny = HALF_MIN_SUBNORMAL[fmt] / scale / 8  # |x * scale| = 1/16 of the smallest subnormal: flushed
    x = planted(1000, n_big, n_tiny, n_zero=13, amax=FP8_MAX[fmt] / scale, big=big, tiny=tiny).to(dtype)
    counts = count_cast_losses(x.reshape(10, 100), torch.tensor([scale]), fmt)
    assert counts == CastCounts(saturated=n_big, flushed=n_tiny, total=1000)
    assert counts.saturated_fraction == n_big / 1000 and counts.flushed_fraction == n_tiny / 1000


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_cast_counts_match_torch_float8_on_random_data(fmt):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(50_000, generator=gen) * torch.exp(torch.randn(50_000, generator=gen) * 6)
    scale = torch.tensor([2.0**-3])
    counts = count_cast_losses(x, scale, fmt)
    scaled = x * scale
    torch_cast = scaled.clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(fp8mp.ops.format.FP8_DTYPES[fmt]).float()
    assert counts.saturated == int((scaled.abs() > FP8_MAX[fmt]).sum()) > 0
    assert counts.flushed == int(((torch_cast == 0) & (x != 0)).sum()) > 0


def test_value_exactly_at_fp8_max_is_not_saturated():
    x = torch.tensor([448.0, -448.0, 449.0, 1.0])
    assert count_cast_losses(x, torch.ones(1), "e4m3") == CastCounts(saturated=1, flushed=0, total=4)


def test_cast_counts_bad_arguments():
    with pytest.raises(ValueError, match="'scale'"):
        count_cast_losses(torch.ones(4), torch.ones(2), "e4m3")
    with pytest.raises(ValueError, match="'fmt'"):
        count_cast_losses(torch.ones(4), torch.ones(1), "e3m4")


def fp8_step(layer, x, grad, recipe):
    with fp8mp.fp8_autocast(fp8_recipe=recipe):
        out = layer(x)
    out.backward(grad)


def test_delayed_scaling_fractions_amaxes_and_scales():
    """Step 1 casts with step 0's scale, so values above step 0's amax saturate: k of them, planted."""
    torch.manual_seed(0)
    layer = fp8mp.nn.Linear(100, 50)
    monitor = fp8mp.monitor.attach(layer)
    recipe = DelayedScaling(amax_history_len=4)
    amax_x, amax_g = 4.0, 1e-3
    x0 = planted(2000, 0, 0, 0, amax=amax_x, big=0, tiny=0, seed=1).reshape(20, 100)
    g0 = planted(1000, 0, 0, 0, amax=amax_g, big=0, tiny=0, seed=2).reshape(20, 50)
    fp8_step(layer, x0, g0, recipe)
    (row0,) = monitor.record_step()
    assert row0.step == 0 and row0.saturated_input == 0 and row0.saturated_grad == 0

    x1 = planted(2000, 9, 5, 3, amax=amax_x, big=2 * amax_x, tiny=1e-7, seed=3).reshape(20, 100)
    g1 = planted(1000, 4, 6, 0, amax=amax_g, big=3 * amax_g, tiny=1e-14, seed=4).reshape(20, 50)
    fp8_step(layer, x1, g1, recipe)
    (row1,) = monitor.record_step()
    assert (row1.step, row1.layer) == (1, "<model>")
    assert row1.saturated_input == 9 / 2000 and row1.flushed_input == 5 / 2000
    assert row1.saturated_grad == 4 / 1000 and row1.flushed_grad == 6 / 1000
    assert row1.amax_input == 2 * amax_x and row1.amax_grad == pytest.approx(3 * amax_g)
    assert row1.amax_weight == layer.weight.detach().abs().max().item()
    assert row1.scale_input == 448.0 / amax_x
    assert row1.scale_grad == pytest.approx(57344.0 / amax_g)
    assert monitor.records == [row0, row1]


def test_current_scaling_grad_counts_use_the_grads_own_scale():
    """Under current scaling the grad scale is set in backward; step 0's scale would flush most of step 1's grad."""
    torch.manual_seed(0)
    layer = fp8mp.nn.Linear(64, 32)
    monitor = fp8mp.monitor.attach(layer)
    fp8_step(layer, torch.randn(16, 64), torch.randn(16, 32) * 1e6, CurrentScaling())
    monitor.record_step()
    grad = torch.randn(16, 32) * 1e-5
    grad[0, :5] = 1e-22  # below half the E5M2 subnormal even at scale 57344 / max|grad|
    fp8_step(layer, torch.randn(16, 64), grad, CurrentScaling())
    (row,) = monitor.record_step()
    expected = count_cast_losses(grad, torch.tensor([57344.0]) / grad.abs().max(), "e5m2")
    stale = count_cast_losses(grad, torch.tensor([57344.0 / 1e6]), "e5m2")
    assert 5 <= expected.flushed < stale.flushed
    assert row.flushed_grad == expected.flushed_fraction and row.saturated_grad == 0


def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(fp8mp.nn.Linear(16, 32), torch.nn.GELU(), fp8mp.nn.Linear(32, 8))


def test_records_every_nth_step_and_only_fp8_steps():
    model = make_mlp()
    monitor = fp8mp.monitor.Fp8Monitor(model, every=2)
    for step in range(6):
        x = torch.randn(4, 16) * (step + 1)
        with fp8mp.fp8_autocast(enabled=step != 4):
            model(x).sum().backward()
        monitor.record_step()
    assert [(r.step, r.layer) for r in monitor.records] == [(0, "0"), (0, "2"), (2, "0"), (2, "2")]
    steps, amaxes = monitor.history("0", "amax_input")
    assert steps == [0, 2] and amaxes[1] > amaxes[0] > 0
    with monitor.pause():
        assert not monitor.armed
        with fp8mp.fp8_autocast():
            model(torch.randn(4, 16) * 1000)
    assert monitor.record_step() == [] and len(monitor.records) == 4  # step 6 is recorded, but paused
    monitor.record_step()
    with fp8mp.fp8_autocast():
        model(torch.randn(4, 16)).sum().backward()
    assert len(monitor.record_step()) == 2  # step 8
    monitor.record_step()  # step 9; step 10 would be recorded
    monitor.detach()
    assert not monitor.armed
    with fp8mp.fp8_autocast():
        model(torch.randn(4, 16)).sum().backward()
    assert monitor.record_step() == [] and len(monitor.records) == 6


def test_input_passed_by_keyword_is_counted():
    layer = fp8mp.nn.Linear(8, 4)
    monitor = fp8mp.monitor.attach(layer, grads=False)
    x = torch.full((2, 8), 1.0)
    x[0, 0] = 1e-30  # flushed at scale 448
    with fp8mp.fp8_autocast():
        layer(input=x)
    (row,) = monitor.record_step()
    assert row.flushed_input == 1 / 16


def run_recorded(model, steps=3):
    monitor = fp8mp.monitor.attach(model)
    for step in range(steps):
        with fp8mp.fp8_autocast():
            model(torch.randn(4, 16) * (step + 1)).sum().backward()
        monitor.record_step()
    return monitor


def test_plot_writes_pngs(tmp_path):
    paths = run_recorded(make_mlp()).plot(tmp_path / "plots")
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["amax.png", "cast_losses.png"]
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_csv_round_trip(tmp_path):
    monitor = run_recorded(make_mlp())
    with open(monitor.to_csv(tmp_path / "fp8.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(monitor.records) == 6
    for row, record in zip(rows, monitor.records):
        assert row["layer"] == record.layer and int(row["step"]) == record.step
        assert float(row["amax_input"]) == record.amax_input
        assert math.isclose(float(row["saturated_input"]), record.saturated_input) or math.isnan(record.saturated_input)


def test_summary_table_contents():
    layer = fp8mp.nn.Linear(100, 10)
    monitor = fp8mp.monitor.attach(layer, grads=False)
    recipe = DelayedScaling()
    x0 = planted(1000, 0, 0, 0, amax=1.0, big=0, tiny=0).reshape(10, 100)
    x1 = planted(1000, 25, 0, 0, amax=1.0, big=5.0, tiny=0, seed=5).reshape(10, 100)
    for x in (x0, x1):
        with fp8mp.fp8_autocast(fp8_recipe=recipe):
            layer(x).sum().backward()
        monitor.record_step()
    lines = monitor.summary().splitlines()
    assert lines[0].split()[:2] == ["layer", "steps"] and len(lines) == 2
    cells = lines[1].split()
    assert cells[0] == "<model>" and cells[1] == "2"
    assert float(cells[2]) == pytest.approx(5.0, rel=1e-3)  # newest input amax
    assert float(cells[6]) == pytest.approx(2.5)  # worst input saturation, %
    assert cells[8] == "-" and cells[9] == "-"  # grads not monitored


def test_bad_arguments():
    with pytest.raises(ValueError, match="'model'"):
        fp8mp.monitor.attach(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="'model'"):
        fp8mp.monitor.attach("model")
    with pytest.raises(ValueError, match="'every'"):
        fp8mp.monitor.attach(make_mlp(), every=0)
    with pytest.raises(KeyError, match="'field'"):
        fp8mp.monitor.attach(make_mlp()).history("0", "amax")


def test_monitor_records_conv1d_layers_with_their_scales():
    model = torch.nn.Sequential(fp8mp.nn.Conv1D(32, 16), torch.nn.GELU(), fp8mp.nn.Linear(32, 16))
    monitor = fp8mp.monitor.attach(model)
    x = torch.randn(8, 16) * 3
    with fp8mp.fp8_autocast(fp8_recipe=CurrentScaling()):
        model(x).sum().backward()
    rows = {row.layer: row for row in monitor.record_step()}
    assert set(rows) == {"0", "2"}
    assert rows["0"].amax_input == x.abs().max().item()
    assert rows["0"].amax_weight == model[0].weight.abs().max().item()
    assert rows["0"].scale_input == model[0].fp8_meta.scale[0].item() == (torch.tensor(448.0) / x.abs().max()).item()
