"""What each candidate recipe does to each layer's numbers, measured on real calibration batches.

`capture_batch` runs the model once in high precision on one calibration batch, with a forward hook on every
planned layer: it keeps the layer's input x (as rows [M, K]) and the output, then takes the gradient of the loss
with respect to every kept output (`torch.autograd.grad`, so the model's own `.grad` stay untouched): the output
gradient g [M, N] each layer really sees. It also counts the forward's GEMM FLOPs (`FlopCounterMode`: matmuls,
and attention where torch has a formula for its kernel), so that each layer's FLOP share (2 M K N of its forward
over them) is a share of the model's; a backward runs two GEMMs of each forward GEMM's size, so the share of a
training step is the same wherever the weights train.

`LayerNumerics.add_call` then runs, for each candidate, the layer alone in FP8 (`fp8_probe`: an fp8mp module on the
layer's weights, under `fp8_autocast(fp8_recipe=candidate)`) forward on x and backward with g, and accumulates,
against the same GEMMs in fp32 (y = x W^T + b, dx = g W, dW = g^T x):

    SQNR (dB) of the output, the input gradient and the weight gradient:
        10 log10(sum ref^2 / sum (fp8 - ref)^2), the sums over every calibration batch
    the first-order (Taylor) loss change of the forward error: sum over the output of g * (y_fp8 - y)
    its empirical-Fisher second-order term: (M / 2) * sum over rows r of (g_r . (y_fp8 - y)_r)^2, the curvature
        of a loss averaged over M rows (tokens) with each row's loss reaching the layer through its own row;
        `sensitivity.py` turns both into the layer's estimated loss change
    the input's dynamic range in binades: log2(max|x| / median of the nonzero |x|), the largest over the batches:
        how many binades below the per-tensor maximum the typical value sits. E4M3 holds about 15 binades of
        normal numbers (448 down to 2^-6) and 3 more of subnormals with fewer bits: an input of 8 binades or
        more (planted or "massive" outlier channels) leaves the typical value few bits under one per-tensor scale.
        The median rather than the smallest value, since a few tiny values say nothing about what a scale loses.

The probes persist across batches (one per layer and candidate), so delayed scaling sees the amax history a
training run would: its first batch scales from the data, the next ones from the history.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from fp8mp.planning.layers import PlannedLayer, fp8_probe
from fp8mp.scaling.autocast import fp8_autocast

__all__ = ["capture_batch", "LayerNumerics", "sqnr_db", "range_binades"]

_MEDIAN_SAMPLE = 1 << 22  # elements of x the median reads at most (a fixed subsample beyond that)


def _layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["input"]


def capture_batch(model: torch.nn.Module, layers: list[PlannedLayer], batch, loss_fn: Callable,
                  count_flops: bool = False) -> tuple[float, dict[str, list[list]], int | None]:
    """(loss, calls, flops): the high-precision loss of `batch`, each layer's calls as [x2d, g2d or None] (a layer
    called twice in a forward has two), and the forward's GEMM FLOPs (None unless
    `count_flops`). See the module docstring."""
    calls: dict[str, list[list]] = {layer.name: [] for layer in layers}
    outputs: list[tuple[list, torch.Tensor]] = []

    def hook(name):
        def keep(module, args, kwargs, output):
            x = _layer_input(args, kwargs)
            entry = [x.detach().reshape(-1, x.shape[-1]), None]
            calls[name].append(entry)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                outputs.append((entry, output))
        return keep

    handles = [layer.module.register_forward_hook(hook(layer.name), with_kwargs=True) for layer in layers]
    flops = None
    try:
        counter = _flop_counter() if count_flops else None
        with counter if counter is not None else torch.enable_grad():
            loss = loss_fn(model, batch)
        if counter is not None:
            flops = counter.get_total_flops()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("argument 'loss_fn' must return the loss as a one-element tensor, got "
                            f"{type(loss).__name__}{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}")
        if outputs and loss.requires_grad:
            grads = torch.autograd.grad(loss, [out for _, out in outputs], allow_unused=True)
            for (entry, out), grad in zip(outputs, grads):
                entry[1] = None if grad is None else grad.detach().reshape(-1, out.shape[-1])
    finally:
        for handle in handles:
            handle.remove()
    return float(loss.detach()), calls, flops


def _flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) from summed squares; inf for an exact result, nan without signal."""
    if noise == 0.0:
        return math.inf if signal > 0.0 else math.nan
    return 10.0 * math.log10(signal / noise) if signal > 0.0 else -math.inf


