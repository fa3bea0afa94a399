"""Matplotlib pictures of an `Fp8Monitor`'s records.

matplotlib is an optional dependency (`pip install 'fp8mp[plot]'`), imported when plotting.
Figures are drawn with `matplotlib.figure.Figure`, not pyplot: no backend is switched and no
global figure state is touched.
"""
from __future__ import annotations

import math
import os

AMAX_PANELS = (("amax_input", "input"), ("amax_weight", "weight"), ("amax_grad", "grad_output"))
LOSS_PANELS = (
    ("saturated_input", "input saturated %"),
    ("saturated_grad", "grad_output saturated %"),
    ("flushed_input", "input flushed to zero %"),
    ("flushed_grad", "grad_output flushed to zero %"),
)


def _matplotlib():
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError as error:
        raise ImportError("Fp8Monitor.plot draws with matplotlib, which is not installed: "
                          "pip install 'fp8mp[plot]' (or pip install matplotlib)") from error
    return matplotlib


def _draw(ax, monitor, field: str, title: str, percent: bool, log: bool) -> None:
    colors = _matplotlib().colormaps["tab20"]
    for i, layer in enumerate(monitor.layers):
        steps, values = monitor.history(layer, field)
        if percent:
            values = [100 * v for v in values]
        if steps and not all(math.isnan(v) for v in values):
            ax.plot(steps, values, label=layer, linewidth=1, color=colors(i % 20))
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    if log and any(line.get_ydata().size and (line.get_ydata() > 0).any() for line in ax.get_lines()):
        ax.set_yscale("log")


def _save(fig, axes, path: str) -> str:
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center right", fontsize=6, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.84, 1))
    fig.savefig(path, dpi=110)
    return path


def plot_monitor(monitor, directory) -> list[str]:
    """amax.png (amax per layer over steps, log scale) and cast_losses.png (saturated / flushed %)."""
    figure = _matplotlib().figure.Figure
    os.makedirs(directory, exist_ok=True)
    fig = figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    for ax, (field, title) in zip(axes, AMAX_PANELS):
        _draw(ax, monitor, field, f"amax of {title}", percent=False, log=True)
    paths = [_save(fig, list(axes), os.path.join(directory, "amax.png"))]
    fig = figure(figsize=(11, 6.5))
    axes = fig.subplots(2, 2)
    for ax, (field, title) in zip(axes.flat, LOSS_PANELS):
        _draw(ax, monitor, field, title, percent=True, log=False)
    paths.append(_save(fig, list(axes.flat), os.path.join(directory, "cast_losses.png")))
    return paths
