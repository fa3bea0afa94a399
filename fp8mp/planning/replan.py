"""`replan(model, batches, plan)`: measure a model that trains under a plan again, and apply what changed.

A layer's range drifts in training (a few channels grow into "massive activations"), and NVIDIA recommends moving
the last part of an NVFP4 run to higher precision: the plan made at step 0 need not be the right one at step N.
`replan` measures the live, converted model as `plan_precision` measures a model in high precision, with the same
candidates and budget as `plan`, and changes only the layers whose choice differs, in place:

    FP8 -> FP8 (another recipe)   `fp8_recipe` re-pinned and the Fp8Meta configured for it with its scaling state
                                  reset (amaxes, amax history, scales): a history gathered under another recipe
                                  describes other casts, so the next forward sets the scales from the data, as on
                                  step 0. The module object stays, and so does its place in the model.
    FP8 -> "bf16"                 the module swapped for its torch twin (`module.to_torch()`); its scaling state goes.
    "bf16" -> FP8                 the torch layer converted alone (`fp8mp.convert(layer, recipe=...)`), pinned.

Parameters stay the same tensors throughout (the swaps share them), so an optimizer built before keeps working,
its state included. Not carried over by a swap: module hooks registered on the old module, and the other options
`convert` may have been given (FP8-stored frozen weights, FP8 saved activations, FP8 all-gather); a model using
those should convert again from a plan instead.

Memory: nothing is copied. While it measures, `replan` swaps each fp8mp module of the live model for its torch
twin on the same parameters (as `fp8mp.unconvert` does) and puts the very same module objects back afterwards, even
when measuring fails; the measuring itself costs what `plan_precision` costs (one high-precision forward and
backward per batch, with every planned layer's input and output gradient kept, and a probe per layer). A module
whose weight is stored in FP8 (`fp8_weight=True`) is measured on a decoded fp32 copy of that weight.
"""
from __future__ import annotations

import contextlib
import logging

import torch

from fp8mp.nn.conversion import FP8_MODULES, convert, convertible_layers
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.planning.plan import HIGH_PRECISION, PrecisionPlan, as_plan
from fp8mp.planning.plan_changes import PlanChanges
from fp8mp.planning.plan_precision import plan_precision

__all__ = ["replan", "torch_view"]

logger = logging.getLogger("fp8mp")


@contextlib.contextmanager
def torch_view(model: torch.nn.Module):
    """Within the block, `model` holds torch twins of its fp8mp modules (sharing parameters); afterwards the same
    fp8mp module objects are back in their places (module docstring, "Memory")."""
    if isinstance(model, FP8_MODULES):
        raise TypeError(f"replan: argument 'model' is itself an fp8mp module ({type(model).__name__}); give the model "
                        "that holds it, so that its layers can be swapped in place")
    swapped = []  # (parent, child name, fp8mp module)
    try:
        for parent in list(model.modules()):
            for child_name, child in list(parent.named_children()):
                if isinstance(child, FP8_MODULES):
                    twin = child.to_torch()
                    twin.train(child.training)
                    setattr(parent, child_name, twin)
                    swapped.append((parent, child_name, child))
        yield model
    finally:
        for parent, child_name, child in reversed(swapped):
            setattr(parent, child_name, child)


def replan(model: torch.nn.Module, batches, plan, loss_fn=None, candidates: dict | None = None,
           budget: float | None = None, **plan_precision_kwargs) -> tuple[PrecisionPlan, PlanChanges]:
    """Measure `model` (converted under `plan`) on `batches` again, make a new plan with `plan`'s candidates and
    budget, and apply only the layers whose choice changed to `model`, in place (module docstring).

    Args:
        model: the live model, its layers converted by `fp8mp.convert(model, plan=plan)` (fp8mp modules pinned to
            their recipes, "bf16" layers torch modules), on the device it trains on.
        batches: a few recent training batches, each what `loss_fn` takes (as for `plan_precision`).
        plan: the plan the model trains under: an `fp8mp.PrecisionPlan` or the path of its JSON.
        loss_fn: `loss_fn(model, batch) -> loss`; default `model(**batch).loss`.
        candidates: default `plan`'s candidates.
        budget: default `plan.budget` (the same loss change in loss units, not the same fraction of today's loss).
        **plan_precision_kwargs: passed on to `plan_precision` (`memory_first`, `progress`, `speed_cache`, ...).
    Returns:
        (new_plan, changes): the new plan, and the layers whose choice changed (`new_plan.changes_from(plan)`:
        a list of `LayerChange` that prints as a table). Each change is also logged on the "fp8mp" logger (INFO).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"replan: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    plan = as_plan(plan, "replan: argument 'plan'")
    if candidates is None:
        candidates = {name: recipe for name, recipe in plan.candidates.items() if name != HIGH_PRECISION}
    if budget is None:
        budget = plan.budget
    with torch_view(model):
        _check_architecture(model, plan)
        new_plan = plan_precision(model, batches, loss_fn=loss_fn, candidates=candidates, budget=budget,
                                  **plan_precision_kwargs)
    changes = new_plan.changes_from(plan)
    for change in changes:
        _apply(model, change.name, new_plan.choice(change.name))
        logger.info("fp8mp.replan: %s: %s -> %s: %s", change.name, change.old, change.new, change.why)
    if not changes:
        logger.info("fp8mp.replan: no layer changed its choice")
    return new_plan, changes


def _check_architecture(model: torch.nn.Module, plan: PrecisionPlan) -> None:
    """Refuse a plan made for another model, naming the layers that differ (as convert does)."""
    layers = convertible_layers(model)
    missing = [name for name in plan.architecture if name not in set(layers)]
    unseen = [name for name in layers if name not in set(plan.architecture)]
    if missing or unseen:
        raise ValueError(f"replan: argument 'plan' was made for another model: it plans {missing} which argument "
                         f"'model' lacks, and never saw the model's {unseen}")


def _apply(model: torch.nn.Module, name: str, recipe) -> None:
    """Put layer `name` of `model` under `recipe` (None: high precision), in place, its parameters kept."""
    parent_name, _, child_name = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    module = getattr(parent, child_name)
    if isinstance(module, Fp8Module):
        if recipe is None:
            new = module.to_torch()
        else:
            module.fp8_recipe = recipe
            module.fp8_meta.configure(recipe)
            module.fp8_meta.reset_scaling()
            return
    elif recipe is None:
        return  # high precision already
    else:
        new = convert(module, recipe=recipe)
    new.train(module.training)
    setattr(parent, child_name, new)
