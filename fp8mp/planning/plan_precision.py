"""`plan_precision(model, batches)`: measure every layer convert would touch, then choose its recipe.

The steps, each in its own module:

    layers.py       the layers (`fp8mp.convert`'s: torch.nn.Linear, transformers Conv1D, dims multiples of 16)
    numerics.py     one high-precision forward and backward per calibration batch; each layer alone in FP8
                    under each candidate on its real input and output gradient: SQNRs, range, loss terms
    sensitivity.py  the estimated loss change per layer and candidate, its curvature scale fitted on a few
                    measured one-layer loss changes (all of them with measure_loss=True: the rank correlation)
    speed.py        forward and backward times at each layer's shape, per candidate and in high precision
    choose.py       per layer the fastest candidate within the budget

The model is put in eval mode while it is measured (dropout off: each one-layer comparison sees the same network)
and back in its mode afterwards; its parameters, gradients and modules are left as they were.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Callable, Iterable

import numpy as np
import torch

from fp8mp.planning import sensitivity as sens
from fp8mp.planning.choose import LayerOptions, choose
from fp8mp.planning.layers import PlannedLayer, planned_layers
from fp8mp.planning.numerics import LayerNumerics, capture_batch
from fp8mp.planning.plan import HIGH_PRECISION, LayerPlan, PrecisionPlan, default_candidates
from fp8mp.planning.speed import layer_times
from fp8mp.utils.device import device_label
from fp8mp.scaling.autocast import validate_recipe

__all__ = ["plan_precision", "model_loss", "DEFAULT_BUDGET_FRACTION"]

DEFAULT_BUDGET_FRACTION = 1e-3  # budget=None: the plan may cost 0.1% of the high-precision calibration loss


def model_loss(model: torch.nn.Module, batch) -> torch.Tensor:
    """The default loss_fn: `model(**batch).loss`, as transformers models return it when the batch has labels."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"plan_precision: the default loss_fn calls model(**batch) and reads .loss, but a batch is a "
                        f"{type(batch).__name__}; pass loss_fn(model, batch) -> loss")
    loss = getattr(model(**batch), "loss", None)
    if loss is None:
        raise ValueError("plan_precision: model(**batch) returned no .loss (give the batches labels, or pass "
                         "loss_fn(model, batch) -> loss)")
    return loss


def _check_arguments(model, batches, loss_fn, candidates, budget, memory_first, progress, measure_loss):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"plan_precision: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(batches, (torch.Tensor, Mapping)) or not isinstance(batches, Iterable):
        raise TypeError("plan_precision: argument 'batches' must be a list (or other iterable) of calibration batches, "
                        f"got {type(batches).__name__}")
    batches = list(batches)
    if not batches:
        raise ValueError("plan_precision: argument 'batches' is empty; give it a few real calibration batches")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError("plan_precision: argument 'loss_fn' must be callable as loss_fn(model, batch) -> loss")
    if candidates is None:
        candidates = default_candidates()
    if not isinstance(candidates, Mapping) or not candidates:
        raise TypeError("plan_precision: argument 'candidates' must be a non-empty dict name -> fp8mp recipe, got "
                        f"{candidates!r}")
    checked = {}
    for name, recipe in candidates.items():
        if not isinstance(name, str):
            raise TypeError(f"plan_precision: argument 'candidates': names must be str, got {name!r}")
        if name == HIGH_PRECISION:
            if recipe is not None:
                raise ValueError(f"plan_precision: argument 'candidates': {HIGH_PRECISION!r} is high precision (always "
                                 f"an option); its entry must be None, got {recipe!r}")
            continue
        try:
            checked[name] = validate_recipe(recipe)
        except (TypeError, ValueError) as error:
            raise type(error)(f"plan_precision: argument 'candidates': {name!r}: {error}") from None
    if not checked:
        raise ValueError("plan_precision: argument 'candidates' holds no FP8 recipe")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or math.isnan(budget)
                               or budget < 0):
        raise ValueError(f"plan_precision: argument 'budget' must be a loss change >= 0 or None, got {budget!r}")
    for name, value in (("memory_first", memory_first), ("progress", progress), ("measure_loss", measure_loss)):
        if not isinstance(value, bool):
            raise TypeError(f"plan_precision: argument '{name}' must be a bool, got {value!r}")
    return batches, loss_fn or model_loss, checked


