"""accelerate: an existing `Accelerator` script trains in FP8 with one added line and two changed ones::

    import fp8mp.integrations.accelerate as fp8_accelerate                                  # added
    accelerator = Accelerator(mixed_precision="bf16")
    model, optimizer, loader = fp8_accelerate.prepare(accelerator, model, optimizer, loader)   # was accelerator.prepare
    for x, y in loader:
        with fp8_accelerate.autocast(accelerator):                                            # was accelerator.autocast()
            loss = loss_fn(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()                      # skipped when a gradient or an FP8 cast met an Inf/NaN
        optimizer.zero_grad()
    accelerator.save_state(folder)            # FP8 scaling buffers (in the model's weights), optimizer, loss scaler
    accelerator.load_state(folder)

`prepare` converts every torch module among its arguments (`fp8mp.convert`, before accelerate wraps it) and installs
fp8mp's `LossScaler` as `accelerator.scaler`, so that accelerate's own `backward`, optimizer `step`
(`optimizer.step_was_skipped`), `save_state` and `load_state` go through it. Under `mixed_precision="fp16"` it scales
dynamically (accelerate unscales before `clip_grad_norm_`); otherwise its scale stays 1 (bf16 needs no loss scaling,
and accelerate unscales only under fp16), and it only skips the steps whose gradients or FP8 casts met an Inf/NaN.
`autocast` is `accelerator.autocast()` around `fp8mp.fp8_autocast` with the data-parallel group (WORLD when accelerate
runs 2+ processes), so every rank computes the same scales.

accelerate's own FP8 (`mixed_precision="fp8"`: Transformer Engine, MS-AMP, torchao) replaces the same layers:
`prepare` refuses it. accelerate is imported by nothing here (the Accelerator passed in is used as it is).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

from fp8mp.nn.conversion import ModuleFilter, convert
from fp8mp.planning.plan import PrecisionPlan, as_plan
from fp8mp.scaling.autocast import fp8_autocast
from fp8mp.scaling.recipe import Recipe
from fp8mp.training.loss_scaler import LossScaler

__all__ = ["prepare", "autocast"]

# A scale of 1 that never grows: unscaling is exact, only the Inf/NaN skip acts.
_SKIP_ONLY = dict(init_scale=1.0, min_scale=1.0, growth_interval=2 ** 62)


def _check_accelerator(accelerator, function: str) -> None:
    if not all(hasattr(accelerator, name) for name in ("prepare", "autocast", "mixed_precision", "num_processes")):
        raise TypeError(f"fp8mp.integrations.accelerate.{function}: argument 'accelerator' must be an "
                        f"accelerate.Accelerator, got {type(accelerator).__name__}")
    if accelerator.mixed_precision == "fp8" or getattr(accelerator, "fp8_backend", None) not in (None, "NO"):
        backend = getattr(accelerator, "fp8_backend", None)
        raise ValueError(f"fp8mp.integrations.accelerate.{function}: argument 'accelerator' asks accelerate for its own "
                         f"FP8 (mixed_precision={accelerator.mixed_precision!r}, fp8_backend={backend!r}), which would "
                         "replace the layers fp8mp converts; create it with mixed_precision=\"bf16\" (or \"fp16\", "
                         "\"no\") and let fp8mp do the FP8")


def data_parallel_group(accelerator):
    """The process group fp8_autocast reduces amaxes over: WORLD when accelerate runs 2+ processes, else None."""
    return torch.distributed.group.WORLD if accelerator.num_processes > 1 else None


def prepare(accelerator, *objects: Any, recipe: Recipe | None = None, module_filter: ModuleFilter | None = None,
            frozen_weights: str | None = None, fp8_saved_activations: bool = False,
            loss_scaler: LossScaler | None = None, plan: PrecisionPlan | str | os.PathLike | None = None):
    """Convert the torch modules among `objects` (in place), install fp8mp's loss scaler, then
    `accelerator.prepare(*objects)`; returns what that returns.

    Args:
        accelerator: an `accelerate.Accelerator` created with mixed_precision "no", "bf16" or "fp16".
        objects: what you would pass to `accelerator.prepare` (models, optimizers, data loaders, schedulers).
        recipe, module_filter, frozen_weights, fp8_saved_activations: `fp8mp.convert`'s options.
        plan: an fp8mp.PrecisionPlan or the path of its JSON, `fp8mp.convert`'s `plan` (each planned layer pinned
            to its recipe; refused beside recipe and module_filter, which it replaces). With a plan, give the
            models among `objects` one at a time: a plan fits one architecture.
        loss_scaler: an fp8mp.LossScaler; None: dynamic `LossScaler()` under fp16, a scale held at 1 otherwise.
    """
    _check_accelerator(accelerator, "prepare")
    if loss_scaler is not None and not isinstance(loss_scaler, LossScaler):
        raise TypeError("fp8mp.integrations.accelerate.prepare: argument 'loss_scaler' must be an fp8mp.LossScaler or "
                        f"None, got {type(loss_scaler).__name__}")
    options = dict(frozen_weights=frozen_weights, fp8_saved_activations=fp8_saved_activations)
    if plan is not None:
        plan = as_plan(plan, "fp8mp.integrations.accelerate.prepare: argument 'plan'")
        if recipe is not None or module_filter is not None:
            raise ValueError("fp8mp.integrations.accelerate.prepare: argument 'plan' gives each layer its recipe; pass "
                             "it without 'recipe' and 'module_filter' (edit the plan instead)")
        options["plan"] = plan
    else:
        options.update(recipe=recipe, module_filter=module_filter)
    objects = tuple(convert(obj, **options) if isinstance(obj, torch.nn.Module) else obj for obj in objects)
    if loss_scaler is not None:
        accelerator.scaler = loss_scaler
    elif not isinstance(accelerator.scaler, LossScaler):
        accelerator.scaler = LossScaler() if accelerator.mixed_precision == "fp16" else LossScaler(**_SKIP_ONLY)
    return accelerator.prepare(*objects)


@contextlib.contextmanager
def autocast(accelerator, recipe: Recipe | None = None) -> Iterator[None]:
    """`accelerator.autocast()` around `fp8mp.fp8_autocast(recipe, fp8_group=the data-parallel group)`.

    recipe: for modules without a pinned recipe (`prepare(recipe=...)` pins one); None: DelayedScaling().
    """
    _check_accelerator(accelerator, "autocast")
    with accelerator.autocast(), fp8_autocast(enabled=True, fp8_recipe=recipe, fp8_group=data_parallel_group(accelerator)):
        yield
