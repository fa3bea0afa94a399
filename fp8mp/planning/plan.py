"""`PrecisionPlan`: which recipe each layer of a model trains under, why, and the evidence behind the choice.

A plan is data. It holds one `LayerPlan` per layer that `fp8mp.convert` would touch (named as in
`model.named_modules()`), the candidate recipes by name ("delayed", "current", "rowwise", "block", "mxfp8", or
any name a caller gives; "bf16" is high precision), and the names of every layer convert would touch in the
planned model (`architecture`), so that a plan applied to another model is refused. `fp8mp.convert(model,
plan=plan)` applies it; `print(plan)` is its table, `plan.plot(path)` its picture, and `plan.save(path)` /
`PrecisionPlan.load(path)` its JSON, written for a person to read and edit (change a layer's "choice" to another
candidate's name, or "bf16"). Recipes are treated as opaque objects keyed by their candidate name: nothing here
asks a recipe's type.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os

from fp8mp.planning.plan_changes import PlanChanges, plan_changes
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, RowwiseScaling
from fp8mp.scaling.recipe_json import recipe_from_dict, recipe_to_dict
from fp8mp.scaling.recipe_registry import is_recipe

__all__ = ["CANDIDATE_NAMES", "HIGH_PRECISION", "LayerPlan", "PrecisionPlan", "as_plan", "default_candidates"]

CANDIDATE_NAMES = ("delayed", "current", "rowwise", "block", "mxfp8")
HIGH_PRECISION = "bf16"  # the choice that keeps a layer as it is (its parameters' dtype, under torch.autocast's)
FORMAT = "fp8mp.PrecisionPlan"
VERSION = 1
_TOP_KEYS = ("format", "version", "device", "budget", "architecture", "candidates", "layers", "notes")
_LAYER_KEYS = ("name", "kind", "shape", "flop_share", "choice", "reason", "evidence")


def default_candidates() -> dict[str, object]:
    """Every recipe fp8mp has, with its defaults, under its candidate name (CANDIDATE_NAMES)."""
    return {"delayed": DelayedScaling(), "current": CurrentScaling(), "rowwise": RowwiseScaling(),
            "block": BlockScaling(), "mxfp8": MXFP8Scaling()}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass
class LayerPlan:
    """One layer's plan.

    Attributes:
        name: the module's name in `model.named_modules()`.
        kind: its class name (Linear, Conv1D, GroupedLinear, ...).
        shape: {"in_features": K, "out_features": N, "tokens": M (per calibration batch)}.
        flop_share: its share of the model's GEMM FLOPs, 0..1.
        choice: a candidate name, or "bf16" (kept in high precision).
        reason: one line: why.
        evidence: {"sqnr_db": {candidate: {"output", "grad_input", "grad_weight"}}, "range_binades": float,
            "sensitivity": {candidate: float}, "measured_loss_change": {candidate: float} (optional),
            "time_ms": {candidate or "bf16": {"forward", "backward"}}}; any part may be missing.
    """

    name: str
    kind: str
    shape: dict
    flop_share: float
    choice: str
    reason: str = ""
    evidence: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"LayerPlan: field 'name' must be a module name (str), got {self.name!r}")
        where = f"LayerPlan {self.name!r}: field"
        for key in ("kind", "choice", "reason"):
            if not isinstance(getattr(self, key), str):
                raise TypeError(f"{where} '{key}' must be a str, got {getattr(self, key)!r}")
        for key in ("shape", "evidence"):
            if not isinstance(getattr(self, key), dict):
                raise TypeError(f"{where} '{key}' must be a dict, got {getattr(self, key)!r}")
        if not _is_number(self.flop_share) or not 0.0 <= self.flop_share <= 1.0:
            raise ValueError(f"{where} 'flop_share' must be a number in [0, 1], got {self.flop_share!r}")


class PrecisionPlan:
    """Which recipe each layer trains under (see the module docstring).

    Args:
        layers: one LayerPlan per planned layer (names unique, each in `architecture`).
        candidates: candidate name -> recipe object (a "bf16" entry, if any, must be None).
        budget: the loss change the plan was allowed to cost (None: unbounded).
        device: what the plan was measured on (e.g. "NVIDIA H100 80GB HBM3", "cpu").
        architecture: the names of every module convert would touch in the planned model.
        notes: anything else worth keeping with the plan (JSON values).
    """

    def __init__(self, layers: list[LayerPlan], candidates: dict[str, object], *, budget: float | None, device: str,
                 architecture: list[str], notes: dict | None = None):
        if not isinstance(layers, (list, tuple)) or not all(isinstance(layer, LayerPlan) for layer in layers):
            raise TypeError(f"PrecisionPlan: argument 'layers' must be a list of LayerPlan, got {layers!r}")
        if not isinstance(candidates, dict) or not all(isinstance(name, str) for name in candidates):
            raise TypeError(f"PrecisionPlan: argument 'candidates' must be a dict name -> recipe, got {candidates!r}")
        for name, recipe in candidates.items():
            if name == HIGH_PRECISION and recipe is not None:
                raise ValueError(f"PrecisionPlan: argument 'candidates': {HIGH_PRECISION!r} is high precision; its "
                                 f"entry must be None, got {recipe!r}")
            if name != HIGH_PRECISION and not is_recipe(recipe):
                raise TypeError(f"PrecisionPlan: argument 'candidates': {name!r} must be an fp8mp recipe, got "
                                f"{type(recipe).__name__}")
        if budget is not None and (not _is_number(budget) or math.isnan(budget)):
            raise TypeError(f"PrecisionPlan: argument 'budget' must be a number or None, got {budget!r}")
        if not isinstance(device, str):
            raise TypeError(f"PrecisionPlan: argument 'device' must be a str, got {device!r}")
        if isinstance(architecture, str) or not isinstance(architecture, (list, tuple)) or not all(
                isinstance(name, str) for name in architecture):
            raise TypeError(f"PrecisionPlan: argument 'architecture' must be a list of module names, got {architecture!r}")
        if notes is not None and not isinstance(notes, dict):
            raise TypeError(f"PrecisionPlan: argument 'notes' must be a dict or None, got {notes!r}")
        by_name: dict[str, LayerPlan] = {}
        for layer in layers:
            if layer.name in by_name:
                raise ValueError(f"PrecisionPlan: argument 'layers' plans {layer.name!r} twice")
            if layer.choice != HIGH_PRECISION and layer.choice not in candidates:
                raise ValueError(f"PrecisionPlan: layer {layer.name!r} chooses {layer.choice!r}, which is no candidate; "
                                 f"choose one of {_choices(candidates)}")
            by_name[layer.name] = layer
        outside = [name for name in by_name if name not in set(architecture)]
        if outside:
            raise ValueError(f"PrecisionPlan: argument 'layers' plans {outside}, which argument 'architecture' lacks")
        self.layers = list(layers)
        self.candidates = dict(candidates)
        self.budget = budget
        self.device = device
        self.architecture = list(architecture)
        self.notes = dict(notes or {})
        self._by_name = by_name

    # ------------------------------------------------------------------------------------- choices
    def choice(self, name: str):
        """The recipe layer `name` trains under, or None where it stays in high precision."""
        layer = self._by_name.get(name)
        if layer is None:
            close = difflib.get_close_matches(str(name), list(self._by_name), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"PrecisionPlan has no layer {name!r}{hint}")
        return self.candidates.get(layer.choice) if layer.choice != HIGH_PRECISION else None

    def layer_recipes(self) -> dict[str, object | None]:
        """name -> recipe (None: high precision), for every planned layer: what `fp8mp.convert(plan=...)` reads."""
        return {layer.name: self.choice(layer.name) for layer in self.layers}

    def changes_from(self, other: "PrecisionPlan") -> PlanChanges:
        """The layers whose choice differs from plan `other` (the older one), each with the old and new choice and
        the evidence that moved; prints as a table (fp8mp/planning/plan_changes.py)."""
        return plan_changes(other, self)

    @property
    def fp8_flop_share(self) -> float:
        """The share of the model's GEMM FLOPs the plan runs in FP8."""
        return sum(layer.flop_share for layer in self.layers if layer.choice != HIGH_PRECISION)

    # ------------------------------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        """The plan as JSON values (what `save` writes)."""
        return {"format": FORMAT, "version": VERSION, "device": self.device, "budget": self.budget,
                "architecture": list(self.architecture),
                "candidates": {name: None if recipe is None else recipe_to_dict(recipe)
                               for name, recipe in self.candidates.items()},
                "layers": [dataclasses.asdict(layer) for layer in self.layers], "notes": self.notes}

    @classmethod
    def from_dict(cls, data, source: str = "plan") -> "PrecisionPlan":
        """The plan `data` describes (what `to_dict` returns); errors start with `source` and name the key."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: must be a JSON object, got {type(data).__name__}")
        _check_keys(source, data, _TOP_KEYS, required=_TOP_KEYS[:-1])
        if data["format"] != FORMAT or data["version"] != VERSION:
            raise ValueError(f"{source}: 'format' and 'version' must be {FORMAT!r} and {VERSION}, got "
                             f"{data['format']!r} and {data['version']!r}")
        if not isinstance(data["candidates"], dict):
            raise ValueError(f"{source}: 'candidates' must be an object name -> recipe, got {data['candidates']!r}")
        candidates = {name: None if name == HIGH_PRECISION and value is None
                      else recipe_from_dict(value, f"{source}: candidates.{name}")
                      for name, value in data["candidates"].items()}
        if not isinstance(data["layers"], list):
            raise ValueError(f"{source}: 'layers' must be a list of layer objects, got {data['layers']!r}")
        layers = []
        for index, entry in enumerate(data["layers"]):
            where = f"{source}: layers[{index}]" + (f" ({entry['name']!r})" if isinstance(entry, dict)
                                                    and "name" in entry else "")
            _check_keys(where, entry, _LAYER_KEYS, required=_LAYER_KEYS[:5])
            if entry["choice"] != HIGH_PRECISION and entry["choice"] not in candidates:
                raise ValueError(f"{where}: 'choice' {entry['choice']!r} is no candidate; choose one of "
                                 f"{_choices(candidates)}")
            try:
                layers.append(LayerPlan(**entry))
            except (TypeError, ValueError) as error:
                raise ValueError(f"{where}: {error}") from None
        try:
            return cls(layers, candidates, budget=data["budget"], device=data["device"],
                       architecture=data["architecture"], notes=data.get("notes"))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: {error}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as indented JSON (SQNRs of exact casts are written as Infinity, which Python reads)."""
        text = json.dumps(self.to_dict(), indent=1, default=_json_scalar)  # all or nothing: no half-written file
        with open(path, "w") as f:
            f.write(text + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PrecisionPlan":
        """The plan saved at `path` (possibly edited by hand), checked: errors name the file and what is wrong."""
        with open(path) as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{os.fspath(path)}: not JSON: {error}") from None
        return cls.from_dict(data, os.fspath(path))

    # ------------------------------------------------------------------------------------- the table
    def rows(self) -> list[list[str]]:
        """The table's rows as strings, header first (what `__str__` aligns)."""
        header = ["layer", "kind", "K x N", "M", "FLOPs", "choice", "SQNR dB y/dx/dW", "range", "sensitivity",
                  "speed-up", "why"]
        rows = [header]
        for layer in self.layers:
            shape, evidence, choice = layer.shape, layer.evidence, layer.choice
            sqnr = evidence.get("sqnr_db", {}).get(choice)
            sqnr_text = "/".join(_fmt(sqnr.get(k), ".1f") for k in ("output", "grad_input", "grad_weight")) if sqnr else "-"
            speed_up = _speed_up(evidence.get("time_ms", {}), choice)
            rows.append([layer.name, layer.kind, f"{shape.get('in_features', '?')} x {shape.get('out_features', '?')}",
                         str(shape.get("tokens", "-")), f"{100 * layer.flop_share:.1f}%", choice, sqnr_text,
                         _fmt(evidence.get("range_binades"), ".1f"),
                         _fmt(evidence.get("sensitivity", {}).get(choice), ".3g"),
                         "-" if speed_up is None else f"{speed_up:.2f}x", layer.reason])
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
        budget = "none" if self.budget is None else f"{self.budget:g}"
        title = (f"PrecisionPlan on {self.device}: {len(self.layers)} layers, {100 * self.fp8_flop_share:.1f}% of GEMM "
                 f"FLOPs in FP8, loss budget {budget}")
        return "\n".join([title, lines[0], "-" * len(lines[0]), *lines[1:]])

    def __repr__(self) -> str:
        return f"<PrecisionPlan: {len(self.layers)} layers on {self.device}, fp8_flop_share={self.fp8_flop_share:.3f}>"

    # ------------------------------------------------------------------------------------- the picture
    def plot(self, path: str | os.PathLike) -> str:
        """Draw each layer's sensitivity (top) and speed-up over bf16 (bottom) under every candidate, the chosen
        one ringed, into `path` (PNG, SVG, PDF: by its suffix). Needs matplotlib; returns the path."""
        try:
            from matplotlib.figure import Figure
        except ImportError as error:
            raise ImportError("PrecisionPlan.plot needs matplotlib: pip install matplotlib") from error
        names = [layer.name for layer in self.layers]
        figure = Figure(figsize=(max(6.0, 0.5 * len(names) + 2), 6.5), layout="constrained")
        top, bottom = figure.subplots(2, 1, sharex=True)
        x = range(len(names))
        for name in [c for c in self.candidates if c != HIGH_PRECISION]:
            sens = [layer.evidence.get("sensitivity", {}).get(name, math.nan) for layer in self.layers]
            speed = [_speed_up(layer.evidence.get("time_ms", {}), name) or math.nan for layer in self.layers]
            top.plot(x, sens, "o", label=name, alpha=0.8)
            bottom.plot(x, speed, "o", label=name, alpha=0.8)
        for i, layer in enumerate(self.layers):
            if layer.choice == HIGH_PRECISION:
                bottom.plot([i], [1.0], "kx", markersize=10)
                continue
            top.plot([i], [layer.evidence.get("sensitivity", {}).get(layer.choice, math.nan)], "o", mfc="none",
                     mec="k", markersize=13, mew=1.5)
            bottom.plot([i], [_speed_up(layer.evidence.get("time_ms", {}), layer.choice) or math.nan], "o",
                        mfc="none", mec="k", markersize=13, mew=1.5)
        top.set_yscale("symlog", linthresh=1e-6)
        top.set_ylabel("sensitivity (loss change)")
        top.set_title(f"{100 * self.fp8_flop_share:.0f}% of GEMM FLOPs in FP8 (ringed: chosen; x: kept in bf16)")
        top.legend(fontsize="small", ncols=3)
        bottom.axhline(1.0, color="grey", linewidth=0.8)
        bottom.set_ylabel("speed-up over bf16")
        bottom.set_xticks(list(x), names, rotation=60, ha="right", fontsize="small")
        figure.savefig(path)
        return os.fspath(path)


def as_plan(plan, argument: str = "argument 'plan'") -> PrecisionPlan:
    """`plan` itself when a PrecisionPlan, else the plan saved at that path; `argument` names it in errors."""
    if isinstance(plan, PrecisionPlan):
        return plan
    if isinstance(plan, (str, os.PathLike)):
        try:
            return PrecisionPlan.load(plan)
        except FileNotFoundError:
            raise FileNotFoundError(f"{argument}: no plan at {os.fspath(plan)!r}") from None
    raise TypeError(f"{argument} must be an fp8mp.PrecisionPlan or the path of its JSON, got {type(plan).__name__}")


def _check_keys(where: str, data, keys: tuple[str, ...], required: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a JSON object, got {data!r}")
    for key in data:
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{where}: unknown key {key!r}{hint}; valid keys: {', '.join(keys)}")
    missing = [key for key in required if key not in data]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")


def _json_scalar(value):
    """A numpy or torch scalar in the evidence, as the Python number JSON takes."""
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", 0) == 0:
        return value.item()
    raise TypeError(f"PrecisionPlan.save: {type(value).__name__} {value!r} in the plan is no JSON value")


def _choices(candidates: dict) -> str:
    return ", ".join(repr(name) for name in [*[c for c in candidates if c != HIGH_PRECISION], HIGH_PRECISION])


def _fmt(value, spec: str) -> str:
    return f"{value:{spec}}" if _is_number(value) else "-"


def _speed_up(times: dict, choice: str) -> float | None:
    """bf16's forward+backward time over `choice`'s, from evidence["time_ms"] (None where either is missing)."""
    def total(name):
        entry = times.get(name)
        values = [entry.get("forward"), entry.get("backward")] if isinstance(entry, dict) else []
        return sum(values) if values and all(_is_number(v) for v in values) else None

    base, mine = total(HIGH_PRECISION), total(choice)
    return base / mine if base is not None and mine else None