def range_binades(x: torch.Tensor) -> float:
    """log2(max|x| / median of the nonzero |x|) (module docstring); 0 for an all-zero x."""
    magnitudes = x.detach().abs().float().flatten()
    magnitudes = magnitudes[magnitudes > 0]
    if magnitudes.numel() == 0:
        return 0.0
    if magnitudes.numel() > _MEDIAN_SAMPLE:
        generator = torch.Generator(device="cpu").manual_seed(0)
        pick = torch.randperm(magnitudes.numel(), generator=generator)[:_MEDIAN_SAMPLE]
        sample = magnitudes[pick.to(magnitudes.device)]
    else:
        sample = magnitudes
    return math.log2(magnitudes.max().item() / sample.median().item())


class _Sums:
    """One candidate's accumulated squares and first-order loss change on one layer."""

    def __init__(self) -> None:
        self.signal = {"output": 0.0, "grad_input": 0.0, "grad_weight": 0.0}
        self.noise = {"output": 0.0, "grad_input": 0.0, "grad_weight": 0.0}
        self.taylor = 0.0
        self.curvature = 0.0

    def add(self, part: str, reference: torch.Tensor, approx: torch.Tensor) -> None:
        self.signal[part] += reference.double().square().sum().item()
        self.noise[part] += (approx.double() - reference.double()).square().sum().item()

    def sqnr(self) -> dict[str, float]:
        return {part: sqnr_db(self.signal[part], self.noise[part]) for part in self.signal
                if self.signal[part] or self.noise[part]}


class LayerNumerics:
    """One layer's numerics under every candidate, accumulated call by call (module docstring).

    Args:
        layer: the planned layer.
        candidates: candidate name -> recipe.
    """

    def __init__(self, layer: PlannedLayer, candidates: dict[str, object]):
        self.layer = layer
        self.probes = {name: fp8_probe(layer, recipe) for name, recipe in candidates.items()}
        self.sums = {name: _Sums() for name in candidates}
        self.range = 0.0
        self.batches = 0
        self.batches_called = 0  # batches in which the layer ran
        self.rows_per_batch: int | None = None
        self.flops = 0.0  # this layer's forward GEMM FLOPs over the calibration batches

    def add_batch(self, calls: list[list]) -> None:
        """Every call of the layer in one calibration batch ([x2d, g2d or None] each)."""
        self.batches += 1
        self.batches_called += bool(calls)
        rows = 0
        for x, g in calls:
            self.add_call(x, g)
            rows += x.shape[0]
        if self.rows_per_batch is None and rows:
            self.rows_per_batch = rows

    def add_call(self, x: torch.Tensor, g: torch.Tensor | None) -> None:
        """One call: x [M, K] the input, g [M, N] the gradient of the loss with respect to its output (or None)."""
        layer = self.layer
        weight = layer.weight_nk().float()
        bias = layer.module.bias
        x32 = x.float()
        y_ref = x32 @ weight.t()
        if bias is not None:
            y_ref += bias.detach().float()
        self.range = max(self.range, range_binades(x))
        m, k, n = x.shape[0], layer.in_features, layer.out_features
        self.flops += 2.0 * m * k * n
        dx_ref = dw_ref = g32 = None
        if g is not None:
            g32 = g.float()
            dx_ref = g32 @ weight
            dw_ref = g32.t() @ x32
        for name, probe in self.probes.items():
            sums = self.sums[name]
            xi = x.detach().clone().requires_grad_(g is not None)
            with fp8_autocast(enabled=True, fp8_recipe=probe.fp8_recipe):
                y = probe(xi)
            sums.add("output", y_ref, y.detach())
            if g is None:
                continue
            per_row = (g32.double() * (y.detach().double() - y_ref.double())).sum(1)
            sums.taylor += per_row.sum().item()
            sums.curvature += 0.5 * x.shape[0] * per_row.square().sum().item()
            y.backward(g)
            sums.add("grad_input", dx_ref, xi.grad)
            if probe.weight.grad is not None:
                dw = probe.weight.grad.t() if layer.weight_in_out else probe.weight.grad
                sums.add("grad_weight", dw_ref, dw)
            probe.weight.grad = None
            if probe.bias is not None:
                probe.bias.grad = None

    def sqnr(self) -> dict[str, dict[str, float]]:
        """candidate -> {"output", "grad_input", "grad_weight"} SQNR in dB (a part without data left out)."""
        return {name: sums.sqnr() for name, sums in self.sums.items()}

    def taylor(self) -> dict[str, float]:
        """candidate -> the first-order loss change of its forward error, averaged over the calibration batches."""
        return {name: sums.taylor / max(self.batches, 1) for name, sums in self.sums.items()}

    def curvature(self) -> dict[str, float]:
        """candidate -> the empirical-Fisher second-order term of its forward error, averaged over the batches."""
        return {name: sums.curvature / max(self.batches, 1) for name, sums in self.sums.items()}
