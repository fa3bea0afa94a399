"""What `convert(model, plan=...)` reads from a plan: each planned layer's recipe, checked against the model.

A plan is anything with `layer_recipes()` (name -> recipe, or None for high precision) and `architecture` (the
names of every layer convert would touch in the model it was made for): an `fp8mp.PrecisionPlan`, duck typed,
since fp8mp.planning sits above this layer. A plain dict name -> recipe-or-None is a plan without an
architecture. Nothing matches silently: an entry naming no layer convert would touch, and a plan made for a model
whose layers differ, are refused with the names.
"""
from __future__ import annotations

from fp8mp.scaling.autocast import validate_recipe

__all__ = ["planned_recipes"]

_SHOWN = 8  # names listed in an error before "and N more"


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def planned_recipes(plan, convertible: list[str], fp8_modules: list[str]) -> dict[str, object | None]:
    """name -> recipe (None: keep in high precision) for each layer `plan` names, checked.

    Args:
        plan: a PrecisionPlan (anything with `layer_recipes()` and `architecture`) or a dict name -> recipe-or-None.
        convertible: the names of the layers convert would touch in the model (module_filter aside).
        fp8_modules: the names of the model's modules that are fp8mp modules already (named in the errors).
    """
    if isinstance(plan, dict):
        recipes, architecture = dict(plan), None
    elif callable(getattr(plan, "layer_recipes", None)) and hasattr(plan, "architecture"):
        recipes, architecture = plan.layer_recipes(), list(plan.architecture)
        if not isinstance(recipes, dict):
            raise TypeError(f"argument 'plan': layer_recipes() must return a dict, got {type(recipes).__name__}")
    else:
        raise TypeError("argument 'plan' must be an fp8mp.PrecisionPlan (or an object with layer_recipes() and "
                        f"architecture) or a dict name -> recipe or None, got {type(plan).__name__}")
    for name, recipe in recipes.items():
        if not isinstance(name, str):
            raise TypeError(f"argument 'plan': layer names must be str, got {name!r}")
        if recipe is not None:
            try:
                validate_recipe(recipe)
            except (TypeError, ValueError) as error:
                raise type(error)(f"argument 'plan': layer {name!r}: {error}") from None
    known = set(convertible)
    unknown = [name for name in recipes if name not in known]
    if unknown:
        already = [name for name in unknown if name in set(fp8_modules)]
        note = f" ({_names(already)} are fp8mp modules already: convert plans torch modules)" if already else ""
        raise ValueError(f"argument 'plan': the entries {_names(unknown)} match no layer convert would touch in this "
                         f"model{note}; the layers it would touch: {_names(convertible)}")
    if architecture is not None and set(architecture) != known:
        missing = [name for name in architecture if name not in known]
        extra = [name for name in convertible if name not in set(architecture)]
        raise ValueError("argument 'plan' was made for another model: "
                         + "; ".join(part for part in (
                             f"layers of the planned model this one lacks: {_names(missing)}" if missing else "",
                             f"layers of this model the plan never saw: {_names(extra)}" if extra else "") if part))
    return recipes
