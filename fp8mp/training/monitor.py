"""`Fp8Monitor`: per-layer, per-step FP8 numerics of a model's fp8mp.nn.Linear (and Conv1D) layers.

Usage::

    monitor = fp8mp.monitor.attach(model, every=10)   # hooks on every fp8mp.nn.Linear
    for step in range(steps):
        with fp8mp.fp8_autocast():
            loss = model(x).sum()
        loss.backward()
        monitor.record_step()                        # one row per layer on recorded steps
    print(monitor.summary()); monitor.plot("out/"); monitor.to_csv("out/fp8.csv")

Each recorded row holds the layer's amaxes and scales (its Fp8Meta buffers) and
the fraction of the input and of grad_output that the casts saturated or
flushed to zero (see `fp8mp.cast_stats`). On steps that are not recorded the
hooks return at once; `detach()` removes them.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
from dataclasses import dataclass
from typing import Iterator

import torch

from fp8mp.scaling import autocast as autocast_state
from fp8mp.training.cast_stats import CastCounts, count_cast_losses
from fp8mp.scaling.fp8_meta import GRAD, INPUT, WEIGHT
from fp8mp.nn.fp8_module import Fp8Module

__all__ = ["Fp8Monitor", "LayerStep", "attach"]


@dataclass(frozen=True)
class LayerStep:
    """One fp8mp layer at one recorded step. Fractions are in [0, 1]; NaN where nothing was measured."""

    step: int
    layer: str
    amax_input: float
    amax_weight: float
    amax_grad: float
    scale_input: float
    scale_weight: float
    scale_grad: float
    saturated_input: float
    flushed_input: float
    saturated_grad: float
    flushed_grad: float


class Fp8Monitor:
    """Records FP8 numerics of every FP8 module (fp8mp.nn.Fp8Module: Linear, Conv1D) in `model`, every `every` steps.

    Args:
        model: a module containing at least one FP8 module.
        every: int >= 1; steps 0, every, 2*every, ... are recorded (a step ends at `record_step()`).
        grads: also count saturation/underflow of grad_output (keeps each layer's output
            gradient until the layer's next forward or `record_step()`, on recorded steps only).
    """

    def __init__(self, model: torch.nn.Module, every: int = 1, grads: bool = True):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"Fp8Monitor: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"Fp8Monitor: argument 'every' must be an int >= 1, got {every!r}")
        self.layers = {name or "<model>": m for name, m in model.named_modules() if isinstance(m, Fp8Module)}
        if not self.layers:
            raise ValueError("Fp8Monitor: argument 'model' has no FP8 modules (fp8mp.nn.Linear, Conv1D, ...) to monitor")
        self.every, self.grads = every, grads
        self.step = 0
        self.paused = False
        self.records: list[LayerStep] = []
        self._input_counts: dict[str, CastCounts] = {}
        self._grad_counts: dict[str, CastCounts] = {}
        self._pending_grads: dict[str, list[torch.Tensor]] = {}
        self._handles = []
        for name, module in self.layers.items():
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(module.register_forward_hook(self._post_hook(name), with_kwargs=True))

    @property
    def armed(self) -> bool:
        """True when the current step is recorded (hooks attached, not paused, step a multiple of `every`)."""
        return bool(self._handles) and not self.paused and self.step % self.every == 0

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Forwards inside the block are not counted (e.g. evaluation between training steps)."""
        previous, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = previous

    def _pre_hook(self, name: str):
        def hook(module, args):
            # The last backward's grad scale is still in the buffers until this forward replaces it.
            if name in self._pending_grads:
                self._count_pending_grads(name)

        return hook

    def _post_hook(self, name: str):
        def hook(module, args, kwargs, output):
            if not self.armed or not autocast_state.is_fp8_enabled():
                return
            meta = module.fp8_meta  # after the forward, scale[INPUT] is the scale the input was cast with
            x = args[0] if args else kwargs["input"]
            counts = count_cast_losses(x, meta.scale[INPUT], meta.format_of(INPUT))
            self._input_counts[name] = self._input_counts.get(name, CastCounts()) + counts
            if self.grads and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._pending_grads.setdefault(name, []).append(grad.detach()))

        return hook

    def _count_pending_grads(self, name: str) -> None:
        meta = self.layers[name].fp8_meta
        for grad in self._pending_grads.pop(name):
            counts = count_cast_losses(grad, meta.scale[GRAD], meta.format_of(GRAD))
            self._grad_counts[name] = self._grad_counts.get(name, CastCounts()) + counts

    def record_step(self) -> list[LayerStep]:
        """End the step: on recorded steps, append and return one row per layer that ran in FP8."""
        rows = []
        if self.armed:
            for name in list(self._pending_grads):
                self._count_pending_grads(name)
            rows = [self._row(name) for name in self.layers if name in self._input_counts]
            self.records.extend(rows)
        self._input_counts.clear()
        self._grad_counts.clear()
        self._pending_grads.clear()
        self.step += 1
        return rows

    def _row(self, name: str) -> LayerStep:
        meta = self.layers[name].fp8_meta
        amax, scale = meta.amax.tolist(), meta.scale.tolist()
        inp, grad = self._input_counts[name], self._grad_counts.get(name, CastCounts())
        return LayerStep(
            self.step, name, amax[INPUT], amax[WEIGHT], amax[GRAD], scale[INPUT], scale[WEIGHT], scale[GRAD],
            inp.saturated_fraction, inp.flushed_fraction, grad.saturated_fraction, grad.flushed_fraction,
        )

    def detach(self) -> None:
        """Remove the hooks; the records stay."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def history(self, layer: str, field: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one LayerStep `field` for `layer`, in step order."""
        if layer not in self.layers:
            raise KeyError(f"Fp8Monitor.history: argument 'layer' {layer!r} is not a monitored layer")
        if field not in _FIELDS:
            raise KeyError(f"Fp8Monitor.history: argument 'field' must be one of {_FIELDS}, got {field!r}")
        rows = [r for r in self.records if r.layer == layer]
        return [r.step for r in rows], [getattr(r, field) for r in rows]

    def summary(self) -> str:
        """A plain-text table, one line per layer: newest amaxes and input scale, worst and mean losses."""
        return format_summary(self.records, list(self.layers))

    def to_csv(self, path) -> str:
        """Write every record as a CSV row (header = LayerStep's fields); returns the path."""
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(_FIELDS)
            writer.writerows(dataclasses.astuple(r) for r in self.records)
        return str(path)

    def plot(self, directory) -> list[str]:
        """Write amax.png and cast_losses.png under `directory`; returns their paths."""
        from fp8mp.training.monitor_plot import plot_monitor  # matplotlib only when plotting

        return plot_monitor(self, directory)


