"""`Fp8Module`: the base of fp8mp's modules that compute in FP8 (Linear, Conv1D, and those to come).

It owns what every such module has, under the names the rest of fp8mp reads:

    fp8_meta       the module's Fp8Meta (amaxes, history, scales: state_dict keys "<module>.fp8_meta.*")
    fp8_recipe     a recipe for this module alone (set by fp8mp.convert or a Trainer's format_overrides);
                   None follows fp8_autocast's
    fp8_fallback   True: compute in the input's dtype even inside fp8_autocast (set by
                   fp8mp.fallback.FallbackPolicy)

and the one forward every FP8 module runs (`forward`, `run_fp8`):

    outside fp8_autocast     high_precision_forward(input)
    inside                   check_input(input)
                             record    the enclosing fp8_autocast contexts learn the module ran
                                       (amax reduction across ranks, LossScaler's Inf/NaN check)
                             fallback  fallback_forward(input) when fp8_fallback is set
                             lock      the Fp8Meta lock, held from the scale update to the last cast
                             configure fp8_meta adopts the recipe (fp8_recipe or fp8_autocast's)
                             fp8_forward(input, ran_before)

A subclass implements the four hooks. fp8mp's training system (fallback, monitor, Trainer, the
cast check) and conversion find FP8 modules by `isinstance(m, Fp8Module)`. A module built around
an Fp8Module (fp8mp.nn.LayerNormLinear around its `linear`) runs its own computation inside that
module's prologue with `run_fp8`.
"""
from __future__ import annotations

from typing import Callable

import torch

from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.fp8_meta import Fp8Meta, LinearTensor

__all__ = ["Fp8Module"]


class Fp8Module(torch.nn.Module):
    """Base of the modules that compute in FP8 inside `fp8mp.fp8_autocast` (see the module docstring).

    A subclass calls `init_fp8_state(device)` in its constructor and implements `check_input`,
    `high_precision_forward`, `fallback_forward` and `fp8_forward`. Its Fp8Meta has one column per
    FP8 tensor of `FP8_TENSORS` (a Linear's input, weight and output gradient by default), those of
    `FP8_BACKWARD_TENSORS` in the recipe's backward format.
    """

    FP8_TENSORS: int = len(LinearTensor)
    FP8_BACKWARD_TENSORS: tuple[int, ...] = (LinearTensor.GRAD_OUTPUT,)

    def init_fp8_state(self, device=None) -> None:
        """Fresh FP8 state: a new Fp8Meta on `device`, no recipe of its own, no fallback."""
        self.fp8_meta = self.new_fp8_meta(device)
        self.fp8_recipe = None
        self.fp8_fallback = False

    def new_fp8_meta(self, device=None) -> Fp8Meta:
        """A fresh Fp8Meta with this module's columns, on `device`."""
        return Fp8Meta(self.FP8_TENSORS, backward_tensors=self.FP8_BACKWARD_TENSORS, device=device)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not autocast_state.is_fp8_enabled():
            return self.high_precision_forward(input)
        self.check_input(input)
        return self.run_fp8(input, self.fp8_forward, self.fallback_forward)

    def run_fp8(self, input: torch.Tensor, fp8_forward: Callable[[torch.Tensor, bool], torch.Tensor],
                fallback_forward: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The FP8 prologue (record, fallback, lock, configure) around `fp8_forward(input, ran_before)`, or
        `fallback_forward(input)` when this module falls back. Called inside fp8_autocast, input checked.

        ran_before: the module already ran in the innermost fp8_autocast context (a repeated call in one
        step), which delayed scaling needs to know to reduce amaxes across ranks (see fp8_linear in
        fp8mp/functions/linear.py).
        """
        ran_before = autocast_state.record_module(self)
        if self.fp8_fallback:
            return fallback_forward(input)
        meta = self.fp8_meta
        with meta.lock():  # threads sharing this module take turns from the scale update to the casts
            meta.configure(self.fp8_recipe or autocast_state.get_fp8_recipe())
            return fp8_forward(input, ran_before)

    # ----------------------------------------------------------------------------- the subclass's hooks
    def check_input(self, input: torch.Tensor) -> None:
        """Refuse an input this module cannot take (ValueError / TypeError / RuntimeError naming it)."""
        raise NotImplementedError

    def high_precision_forward(self, input: torch.Tensor) -> torch.Tensor:
        """The forward outside fp8_autocast."""
        raise NotImplementedError

    def fallback_forward(self, input: torch.Tensor) -> torch.Tensor:
        """The forward inside fp8_autocast while `fp8_fallback` is set: the input's dtype, no FP8."""
        raise NotImplementedError

    def fp8_forward(self, input: torch.Tensor, ran_before: bool) -> torch.Tensor:
        """The forward in FP8, called with the Fp8Meta lock held and configured for the recipe in use."""
        raise NotImplementedError
