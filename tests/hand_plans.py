"""Precision plans built by hand (no measuring), and a small model to apply them to, for the plan tests."""
from __future__ import annotations

import torch

import fp8mp
from fp8mp.planning import HIGH_PRECISION, LayerPlan, PrecisionPlan, default_candidates


def mlp(seed: int = 0) -> torch.nn.Sequential:
    """Three FP8-sized Linear layers ("0", "2", "4") and a 10-wide head ("6", too small for FP8 GEMMs)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))


def evidence(choice: str) -> dict:
    """Made-up evidence in the shape plan_precision writes, with the chosen candidate the fastest."""
    candidates = [name for name in default_candidates()]
    return {"sqnr_db": {c: {"output": 30.0 + i, "grad_input": 25.0 + i, "grad_weight": float("inf")}
                        for i, c in enumerate(candidates)},
            "range_binades": 11.5,
            "sensitivity": {c: 1e-4 * (i + 1) for i, c in enumerate(candidates)},
            "time_ms": {HIGH_PRECISION: {"forward": 2.0, "backward": 4.0},
                        **{c: {"forward": 1.0 if c == choice else 1.5, "backward": 2.0} for c in candidates}}}


def hand_plan(choices: dict[str, str], architecture: list[str] | None = None, model=None) -> PrecisionPlan:
    """A plan choosing `choices` (name -> candidate name or "bf16"), for `model`'s convertible layers (default
    mlp()'s) unless `architecture` is given."""
    model = model if model is not None else mlp()
    modules = dict(model.named_modules())
    architecture = architecture if architecture is not None else fp8mp.nn.convertible_layers(model)
    flops = {name: modules[name].in_features * modules[name].out_features for name in choices}
    total = sum(flops.values())
    layers = [LayerPlan(name, type(modules[name]).__name__,
                        {"in_features": modules[name].in_features, "out_features": modules[name].out_features,
                         "tokens": 64}, flops[name] / total, choice, f"chosen by hand: {choice}", evidence(choice))
              for name, choice in choices.items()]
    return PrecisionPlan(layers, default_candidates(), budget=0.01, device="cpu", architecture=architecture)
