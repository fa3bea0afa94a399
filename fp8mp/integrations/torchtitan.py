"""torchtitan 0.3: fp8mp's FP8 Linear layers in a torchtitan run, selected with one option::

    --override.imports fp8mp.integrations.torchtitan.fp8_linear

torchtitan 0.3 swaps components by rewriting the model's config tree before anything is built
(`torchtitan.config.override`, the registry behind `--override.imports`; its Float8 converters work the same
way). Importing this module registers the override `fp8_linear`: every `torchtitan.models.common.Linear.Config`
(exactly that class: subclasses with a forward of their own are left alone, as `fp8mp.convert` leaves subclasses of
nn.Linear) whose dims are multiples of 16 becomes a `Linear.Config` of this module. The model is then built from
that config on the meta device, parallelized (FSDP2 sees an nn.Linear with the same parameters; tensor parallelism is untested) and
initialized by torchtitan as usual: conversion happens before parallelization, as `fp8mp.convert` would do it on a
built model. Options ride on the target as JSON: `fp8mp.integrations.torchtitan.fp8_linear={"recipe": "current"}`.
In a config_registry function the same swap is `model_registry(..., converters=[Fp8LinearConverter.Config()])`.
(Not `fp8mp.convert` on the built model: torchtitan's layers are nn.Linear subclasses, which convert leaves alone, and
its modules must be torchtitan Modules: `verify_module_protocol` checks it, and `init_states` initializes only them.)

torchtitan's trainer enters no fp8mp context, so each FP8 layer enters `fp8mp.fp8_autocast` around its own forward
unless one is already open (a training loop of your own may open one around the whole step, as elsewhere in
fp8mp), with the data-parallel process group (WORLD when torch.distributed runs 2+ ranks): every rank computes the
same scales, and the FP8 scaling buffers, which are ordinary persistent buffers of the model's state_dict, are
saved and resumed by torchtitan's checkpointer (DCP) with the weights. After the optimizer step fp8mp needs
nothing: delayed scaling updates the scales from the amax history in the next forward, and no FP8 copy of a weight
is kept between steps (each forward casts the current weight), so there is no post-optimizer hook. FSDP2 gathers
the weights in their own dtype; fp8mp's FP8 all-gather is not part of this override. Pipeline parallelism is not
covered (its stages hold different layers, while the amax reduction expects the same layers on every rank of
WORLD), nor is torch.compile with 2+ ranks (the reduction runs where each layer's context is entered, which must be
eager).

torchtitan's trainer needs an accelerator (it picks "cuda" when none is found); on CPU this integration is tested
through torchtitan's own model, config override, optimizer container and DCP checkpoint manager
(tests/integrations/test_torchtitan.py).

torchtitan is imported when this module is (`pip install 'fp8mp[torchtitan]'`); without it the module imports,
and looking up any of its names raises an ImportError naming the extra.
"""
from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import torch

from fp8mp.nn import linear as fp8_linear_module
from fp8mp.nn.conversion import fp8_dims_supported
from fp8mp.scaling.autocast import fp8_autocast, is_fp8_enabled
from fp8mp.scaling.fp8_meta import Fp8Meta
from fp8mp.scaling.recipe import CurrentScaling, DelayedScaling, Recipe, RowwiseScaling

__all__ = ["Linear", "Fp8MetaModule", "Fp8LinearConverter", "fp8_linear", "RECIPES"]

# The recipes an override option can name (JSON carries strings, not recipe objects).
RECIPES = {"delayed": DelayedScaling, "current": CurrentScaling, "rowwise": RowwiseScaling}

_MISSING = ("fp8mp.integrations.torchtitan needs torchtitan: pip install 'fp8mp[torchtitan]'")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def recipe_named(name: str | None) -> Recipe | None:
    """The recipe an override option names (None: follow fp8_autocast's default, DelayedScaling())."""
    if name is None:
        return None
    if name not in RECIPES:
        raise ValueError(f"fp8mp.integrations.torchtitan: argument 'recipe' must be one of {sorted(RECIPES)} or None, "
                         f"got {name!r}")
    return RECIPES[name]()