_FIELDS = tuple(f.name for f in dataclasses.fields(LayerStep))


def attach(model: torch.nn.Module, every: int = 1, grads: bool = True) -> Fp8Monitor:
    """Shorthand for `Fp8Monitor(model, every, grads)`."""
    return Fp8Monitor(model, every=every, grads=grads)


def _pct(values: list[float], reduce) -> str:
    finite = [v for v in values if not math.isnan(v)]
    return f"{100 * reduce(finite):.3f}" if finite else "-"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def format_summary(records: list[LayerStep], layers: list[str]) -> str:
    """The table of `Fp8Monitor.summary` for `records` (layers in the given order, unrecorded ones skipped)."""
    header = ("layer", "steps", "amax in", "amax w", "amax grad", "scale in", "sat in max%", "flush in mean%", "sat grad max%", "flush grad mean%")
    lines = []
    for layer in layers:
        rows = [r for r in records if r.layer == layer]
        if not rows:
            continue
        last = rows[-1]
        lines.append((
            layer, str(len(rows)), f"{last.amax_input:.4g}", f"{last.amax_weight:.4g}", f"{last.amax_grad:.3g}",
            f"{last.scale_input:.4g}",
            _pct([r.saturated_input for r in rows], max), _pct([r.flushed_input for r in rows], _mean),
            _pct([r.saturated_grad for r in rows], max), _pct([r.flushed_grad for r in rows], _mean),
        ))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    return "\n".join([fmt(header), *map(fmt, lines)])
