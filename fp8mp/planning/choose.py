"""The choice: per layer the fastest candidate such that the plan's summed sensitivity stays within the budget.

Each layer ranks its options by preference:

    default        the FP8 candidates faster than high precision on this device, fastest first, then "bf16"
                   (a candidate slower than bf16 is no option: the layer stays in bf16 rather than run slower)
    memory_first   every FP8 candidate, fastest first, then "bf16" (FP8 even where slower: FP8 weights,
                   activations and gradients take half the memory)

Times are forward + backward milliseconds; times within TIME_TOLERANCE (10%) of the least count as equally fast,
and then the candidates' order decides (per-tensor first in the default candidates: the cheapest to run and to
keep), so that timing noise does not flip a choice between near-equal candidates. Every layer starts on its first
option. While the summed sensitivity (each layer's, under its current option; bf16's is 0) exceeds the budget,
the layer of largest sensitivity (ties: the earlier layer) moves down its list to the next option of lower
sensitivity: a worst offender is fixed first, at the smallest loss of speed its list allows. bf16 ends every list,
so the loop ends. A candidate without a finite sensitivity is no option. Everything here is deterministic: the same
evidence gives the same choice.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["LayerOptions", "choose", "HIGH_PRECISION", "TIME_TOLERANCE"]

HIGH_PRECISION = "bf16"
TIME_TOLERANCE = 0.1  # times within 10% of each other are equally fast: the candidates' order decides


@dataclasses.dataclass
class LayerOptions:
    """One layer's evidence as the choice reads it.

    Attributes:
        name: the layer's name.
        sensitivity: candidate -> sensitivity (>= 0; loss units).
        time_ms: candidate or "bf16" -> forward + backward milliseconds (a missing one counts as unmeasured: then
            only memory_first plans it in FP8).
    """

    name: str
    sensitivity: dict[str, float]
    time_ms: dict[str, float]


def _preference(layer: LayerOptions, candidates: list[str], memory_first: bool) -> list[str]:
    base = layer.time_ms.get(HIGH_PRECISION, math.inf)
    usable = [c for c in candidates if math.isfinite(layer.sensitivity.get(c, math.nan))]
    if not memory_first:
        usable = [c for c in usable if layer.time_ms.get(c, math.inf) < base]
    ordered = []
    while usable:  # the fastest next, where "fastest" is anything within TIME_TOLERANCE of the least time
        least = min(layer.time_ms.get(c, math.inf) for c in usable)
        pick = next(c for c in usable if layer.time_ms.get(c, math.inf) <= least * (1.0 + TIME_TOLERANCE))
        ordered.append(pick)
        usable.remove(pick)
    return [*ordered, HIGH_PRECISION]


def _sensitivity(layer: LayerOptions, option: str) -> float:
    return 0.0 if option == HIGH_PRECISION else layer.sensitivity[option]


def _speed_up(layer: LayerOptions, option: str) -> str:
    base, mine = layer.time_ms.get(HIGH_PRECISION), layer.time_ms.get(option)
    return f"{base / mine:.2f}x bf16's speed" if base and mine else "speed unmeasured"


def choose(layers: list[LayerOptions], candidates: list[str], budget: float | None,
           memory_first: bool = False) -> list[tuple[str, str]]:
    """(choice, reason) per layer, in order (module docstring). `budget` None: no bound on the summed sensitivity."""
    lists = [_preference(layer, candidates, memory_first) for layer in layers]
    at = [0] * len(layers)
    moved: list[list[str]] = [[] for _ in layers]
    total = sum(_sensitivity(layer, lists[i][0]) for i, layer in enumerate(layers))
    while budget is not None and total > budget:
        worst = max(range(len(layers)), key=lambda i: (_sensitivity(layers[i], lists[i][at[i]]), -i))
        current = _sensitivity(layers[worst], lists[worst][at[worst]])
        if current <= 0.0:
            break  # nothing left to lower (a negative budget)
        step = next(j for j in range(at[worst] + 1, len(lists[worst]))
                    if _sensitivity(layers[worst], lists[worst][j]) < current)
        moved[worst].append(f"{lists[worst][at[worst]]} ({current:.3g})")
        at[worst] = step
        total += _sensitivity(layers[worst], lists[worst][step]) - current
    return [(lists[i][at[i]], _reason(layer, lists[i], at[i], moved[i], memory_first, candidates))
            for i, layer in enumerate(layers)]


def _reason(layer: LayerOptions, options: list[str], at: int, moved: list[str], memory_first: bool,
            candidates: list[str]) -> str:
    choice = options[at]
    over = f"over budget: {', '.join(moved)}; " if moved else ""
    if choice != HIGH_PRECISION:
        rank = "fastest" if at == 0 else "fastest within budget"
        first = "memory-first: " if memory_first else ""
        return f"{first}{over}{rank} FP8 candidate, {_speed_up(layer, choice)}"
    if moved:
        return f"{over}no FP8 candidate fits the budget"
    measured = [c for c in candidates if math.isfinite(layer.sensitivity.get(c, math.nan))]
    if not measured:
        return "no FP8 candidate measured (layer not called by the calibration batches, or no finite result)"
    best = min(measured, key=lambda c: (layer.time_ms.get(c, math.inf), candidates.index(c)))
    return f"FP8 slower than bf16 on this device (fastest: {best}, {_speed_up(layer, best)})"
