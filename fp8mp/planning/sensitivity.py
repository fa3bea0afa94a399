"""What quantizing one layer alone does to the loss: a fast estimate, the measured change, and how well they agree.

The estimate comes from the one high-precision backward `numerics.py` already ran: for a layer whose output moves
by dy = y_fp8 - y under a candidate,

    estimated loss change = T + kappa * F
        T = sum g * dy                              first order (Taylor), g the loss's gradient at the output
        F = (M / 2) * sum over rows (g_r . dy_r)^2  second order, empirical Fisher (numerics.py)

The empirical Fisher keeps only the curvature the observed gradients span; away from a minimum (a model early in
training), and for losses whose curvature the gradients do not show (a squared error), the loss's curvature is
larger: the fitted kappa was 13 to 25 on the test GPTs and 46 on the test MLP with its squared-error loss.
`kappa` is one number per model, fitted on a few measured pairs: the median of (measured - T) / F over the
`FIT_PAIRS` (layer, candidate) pairs of largest F, whose one-layer loss change `measured_loss_change` measures
(one forward over the calibration batches each). The layer's *sensitivity* under a candidate, which the choice
sums against the budget, is the size of that estimate, |T + kappa * F|: a change either way is a departure from
the high-precision model.

`measured_loss_change` is the validation: the calibration loss with that one layer computed in FP8 under the
candidate (the rest in high precision) minus the high-precision loss, averaged over the batches. `spearman` is the
rank correlation written without scipy.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from fp8mp.planning.layers import PlannedLayer, fp8_probe
from fp8mp.planning.numerics import LayerNumerics
from fp8mp.scaling.autocast import fp8_autocast

__all__ = ["FIT_PAIRS", "measured_loss_change", "fit_pairs", "curvature_scale", "estimated_loss_change", "spearman"]

FIT_PAIRS = 4  # (layer, candidate) pairs measured to fit kappa


def measured_loss_change(model: torch.nn.Module, layer: PlannedLayer, recipe, batches: list, loss_fn: Callable,
                         base_losses: list[float]) -> float:
    """Mean over `batches` of (loss with `layer` alone in FP8 under `recipe`) - `base_losses` (high precision).

    The layer's output is replaced by that of an FP8 probe on its weights (a forward hook, removed afterwards), so
    the model itself is not changed; a fresh probe, so delayed scaling starts from the data as a run does."""
    probe = fp8_probe(layer, recipe)

    def in_fp8(module, args, kwargs, output):
        with fp8_autocast(enabled=True, fp8_recipe=recipe):
            return probe(args[0] if args else kwargs["input"])

    handle = layer.module.register_forward_hook(in_fp8, with_kwargs=True)
    try:
        with torch.no_grad():
            losses = [float(loss_fn(model, batch)) for batch in batches]
    finally:
        handle.remove()
    return float(np.mean(np.array(losses) - np.array(base_losses)))


def fit_pairs(numerics: dict[str, LayerNumerics], count: int = FIT_PAIRS) -> list[tuple[str, str]]:
    """The `count` (layer, candidate) pairs of largest second-order term F, ties in plan order."""
    pairs = [(f, name, cand) for name, numeric in numerics.items() for cand, f in numeric.curvature().items()
             if f > 0 and math.isfinite(f)]
    pairs.sort(key=lambda p: -p[0])  # stable: equal F keep plan order
    return [(name, cand) for _, name, cand in pairs[:count]]


def curvature_scale(numerics: dict[str, LayerNumerics], measured: dict[tuple[str, str], float]) -> float:
    """kappa: the median of (measured - T) / F over the measured pairs with F > 0 (module docstring); 1 when none
    has (then the estimate is the plain empirical Fisher one). Never below 0."""
    ratios = []
    for (name, cand), change in measured.items():
        numeric = numerics[name]
        f, t = numeric.curvature()[cand], numeric.taylor()[cand]
        if f > 0 and math.isfinite(change) and math.isfinite(t):
            ratios.append((change - t) / f)
    return max(0.0, float(np.median(ratios))) if ratios else 1.0


def estimated_loss_change(numeric: LayerNumerics, kappa: float) -> dict[str, float]:
    """candidate -> T + kappa * F for one layer (module docstring)."""
    taylor, curvature = numeric.taylor(), numeric.curvature()
    return {cand: taylor[cand] + kappa * curvature[cand] for cand in taylor}


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, tied values sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2.0
        start = end + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equally long sequences (nan with fewer than 3 finite pairs or a
    constant side)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"spearman: arguments 'a' and 'b' must have the same length, got {a.shape} and {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 3:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])