def data_parallel_group():
    """The group amaxes are reduced over: WORLD when torch.distributed runs 2+ ranks, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


if _installed("torchtitan"):
    from torchtitan.config import override
    from torchtitan.models.common.linear import Linear as _TitanLinear
    from torchtitan.protocols.model import ModelConfigConverter
    from torchtitan.protocols.module import Module as _TitanModule

    class Fp8MetaModule(Fp8Meta, _TitanModule):
        """fp8mp's scaling buffers as a torchtitan Module: torchtitan builds models on the meta device, moves
        them with `to_empty` (buffers then hold garbage) and calls `init_states`, which resets them here."""

        def _init_self_buffers(self, buffer_device: torch.device | None = None) -> None:
            if buffer_device is not None:
                self.to(buffer_device)
            with torch.no_grad():
                self.reset_scaling()
                self.step_amax.zero_()
                self.fp8_max.fill_(1.0)
            self.recipe = None  # the next forward configures fp8_max (and the history length) for its recipe
            self._column_cache = None

    class Linear(fp8_linear_module.Linear, _TitanModule):
        """fp8mp.nn.Linear built from a torchtitan `Linear.Config` (parameters and state_dict keys of
        nn.Linear, plus `fp8_meta.*`), computing in FP8 inside an fp8_autocast it enters when none is open."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(_TitanLinear.Config):
            recipe: str | None = None
            """A name of RECIPES pinned on the layer; None: DelayedScaling(), or the open fp8_autocast's."""

        def __init__(self, config: Config):
            fp8_linear_module.Linear.__init__(self, config.in_features, config.out_features, bias=config.bias,
                                              fp8_weight=False)
            recipe = recipe_named(config.recipe)
            if recipe is not None:
                self.fp8_recipe = recipe
                self.fp8_meta.configure(recipe)

        def new_fp8_meta(self, device=None) -> Fp8Meta:
            return Fp8MetaModule(self.FP8_TENSORS, backward_tensors=self.FP8_BACKWARD_TENSORS, device=device)

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if is_fp8_enabled():
                return super().forward(input)
            with fp8_autocast(enabled=True, fp8_recipe=self.fp8_recipe, fp8_group=data_parallel_group()):
                return super().forward(input)

    def fp8_config(config: Any, recipe: str | None = None) -> Any:
        """`config` as this module's Linear.Config when it is exactly a torchtitan Linear.Config with FP8-sized
        dims, else `config` unchanged."""
        recipe_named(recipe)  # refuse a bad name before anything is built
        if type(config) is not _TitanLinear.Config or not fp8_dims_supported(config.in_features, config.out_features):
            return config
        return Linear.Config(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}, recipe=recipe)

    @override(target=_TitanLinear.Config, exact=True,
              description="fp8mp: torchtitan Linear layers with dims that are multiples of 16 compute in FP8")
    def fp8_linear(config: Any, recipe: str | None = None) -> Any:
        """The override `--override.imports fp8mp.integrations.torchtitan.fp8_linear` activates."""
        return fp8_config(config, recipe)

    class Fp8LinearConverter(ModelConfigConverter):
        """The same swap as a model converter, for config_registry functions:
        `model_registry("debugmodel", converters=[Fp8LinearConverter.Config()])`."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(ModelConfigConverter.Config):
            recipe: str | None = None
            """A name of RECIPES pinned on every converted layer; None: DelayedScaling()."""

        def __init__(self, config: Config):
            self.config = config

        def convert(self, model_config):
            for _fqn, linear_config, parent, attr in list(model_config.traverse(_TitanLinear.Config)):
                new = fp8_config(linear_config, self.config.recipe)
                if parent is None:
                    model_config = new
                elif isinstance(parent, list):
                    parent[attr] = new
                else:
                    setattr(parent, attr, new)
            return model_config

else:
    def __getattr__(name: str):
        if name in __all__ or name == "fp8_config":
            raise ImportError(_MISSING)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
