"""What `convert` says about what it did, on the "fp8mp" logger, so that nothing matches silently.

    INFO     fp8mp.convert: fc1: Linear(32 -> 64) -> fp8mp.nn.Linear, recipe RowwiseScaling     (one line a layer)
    INFO     fp8mp.convert: converted 3 modules; kept 1 (module_filter or plan: 1, dims not multiples of 16: 0)
    WARNING  fp8mp.convert converted no module: module_filter <lambda> (train.py:12) accepted none of ...

A conversion that converts nothing warns, naming the filter (or saying the model holds nothing to convert),
except where that is what was asked: a plan that keeps every layer in high precision, or a model whose layers
are fp8mp modules already. `converted_layers(model)` lists afterwards what a model runs in FP8.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from fp8mp.nn.fp8_module import Fp8Module

__all__ = ["ConversionReport", "converted_layers"]

logger = logging.getLogger("fp8mp")

_SHOWN = 8


def converted_layers(model: torch.nn.Module) -> dict[str, object | None]:
    """name -> pinned recipe (None: follows fp8_autocast's) of every FP8 module of `model`: what it runs in FP8."""
    return {name: module.fp8_recipe for name, module in model.named_modules() if isinstance(module, Fp8Module)}


def _recipe_name(recipe) -> str:
    return "fp8_autocast's" if recipe is None else type(recipe).__name__


def _describe_filter(module_filter) -> str:
    code = getattr(module_filter, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"module_filter {getattr(module_filter, '__qualname__', repr(module_filter))}{where}"


def _names(names: list[str]) -> str:
    return ", ".join(name or "<root>" for name in names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


@dataclasses.dataclass
class ConversionReport:
    """convert's tally while it swaps (one object per call, never kept): what it met, converted and kept, and why."""

    candidates: list[str] = dataclasses.field(default_factory=list)  # modules of a type convert swaps
    filtered: list[str] = dataclasses.field(default_factory=list)    # refused by module_filter or kept by the plan
    unsupported: list[str] = dataclasses.field(default_factory=list)  # dims or norm shapes fp8mp does not take
    converted: list[tuple[str, str, str, object]] = dataclasses.field(default_factory=list)  # name, old, new, recipe

    def log(self, model: torch.nn.Module, module_filter, plan_given: bool) -> None:
        """One INFO line a converted module and a summary; the WARNING when nothing was converted unasked."""
        for name, old, new, recipe in self.converted:
            suffix = f", recipe {_recipe_name(recipe)}" if new != "LayerNorm" and new != "RMSNorm" else ""
            logger.info("fp8mp.convert: %s: %s -> fp8mp.nn.%s%s", name or "<root>", old, new, suffix)
        if self.converted:
            logger.info("fp8mp.convert: converted %d modules; kept %d (%s: %d, unsupported shapes: %d)",
                        len(self.converted), len(self.filtered) + len(self.unsupported),
                        "plan" if plan_given else "module_filter", len(self.filtered), len(self.unsupported))
            return
        if plan_given:
            logger.info("fp8mp.convert: the plan keeps every layer in high precision: converted no module")
        elif self.filtered:
            logger.warning("fp8mp.convert converted no module: %s accepted none of the model's %d convertible "
                           "modules (%s)", _describe_filter(module_filter), len(self.candidates),
                           _names(self.candidates))
        elif any(isinstance(m, Fp8Module) for m in model.modules()):
            logger.info("fp8mp.convert: nothing left to convert: the model's FP8 layers are fp8mp modules already")
        elif not self.candidates:
            logger.warning("fp8mp.convert converted no module: the model holds no torch.nn.Linear or transformers "
                           "Conv1D (nor, with convert_norms, LayerNorm/RMSNorm) of exactly those types")
        else:
            logger.warning("fp8mp.convert converted no module: none of the model's %d candidates (%s) has FP8 shapes "
                           "(Linear dims multiples of 16)", len(self.candidates), _names(self.candidates))
