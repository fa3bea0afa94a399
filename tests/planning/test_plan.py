"""fp8mp.PrecisionPlan: choices, the table, the plot, and its JSON (round trip, hand edits, refusals)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import fp8mp
from fp8mp.planning import LayerPlan, PrecisionPlan, as_plan, default_candidates
from fp8mp.scaling.recipe import DelayedScaling, Format, MMParams, RowwiseScaling
from hand_plans import hand_plan, mlp

CHOICES = {"0": "rowwise", "2": "delayed", "4": "bf16"}


def test_choices_recipes_and_fp8_share():
    plan = hand_plan(CHOICES)
    assert plan.choice("0") == RowwiseScaling() and plan.choice("2") == DelayedScaling() and plan.choice("4") is None
    assert plan.layer_recipes() == {"0": RowwiseScaling(), "2": DelayedScaling(), "4": None}
    assert plan.fp8_flop_share == pytest.approx((32 * 64 + 64 * 64) / (32 * 64 + 64 * 64 + 64 * 32))
    with pytest.raises(KeyError, match=r"no layer '3' \(did you mean '0'\?\)|no layer '3'"):
        plan.choice("3")
    assert fp8mp.PrecisionPlan is PrecisionPlan


def test_save_load_round_trip(tmp_path):
    plan = hand_plan(CHOICES)
    plan.candidates["delayed"] = DelayedScaling(margin=2, fp8_format=Format.E4M3, amax_history_len=16,
                                                fp8_gemm_fprop=MMParams(use_split_accumulator=True))
    plan.notes["rank_correlation"] = 0.93
    plan.save(tmp_path / "plan.json")
    loaded = PrecisionPlan.load(tmp_path / "plan.json")
    assert loaded.to_dict() == plan.to_dict()
    assert loaded.layer_recipes() == plan.layer_recipes() and loaded.choice("2").amax_history_len == 16
    assert loaded.layers == plan.layers and math.isinf(loaded.layers[0].evidence["sqnr_db"]["delayed"]["grad_weight"])
    text = (tmp_path / "plan.json").read_text()
    assert '"type": "DelayedScaling"' in text and '"fp8_format": "E4M3"' in text  # Format by value


def test_a_choice_edited_by_hand_applies(tmp_path):
    hand_plan(CHOICES).save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["layers"][0]["choice"] = "bf16"  # what a person does in an editor
    data["layers"][2]["choice"] = "mxfp8"
    data["candidates"]["mxfp8"]["fields"]["scale_mode"] = "floor"
    (tmp_path / "edited.json").write_text(json.dumps(data, indent=1))
    model = fp8mp.convert(mlp(), plan=PrecisionPlan.load(tmp_path / "edited.json"))
    assert type(model[0]) is torch.nn.Linear
    assert model[4].fp8_recipe == fp8mp.recipe.MXFP8Scaling(scale_mode="floor")
    assert as_plan(str(tmp_path / "edited.json")).layer_recipes()["4"] == model[4].fp8_recipe


def _edit(tmp_path, change) -> str:
    data = hand_plan(CHOICES).to_dict()
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["layers"][1].update(choice="rowise"), r"layers\[1\] \('2'\): 'choice' 'rowise' is no candidate; "
                                                       r"choose one of 'delayed', 'current', 'rowwise'"),
    (lambda d: d["layers"][0].update(flop_shar=0.1), r"layers\[0\] \('0'\): unknown key 'flop_shar' "
                                                     r"\(did you mean 'flop_share'\?\)"),
    (lambda d: d["layers"][0].pop("kind"), r"layers\[0\] \('0'\): missing key\(s\) 'kind'"),
    (lambda d: d["layers"][0].update(flop_share=1.5), r"layers\[0\] \('0'\): LayerPlan '0': field 'flop_share'"),
    (lambda d: d["candidates"]["block"].update(type="BlockScale"), r"candidates.block.type must be one of"),
    (lambda d: d["candidates"]["delayed"]["fields"].update(margin=-1), r"candidates.delayed.fields: margin must be"),
    (lambda d: d["candidates"]["rowwise"]["fields"].update(fp8_format="E3M4"),
     r"candidates.rowwise.fields.fp8_format must be one of 'E4M3', 'E5M2', 'HYBRID', got 'E3M4'"),
    (lambda d: d["candidates"]["current"]["fields"].update(marg=1), r"CurrentScaling has no field 'marg'"),
    (lambda d: d.update(version=7), r"'format' and 'version' must be 'fp8mp.PrecisionPlan' and 1"),
    (lambda d: d.pop("architecture"), r"missing key\(s\) 'architecture'"),
    (lambda d: d.update(architecture=["2", "4"]), r"plans \['0'\], which argument 'architecture' lacks"),
    (lambda d: d["layers"].append(dict(d["layers"][0])), r"plans '0' twice"),
])
def test_load_names_what_is_wrong(tmp_path, change, message):
    path = _edit(tmp_path, change)
    with pytest.raises(ValueError, match=message) as error:
        PrecisionPlan.load(path)
    assert str(error.value).startswith(path)


def test_load_of_bad_json_and_of_no_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "fp8mp.PrecisionPlan", "layers": [}')
    with pytest.raises(ValueError, match=r"broken.json: not JSON: Expecting value: line 1"):
        PrecisionPlan.load(path)
    with pytest.raises(FileNotFoundError, match=r"argument 'plan': no plan at .*absent.json"):
        as_plan(tmp_path / "absent.json")
    with pytest.raises(TypeError, match=r"argument 'plan' must be an fp8mp.PrecisionPlan or the path"):
        as_plan({"0": None})


def test_the_constructor_names_its_arguments():
    layer = LayerPlan("0", "Linear", {}, 1.0, "rowwise")
    with pytest.raises(ValueError, match=r"layer '0' chooses 'rowwise', which is no candidate"):
        PrecisionPlan([layer], {"delayed": DelayedScaling()}, budget=None, device="cpu", architecture=["0"])
    with pytest.raises(TypeError, match=r"'candidates': 'rowwise' must be an fp8mp recipe"):
        PrecisionPlan([layer], {"rowwise": "RowwiseScaling"}, budget=None, device="cpu", architecture=["0"])
    with pytest.raises(TypeError, match=r"argument 'architecture' must be a list of module names"):
        PrecisionPlan([layer], default_candidates(), budget=None, device="cpu", architecture="0")
    with pytest.raises(TypeError, match=r"LayerPlan '0': field 'shape' must be a dict"):
        LayerPlan("0", "Linear", [32, 64], 1.0, "bf16")


def test_the_table_has_a_row_per_layer_with_the_evidence_and_why():
    text = str(hand_plan(CHOICES))
    lines = text.splitlines()
    assert lines[0].startswith("PrecisionPlan on cpu: 3 layers, 75.0% of GEMM FLOPs in FP8, loss budget 0.01")
    assert lines[1].split()[:6] == ["layer", "kind", "K", "x", "N", "M"]
    row = lines[3].split()
    assert row[:8] == ["0", "Linear", "32", "x", "64", "64", "25.0%", "rowwise"]
    assert row[8:13] == ["32.0/27.0/inf", "11.5", "0.0003", "2.00x", "chosen"]  # SQNR, range, sensitivity, speed-up
    assert lines[5].split()[7:9] == ["bf16", "-"]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = hand_plan(CHOICES).plot(tmp_path / "plan.png")
    data = (tmp_path / "plan.png").read_bytes()
    assert path == str(tmp_path / "plan.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    bare = PrecisionPlan([LayerPlan("0", "Linear", {}, 1.0, "rowwise")], default_candidates(), budget=None,
                         device="cpu", architecture=["0"])
    bare.plot(tmp_path / "bare.png")  # a plan without evidence still draws
    assert (tmp_path / "bare.png").stat().st_size > 0


def test_save_takes_numpy_and_torch_scalars_and_refuses_other_objects_whole(tmp_path):
    np = pytest.importorskip("numpy")
    plan = hand_plan(CHOICES)
    plan.layers[0].evidence.update(range_binades=np.float32(3.5), tokens_seen=torch.tensor(64))
    plan.save(tmp_path / "plan.json")
    assert PrecisionPlan.load(tmp_path / "plan.json").layers[0].evidence["range_binades"] == 3.5
    plan.layers[0].evidence["probe"] = object()
    with pytest.raises(TypeError, match=r"PrecisionPlan.save: object .* is no JSON value"):
        plan.save(tmp_path / "other.json")
    assert not (tmp_path / "other.json").exists()