def plan_precision(model: torch.nn.Module, batches, loss_fn: Callable | None = None, candidates: dict | None = None,
                   budget: float | None = None, memory_first: bool = False, progress: bool = True, *,
                   measure_loss: bool = False, speed_cache=None, repeats: int = 5) -> PrecisionPlan:
    """Measure each layer `fp8mp.convert` would touch on `batches`, and choose its recipe (module docstring).

    Args:
        model: the model in high precision (torch modules, before `convert`), on the device it trains on.
        batches: a few real calibration batches, each what `loss_fn` takes.
        loss_fn: `loss_fn(model, batch) -> loss` (a one-element tensor); default `model(**batch).loss`, as a
            transformers model returns it.
        candidates: name -> recipe (default: every recipe fp8mp has, `fp8mp.planning.default_candidates()`);
            high precision ("bf16") is always an option.
        budget: the loss change the whole plan may cost, in loss units: the summed sensitivity of the chosen
            candidates stays within it. Default: 0.1% of the high-precision calibration loss.
        memory_first: plan FP8 even where it is slower than high precision on this device.
        progress: show a tqdm progress bar.
        measure_loss: also measure every layer's one-layer-at-a-time loss change under every candidate (one forward
            over the batches each) and record, in `plan.notes["rank_correlation"]`, its Spearman rank correlation
            with the estimate. Without it only `sensitivity.FIT_PAIRS` pairs are measured.
        speed_cache: a JSON file of layer times to read and extend (speed.py); a plan from the same evidence and
            the same cache file is the same plan.
        repeats: timed runs per layer shape and candidate (the median is kept).
    Returns:
        an `fp8mp.PrecisionPlan`: `print(plan)`, `plan.save(path)`, `fp8mp.convert(model, plan=plan)`.
    """
    batches, loss_fn, candidates = _check_arguments(model, batches, loss_fn, candidates, budget, memory_first,
                                                    progress, measure_loss)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"plan_precision: argument 'repeats' must be an int >= 1, got {repeats!r}")
    layers = planned_layers(model)
    if not layers:
        raise ValueError("plan_precision: argument 'model' has no layer fp8mp.convert would touch (torch.nn.Linear or "
                         "transformers Conv1D with in and out features multiples of 16; plan a model before convert)")
    started = time.perf_counter()
    from tqdm.auto import tqdm

    measured_pairs = len(layers) * len(candidates) if measure_loss else sens.FIT_PAIRS
    bar = tqdm(total=len(batches) + measured_pairs + len(layers), desc="plan_precision", disable=not progress)
    training = model.training
    model.eval()
    try:
        numerics, base_losses, flops_total, dtypes = _measure_numerics(model, layers, batches, loss_fn, candidates, bar)
        measured, kappa = _measure_losses(model, layers, numerics, batches, loss_fn, candidates, base_losses,
                                          measure_loss, bar)
    finally:
        model.train(training)
    times = {}
    for layer in layers:
        numeric = numerics[layer.name]
        if numeric.rows_per_batch:
            times[layer.name] = layer_times(layer, numeric.rows_per_batch, dtypes[layer.name], candidates, repeats,
                                            speed_cache)
        bar.update(1)
    bar.close()
    loss = float(np.mean(base_losses))
    if budget is None:
        budget = DEFAULT_BUDGET_FRACTION * abs(loss)
    estimates = {name: sens.estimated_loss_change(numerics[name], kappa) for name in numerics}
    options = [LayerOptions(layer.name, {c: abs(v) for c, v in estimates[layer.name].items()}
                            if numerics[layer.name].batches_called else {},
                            {c: t["forward"] + t["backward"] for c, t in times.get(layer.name, {}).items()})
               for layer in layers]
    choices = choose(options, list(candidates), budget, memory_first)
    layer_flops = sum(numerics[layer.name].flops for layer in layers)
    total = max(flops_total or 0.0, layer_flops) or 1.0
    plans = [LayerPlan(layer.name, layer.kind,
                       {"in_features": layer.in_features, "out_features": layer.out_features,
                        "tokens": numerics[layer.name].rows_per_batch or 0},
                       min(1.0, numerics[layer.name].flops / total), choice, reason,
                       _evidence(numerics[layer.name], estimates[layer.name], measured, times.get(layer.name)))
             for layer, (choice, reason) in zip(layers, choices)]
    notes = {"calibration_loss": loss, "batches": len(batches), "curvature_scale": kappa,
             "measured_pairs": len(measured), "seconds": time.perf_counter() - started,
             "memory_first": memory_first, "forward_gemm_flops_per_batch": total / len(batches)}
    if measure_loss:
        notes["rank_correlation"] = _correlations(estimates, measured)
    device = layers[0].module.weight.device
    return PrecisionPlan(plans, dict(candidates), budget=float(budget), device=device_label(device),
                         architecture=[layer.name for layer in layers], notes=notes)


