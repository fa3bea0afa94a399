"""Every op that writes into a tensor the caller passes (amax, the amax history, scales) refuses
one that shares memory with any of its inputs, naming both arguments, instead of writing into
what it reads."""
from __future__ import annotations

import pytest
import torch

import fp8mp
from fp8mp.ops import norm


def _x():
    return torch.randn(4, 8)


def _ones():
    return torch.ones(1)


ALIASING_CALLS = {
    "cast_to_fp8 amax in x": (lambda x: fp8mp.cast_to_fp8(x, _ones(), x.view(-1)[:1], "e4m3"), "x"),
    "cast_to_fp8 amax is scale": (lambda x: (lambda s: fp8mp.cast_to_fp8(x, s, s, "e4m3"))(_ones()), "scale"),
    "cast_to_fp8 amax in a strided x": (lambda x: fp8mp.cast_to_fp8(x[:, ::2], _ones(), x[3, 6:7], "e5m2"), "x"),
    "cast_to_fp8_transpose amax in x": (lambda x: fp8mp.cast_to_fp8_transpose(x, _ones(), x[0, :1], "e4m3"), "x"),
    "layer_norm_fp8 amax in x": (lambda x: norm.layer_norm_fp8(x, None, None, 1e-5, _ones(), x[1, 2:3], "e4m3"),
                                 "x"),
    "layer_norm_fp8 amax in weight": (
        lambda x: (lambda w: norm.layer_norm_fp8(x, w, None, 1e-5, _ones(), w[:1], "e4m3"))(torch.ones(8)),
        "weight"),
    "layer_norm_fp8 amax in bias": (
        lambda x: (lambda b: norm.layer_norm_fp8(x, None, b, 1e-5, _ones(), b[5:6], "e4m3"))(torch.zeros(8)),
        "bias"),
    "rms_norm_fp8 amax in x": (lambda x: norm.rms_norm_fp8(x, None, 1e-5, _ones(), x[0, :1], "e5m2"), "x"),
    "rms_norm_fp8 amax is scale": (
        lambda x: (lambda s: norm.rms_norm_fp8(x, None, 1e-5, s, s, "e4m3"))(_ones()), "scale"),
}


@pytest.mark.parametrize("name", sorted(ALIASING_CALLS))
def test_an_output_that_overlaps_an_input_is_refused(name):
    call, input_name = ALIASING_CALLS[name]
    x = _x()
    before = x.clone()
    with pytest.raises(RuntimeError, match=f"'amax' is written in place and must not share memory with '{input_name}'"):
        call(x)
    assert torch.equal(x, before)  # refused before anything was written


def test_update_amax_history_refuses_a_scale_inside_the_history():
    history = torch.zeros(4, 2)
    both = "'amax_history' is written in place and must not share memory with 'scale'"
    with pytest.raises(RuntimeError, match=both):
        fp8mp.update_amax_history_and_scale(torch.ones(2), history, history[3], torch.ones(2), torch.full((2,), 448.0),
                                            0, "max")


def test_neighbouring_views_of_one_buffer_are_accepted():
    # Aliasing is about bytes, not storages: an amax right after x in the same buffer is fine.
    buffer = torch.randn(33)
    x, amax = buffer[:32], buffer[32:]
    y = fp8mp.cast_to_fp8(x, _ones(), amax, "e4m3")
    assert amax.item() == x.abs().max().item()
    assert torch.equal(y.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))
    # ... and so is one just past the last element a strided x reaches (x[3, 6] is x[:, ::2]'s last).
    x = torch.randn(4, 8)
    fp8mp.cast_to_fp8(x[:, ::2], _ones(), x[3, 7:8], "e4m3")
    assert x[3, 7].item() == x[:, ::2].abs().max().item()
