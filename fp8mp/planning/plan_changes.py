"""What changed between two plans of the same model: per layer whose choice differs, the old and the new choice
and the evidence that moved (`PrecisionPlan.changes_from`, what `fp8mp.replan` reports).

The evidence compared is the old choice's, before and after: its output SQNR, its sensitivity (the estimated loss
change of that layer alone in FP8), and the layer's input range in binades. That is what made the old choice no
longer fit (or, for a layer leaving "bf16", what made an FP8 recipe fit again).
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["LayerChange", "PlanChanges", "plan_changes"]

HIGH_PRECISION = "bf16"  # plan.HIGH_PRECISION (plan.py imports this module, so this one cannot import plan.py)


@dataclasses.dataclass(frozen=True)
class LayerChange:
    """One layer whose plan changed.

    Attributes:
        name: the module's name.
        old: the old choice (a candidate name or "bf16").
        new: the new choice.
        why: one line: the evidence that moved, e.g. "range 3.1 -> 16.2 binades; delayed: SQNR y 31.0 -> 9.8 dB,
            sensitivity 2.1e-05 -> 0.0042 (budget 0.0035)", then the new plan's reason.
        before: the old plan's evidence for the layer (a dict, as in `LayerPlan.evidence`).
        after: the new plan's evidence for the layer.
    """

    name: str
    old: str
    new: str
    why: str
    before: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    after: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)


class PlanChanges(list):
    """A list of LayerChange that prints as a short table (layer, old -> new, why)."""

    def __str__(self) -> str:
        if not self:
            return "no layer changed its choice"
        rows = [("layer", "old -> new", "why")] + [(c.name, f"{c.old} -> {c.new}", c.why) for c in self]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        lines = [f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}" for row in rows]
        return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])

    def __repr__(self) -> str:
        return f"PlanChanges({list.__repr__(self)})"


def plan_changes(old, new) -> PlanChanges:
    """The layers whose choice differs between plan `old` and plan `new` (in `new`'s layer order), each with the
    evidence that moved. A layer only one plan holds is reported as moving from (or to) "bf16", which is what a
    plan that does not name a layer means to `convert`. A layer whose candidate name stays but whose recipe object
    differs (a candidate edited by hand) is reported too."""
    old_layers = {layer.name: layer for layer in old.layers}
    new_layers = {layer.name: layer for layer in new.layers}
    changes = PlanChanges()
    for name in [*new_layers, *[n for n in old_layers if n not in new_layers]]:
        before, after = old_layers.get(name), new_layers.get(name)
        old_choice = before.choice if before is not None else HIGH_PRECISION
        new_choice = after.choice if after is not None else HIGH_PRECISION
        same_recipe = (old.candidates.get(old_choice) == new.candidates.get(new_choice))
        if old_choice == new_choice and same_recipe:
            continue
        old_evidence = before.evidence if before is not None else {}
        new_evidence = after.evidence if after is not None else {}
        why = _why(old_choice, new_choice, old_evidence, new_evidence, new.budget)
        if old_choice == new_choice:
            why = f"recipe of candidate {new_choice!r} changed; " + why
        if after is not None and after.reason:
            why = f"{why} ({after.reason})" if why else after.reason
        changes.append(LayerChange(name, old_choice, new_choice, why, dict(old_evidence), dict(new_evidence)))
    return changes


def _why(old_choice: str, new_choice: str, before: dict, after: dict, budget) -> str:
    """The evidence that moved: the input range, then the old choice's SQNR and sensitivity (or, leaving "bf16",
    the new choice's), before -> after."""
    parts = []
    range_text = _arrow(before.get("range_binades"), after.get("range_binades"), ".1f")
    if range_text:
        parts.append(f"range {range_text} binades")
    judged = old_choice if old_choice != HIGH_PRECISION else new_choice
    if judged != HIGH_PRECISION:
        detail = []
        sqnr = _arrow(_sqnr(before, judged), _sqnr(after, judged), ".1f")
        if sqnr:
            detail.append(f"SQNR y {sqnr} dB")
        sensitivity = _arrow(before.get("sensitivity", {}).get(judged), after.get("sensitivity", {}).get(judged), ".3g")
        if sensitivity:
            budget_text = f" (budget {budget:.3g})" if _number(budget) else ""
            detail.append(f"sensitivity {sensitivity}{budget_text}")
        if detail:
            parts.append(f"{judged}: " + ", ".join(detail))
    return "; ".join(parts)


def _sqnr(evidence: dict, choice: str):
    entry = evidence.get("sqnr_db", {}).get(choice)
    return entry.get("output") if isinstance(entry, dict) else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _arrow(before, after, spec: str) -> str:
    """"a -> b" for two numbers, "? -> b" or "a -> ?" where one is missing, "" where both are."""
    if not _number(before) and not _number(after):
        return ""

    def text(value):
        if not _number(value):
            return "?"
        return "inf" if math.isinf(value) else f"{value:{spec}}"

    return f"{text(before)} -> {text(after)}"