def _measure_numerics(model, layers: list[PlannedLayer], batches, loss_fn, candidates, bar):
    numerics = {layer.name: LayerNumerics(layer, candidates) for layer in layers}
    base_losses, flops_total, dtypes = [], 0.0, {}
    for batch in batches:
        loss, calls, flops = capture_batch(model, layers, batch, loss_fn, count_flops=True)
        base_losses.append(loss)
        flops_total += flops or 0.0
        for layer in layers:
            if calls[layer.name]:
                dtypes.setdefault(layer.name, calls[layer.name][0][0].dtype)
            numerics[layer.name].add_batch(calls[layer.name])
        del calls
        bar.update(1)
    return numerics, base_losses, flops_total, dtypes


def _measure_losses(model, layers, numerics, batches, loss_fn, candidates, base_losses, measure_loss, bar):
    """The measured one-layer loss changes ((layer, candidate) -> change) and the curvature scale kappa."""
    by_name = {layer.name: layer for layer in layers}
    pairs = ([(layer.name, cand) for layer in layers if numerics[layer.name].batches_called for cand in candidates]
             if measure_loss else sens.fit_pairs(numerics))
    measured = {}
    for name, cand in pairs:
        measured[(name, cand)] = sens.measured_loss_change(model, by_name[name], candidates[cand], batches, loss_fn,
                                                           base_losses)
        bar.update(1)
    fit = {pair: measured[pair] for pair in sens.fit_pairs(numerics) if pair in measured}
    return measured, sens.curvature_scale(numerics, fit)


def _evidence(numeric: LayerNumerics, estimate: dict, measured: dict, times: dict | None) -> dict:
    if not numeric.batches_called:
        return {}
    name = numeric.layer.name
    evidence = {"sqnr_db": numeric.sqnr(), "range_binades": numeric.range,
                "sensitivity": {c: abs(v) for c, v in estimate.items()}, "estimated_loss_change": dict(estimate)}
    mine = {c: measured[(n, c)] for (n, c) in measured if n == name}
    if mine:
        evidence["measured_loss_change"] = mine
    if times:
        evidence["time_ms"] = times
    return evidence


def _correlations(estimates: dict, measured: dict) -> dict:
    """Spearman rank correlations over every measured (layer, candidate): the estimate against the measured change
    (signed), and the sensitivity against the change's size."""
    keys = sorted(measured)
    est = [estimates[name][cand] for name, cand in keys]
    meas = [measured[key] for key in keys]
    return {"estimate_vs_measured": sens.spearman(est, meas),
            "sensitivity_vs_abs_measured": sens.spearman(np.abs(est), np.abs(meas)), "pairs": len(keys)}
