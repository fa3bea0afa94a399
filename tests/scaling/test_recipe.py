"""Scaling recipes: formats, defaults, validation, frozen values."""
from __future__ import annotations

import dataclasses

import pytest

import fp8mp
from fp8mp.scaling import recipe


# ---------------------------------------------------------------- recipes


def test_format_directions():
    assert (recipe.Format.E4M3.forward_format, recipe.Format.E4M3.backward_format) == ("e4m3", "e4m3")
    assert (recipe.Format.E5M2.forward_format, recipe.Format.E5M2.backward_format) == ("e5m2", "e5m2")
    assert (recipe.Format.HYBRID.forward_format, recipe.Format.HYBRID.backward_format) == ("e4m3", "e5m2")


def test_recipe_defaults_and_exports():
    d = fp8mp.recipe.DelayedScaling()
    assert (d.margin, d.fp8_format, d.amax_history_len, d.amax_compute_algo) == (0, recipe.Format.HYBRID, 1024, "max")
    c = fp8mp.recipe.CurrentScaling(margin=1, fp8_format=recipe.Format.E4M3)
    assert (c.margin, c.fp8_format) == (1, recipe.Format.E4M3)
    assert fp8mp.update_amax_history_and_scale is fp8mp.ops.scale_update.update_amax_history_and_scale


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(margin=-1), "margin"),
        (dict(margin=1.5), "margin"),
        (dict(margin=True), "margin"),
        (dict(amax_history_len=0), "amax_history_len"),
        (dict(amax_history_len=2.0), "amax_history_len"),
        (dict(amax_compute_algo="mean"), "amax_compute_algo"),
        (dict(fp8_format="HYBRID"), "fp8_format"),
        (dict(fp8_format=None), "fp8_format"),
    ],
)
def test_delayed_scaling_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        recipe.DelayedScaling(**kwargs)


@pytest.mark.parametrize("kwargs,field", [(dict(margin=-2), "margin"), (dict(fp8_format="e4m3"), "fp8_format")])
def test_current_scaling_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        recipe.CurrentScaling(**kwargs)


@pytest.mark.parametrize("obj,field", [(recipe.DelayedScaling(), "margin"), (recipe.CurrentScaling(), "fp8_format")])
def test_recipes_are_frozen(obj, field):
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, getattr(obj, field))
    assert hash(obj) == hash(type(obj)())  # frozen dataclasses are hashable values
