"""The layers a plan covers (those `fp8mp.convert` would touch) and the FP8 probe that measures one of them.

A probe is a fresh fp8mp module (Linear, or Conv1D for transformers' Conv1D) on *new leaves that share the
layer's storage*: it computes with the layer's very weights, but its backward fills the probe's own `.grad`, so
measuring never touches the model's gradients, and its Fp8Meta is its own, so measuring never touches the model's
scaling state. It is pinned to one candidate recipe, as `convert(plan=...)` pins a layer.
"""
from __future__ import annotations

import dataclasses

import torch

from fp8mp.nn.conv1d import Conv1D
from fp8mp.nn.conversion import convertible_layers
from fp8mp.nn.linear import Linear

__all__ = ["PlannedLayer", "planned_layers", "fp8_probe"]


@dataclasses.dataclass
class PlannedLayer:
    """One layer convert would touch: its name, the module, and its GEMM's geometry.

    weight_in_out: the weight is stored [in, out] (transformers' Conv1D) rather than [out, in] (Linear).
    """

    name: str
    module: torch.nn.Module
    in_features: int
    out_features: int
    weight_in_out: bool

    @property
    def kind(self) -> str:
        return type(self.module).__name__

    def weight_nk(self) -> torch.Tensor:
        """The weight as [out, in] (N x K), detached: the layout the planning arithmetic uses for every kind."""
        weight = self.module.weight.detach()
        return weight.t() if self.weight_in_out else weight


def planned_layers(model: torch.nn.Module) -> list[PlannedLayer]:
    """Every layer `fp8mp.convert(model)` would turn into an FP8 GEMM module (`convertible_layers`), in
    `model.named_modules()` order."""
    modules = dict(model.named_modules())
    layers = []
    for name in convertible_layers(model):
        module = modules[name]
        in_out = not isinstance(module, torch.nn.Linear)  # transformers' Conv1D: weight [nx, nf]
        k, n = (module.nx, module.nf) if in_out else (module.in_features, module.out_features)
        layers.append(PlannedLayer(name, module, k, n, in_out))
    return layers


def _leaf(param: torch.Tensor | None) -> torch.nn.Parameter | None:
    """A new leaf on `param`'s storage (its gradient is the probe's own)."""
    return None if param is None else torch.nn.Parameter(param.detach(), requires_grad=param.requires_grad)


def fp8_probe(layer: PlannedLayer, recipe) -> torch.nn.Module:
    """A fresh fp8mp module computing `layer` with its weights, pinned to `recipe` (module docstring)."""
    module = layer.module
    device = module.weight.device
    if layer.weight_in_out:
        probe = Conv1D(layer.out_features, layer.in_features, device="meta")
        probe.weight, probe.bias = _leaf(module.weight), _leaf(module.bias)
        probe.fp8_meta = probe.new_fp8_meta(device)
    else:
        shell = torch.nn.Linear(layer.in_features, layer.out_features, bias=module.bias is not None, device="meta")
        shell.weight, shell.bias = _leaf(module.weight), _leaf(module.bias)
        probe = Linear.from_linear(shell)
    probe.fp8_recipe = recipe
    probe.fp8_meta.configure(recipe)
    return probe
