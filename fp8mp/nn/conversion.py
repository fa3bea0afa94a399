"""`convert(model)`: swap torch modules for their fp8mp twins in place (under one recipe, or a plan's recipe per
layer); `unconvert` undoes it.

Parameters are shared, not copied: the converted model trains the same tensors,
so an optimizer built before conversion keeps working, and memory does not grow.
"""
from __future__ import annotations

import logging
import sys
from typing import Callable

import torch

from fp8mp.nn.conv1d import Conv1D
from fp8mp.nn.conversion_report import ConversionReport, converted_layers
from fp8mp.nn.planned_recipes import planned_recipes
from fp8mp.quantized.all_gather_weight import Fp8AllGatherWeight
from fp8mp.quantized.frozen_weight import REPORTED_DTYPES, Fp8FrozenWeight, register_checkpoint_hooks
from fp8mp.nn.fp8_module import Fp8Module
from fp8mp.nn.linear import Linear
from fp8mp.nn.normalization import LayerNorm, RMSNorm
from fp8mp.memory.saved_activations import disable_fp8_saved_activations, enable_fp8_saved_activations
from fp8mp.scaling.autocast import validate_recipe
from fp8mp.scaling.recipe import Recipe
from fp8mp.scaling.recipe_registry import quantizer_for

logger = logging.getLogger("fp8mp")

# Modules unconvert turns back into their torch twins (each has `to_torch()`): every FP8 module, and the norms.
FP8_MODULES = (Fp8Module, LayerNorm, RMSNorm)

ModuleFilter = Callable[[str, torch.nn.Module], bool]

# FP8 GEMMs need the inner (K) and outer (N) dims to be multiples of 16; fp8_gemm pads
# other shapes, but padding a small layer costs more than FP8 saves, so such layers stay as they are.
FP8_DIM_MULTIPLE = 16


def hf_conv1d_class() -> type | None:
    """transformers' Conv1D class when transformers is loaded (a model holding one has loaded it), else None."""
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def _swap_table(convert_norms: bool) -> dict[type, Callable[[torch.nn.Module], torch.nn.Module]]:
    table: dict[type, Callable] = {torch.nn.Linear: Linear.from_linear}
    hf_conv1d = hf_conv1d_class()
    if hf_conv1d is not None:
        table[hf_conv1d] = Conv1D.from_hf
    if convert_norms:
        table[torch.nn.LayerNorm] = LayerNorm.from_torch
        table[torch.nn.RMSNorm] = RMSNorm.from_torch
    return table


def fp8_dims_supported(in_features: int, out_features: int) -> bool:
    return in_features % FP8_DIM_MULTIPLE == 0 and out_features % FP8_DIM_MULTIPLE == 0


def _matmul_dims(module: torch.nn.Module) -> tuple[int, int] | None:
    """(in, out) features of a Linear or a transformers Conv1D; None for other modules."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module) is hf_conv1d_class():
        return module.nx, module.nf
    return None


def convertible_layers(model: torch.nn.Module) -> list[str]:
    """The names of the layers `convert` would turn into FP8 GEMM modules, module_filter aside: every
    torch.nn.Linear and transformers Conv1D (exactly those types) whose in and out features are multiples of 16.
    What a plan plans (its `architecture`)."""
    hf_conv1d = hf_conv1d_class()
    return [name for name, module in model.named_modules()
            if (type(module) is torch.nn.Linear or (hf_conv1d is not None and type(module) is hf_conv1d))
            and fp8_dims_supported(*_matmul_dims(module))]


def _plan_filter(recipes: dict[str, Recipe | None]) -> ModuleFilter:
    """The module_filter a plan amounts to: a GEMM layer converts when the plan gives it a recipe; other modules
    (norms, activations) are the plan's no business."""
    return lambda name, module: _matmul_dims(module) is None or recipes.get(name) is not None


def _refuse_block_recipes_for_all_gather(recipes: dict[str, Recipe | None]) -> None:
    for name, recipe in recipes.items():
        if recipe is not None and quantizer_for(recipe).per_tensor_format is None:
            where = f"layer {name!r}'s " if name else ""
            raise ValueError(f"argument 'fp8_all_gather': FP8 all-gather gathers per-tensor scaled E4M3 codes, but "
                             f"{where}recipe {type(recipe).__name__} scales the weight per block; use DelayedScaling "
                             "or CurrentScaling, or fp8_all_gather=False")


def convert(
    model: torch.nn.Module,
    recipe: Recipe | None = None,
    module_filter: ModuleFilter | None = None,
    convert_norms: bool = False,
    frozen_weights: str | None = None,
    fp8_saved_activations: bool = False,
    fp8_all_gather: bool = False,
    plan=None,
) -> torch.nn.Module:
    """Replace every `torch.nn.Linear` and transformers `Conv1D` of `model` in place (and with
    `convert_norms`, LayerNorm/RMSNorm).

    Args:
        model: any module; a bare `nn.Linear` is returned converted (it has no parent to swap it in).
        recipe: FP8 recipe pinned on each converted Linear (None: follow `fp8_autocast`'s recipe).
        module_filter: `f(fully_qualified_name, module) -> bool`; modules for which it returns False are
            kept. Use it to keep e.g. the LM head in high precision: `lambda name, m: name != "lm_head"`.
        convert_norms: also swap `nn.LayerNorm` / `nn.RMSNorm` for fp8mp's fused norms.
        frozen_weights: None, or "fp8": store every frozen (requires_grad=False) weight of the Linear-like
            modules that `module_filter` accepts in FP8, one byte a parameter, still read as an ordinary
            tensor (`fp8mp.nn.store_frozen_weights_in_fp8`, fp8mp/quantized/frozen_weight.py). Layers too small
            for FP8 GEMMs are stored too (they decode).
        fp8_saved_activations: also make the activation-function modules (those `module_filter` keeps) store
            what they save for backward in FP8, E4M3 with one fp32 scale per 128 elements, and the norms in bf16
            (fp8mp/memory/saved_activations.py, which says which modules and what is stored, and why norms keep bf16;
            `enable_fp8_saved_activations(model, norm_format="e4m3")` stores them in E4M3 too).
        fp8_all_gather: make the trainable weight of every fp8mp.nn.Linear (those `module_filter` keeps) an
            `fp8mp.nn.Fp8AllGatherWeight`, which FSDP2 (`fully_shard`, called after `convert`) all-gathers as
            E4M3 codes, one byte an element, and whose gathered codes the FP8 GEMMs take as they are
            (fp8mp/quantized/all_gather_weight.py; the per-tensor recipes only). Under CurrentScaling call
            `fp8mp.precompute_fp8_weight_scales(model)` after each optimizer step.
        plan: an `fp8mp.PrecisionPlan` (or any object with `layer_recipes()` and `architecture`), or a dict
            name -> recipe-or-None: each layer it gives a recipe is converted and pinned to that recipe; a layer it
            gives None ("bf16"), and a layer it does not name, stays as it is. A plan is the whole per-layer
            decision, so it is refused together with `recipe` or `module_filter`; an entry naming no layer convert
            would touch, and a plan whose architecture differs from the model's (`convertible_layers`), are
            refused naming the layers. The other options follow it (frozen weights, saved activations and
            all-gather only for the layers it converts).

    transformers' Conv1D (GPT-2's attention and MLP projections, weight [in, out]) becomes
    fp8mp.nn.Conv1D; transformers is never imported for this (a model holding a Conv1D has loaded it).
    Linear/Conv1D layers whose in_features or out_features is not a multiple of 16 are skipped
    (logged on the "fp8mp" logger): FP8 tensor cores need such dims and padding small layers
    does not pay. Subclasses of the torch modules (other than fp8mp's own) are left alone, since
    their forward may differ. Returns `model`.

    Nothing matches silently: each converted module is logged (INFO, "fp8mp" logger: name, old -> new, recipe)
    with a summary line, and converting nothing warns (WARNING), naming the module_filter that accepted nothing
    (fp8mp/nn/conversion_report.py). `fp8mp.nn.converted_layers(model)` lists what a model runs in FP8.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if recipe is not None:
        validate_recipe(recipe)
    if module_filter is not None and not callable(module_filter):
        raise TypeError("argument 'module_filter' must be callable as module_filter(name, module) -> bool")
    if frozen_weights not in (None, "fp8"):
        raise ValueError(f"argument 'frozen_weights' must be None or \"fp8\", got {frozen_weights!r}")
    if not isinstance(fp8_saved_activations, bool):
        raise TypeError(f"argument 'fp8_saved_activations' must be a bool, got {fp8_saved_activations!r}")
    if not isinstance(fp8_all_gather, bool):
        raise TypeError(f"argument 'fp8_all_gather' must be a bool, got {fp8_all_gather!r}")
    recipes: dict[str, Recipe | None] | None = None
    if plan is not None:
        if recipe is not None or module_filter is not None:
            raise ValueError("argument 'plan' gives each layer its recipe and decides which layers convert: pass it "
                             "without 'recipe' and 'module_filter' (edit the plan instead)")
        recipes = planned_recipes(plan, convertible_layers(model),
                                  [name for name, m in model.named_modules() if isinstance(m, FP8_MODULES)])
        module_filter = _plan_filter(recipes)
    if fp8_all_gather:
        _refuse_block_recipes_for_all_gather({"": recipe} if recipes is None else recipes)
    table = _swap_table(convert_norms)
    report = ConversionReport()

    def replacement(name: str, module: torch.nn.Module) -> torch.nn.Module | None:
        make = table.get(type(module))
        if make is None:
            return None
        report.candidates.append(name)
        dims = _matmul_dims(module)
        if module_filter is not None and not module_filter(name, module):
            (report.filtered if dims is None or fp8_dims_supported(*dims) else report.unsupported).append(name)
            return None
        if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) and len(module.normalized_shape) != 1:
            logger.info("fp8mp.convert: keeping %s: fp8mp norms normalize the last dimension only", name or "<root>")
            report.unsupported.append(name)
            return None
        if dims is not None and not fp8_dims_supported(*dims):
            logger.info("fp8mp.convert: keeping %s (%s) in high precision: dims not multiples of %d", name or "<root>",
                        module, FP8_DIM_MULTIPLE)
            report.unsupported.append(name)
            return None
        new = make(module)
        layer_recipe = recipe if recipes is None else recipes.get(name)
        if layer_recipe is not None and isinstance(new, Fp8Module):
            new.fp8_recipe = layer_recipe
            new.fp8_meta.configure(layer_recipe)  # the state's shapes (history length) exist before any load
        old = f"{type(module).__name__}({dims[0]} -> {dims[1]})" if dims is not None else type(module).__name__
        report.converted.append((name, old, type(new).__name__, layer_recipe))
        return new

    model = _swap_in_place(model, replacement)
    report.log(model, module_filter, plan is not None)
    if frozen_weights == "fp8":
        store_frozen_weights_in_fp8(model, module_filter)
    if fp8_saved_activations:
        enable_fp8_saved_activations(model, module_filter)
    if fp8_all_gather:
        enable_fp8_all_gather(model, module_filter)
    return model


def unconvert(model: torch.nn.Module) -> torch.nn.Module:
    """Swap fp8mp modules back to their torch twins (sharing parameters); FP8 scaling state is dropped, and so
    is FP8 storage of saved activations (`convert(..., fp8_saved_activations=True)`).

    Frozen weights stored in FP8 stay so (their checkpoints keep the codes plus `_scale_inv` layout)."""
    disable_fp8_saved_activations(model)

    def replacement(name: str, module: torch.nn.Module) -> torch.nn.Module | None:
        if not isinstance(module, FP8_MODULES):
            return None
        twin = module.to_torch()
        if any(isinstance(p, Fp8FrozenWeight) for p in twin._parameters.values()):
            register_checkpoint_hooks(twin)
        return twin

    return _swap_in_place(model, replacement)


def _swap_in_place(model: torch.nn.Module, replacement: Callable[[str, torch.nn.Module], torch.nn.Module | None]):
    root = replacement("", model)
    if root is not None:
        return root
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            new = replacement(name, child)
            if new is not None:
                new.train(child.training)
                setattr(parent, child_name, new)
    return model


# ------------------------------------------------------------------------------ frozen weights in FP8
def _is_linear_like(module: torch.nn.Module) -> bool:
    """nn.Linear (fp8mp.nn.Linear included), fp8mp's Conv1D and transformers' Conv1D: modules whose 2-D
    `weight` is a GEMM operand."""
    return isinstance(module, (torch.nn.Linear, Conv1D)) or type(module) is hf_conv1d_class()


def _frozen_candidates(module: torch.nn.Module) -> list[str]:
    """Names of `module`'s own frozen parameters to store in FP8: the 2-D ones of a Linear-like module, and
    the 3-D ones (mixture-of-experts weights [E, ...]) of any module but a convolution."""
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        return []
    linear_like = _is_linear_like(module)
    names = []
    for name, param in module._parameters.items():
        if param is None or param.requires_grad or isinstance(param, Fp8FrozenWeight):
            continue
        if param.dtype in REPORTED_DTYPES and (param.dim() == 3 or (param.dim() == 2 and linear_like)):
            names.append(name)
    return names


def store_frozen_weights_in_fp8(model: torch.nn.Module,
                                module_filter: ModuleFilter | None = None) -> torch.nn.Module:
    """Replace, in place, every frozen (requires_grad=False) weight of `model`'s Linear-like modules by an
    `nn.Parameter(Fp8FrozenWeight)`: 2-D weights of nn.Linear / fp8mp.nn.Linear / Conv1D (transformers' and
    fp8mp's), and 3-D mixture-of-experts parameters (one scale per expert). Embeddings, norms, biases and
    trainable parameters stay as they are. A parameter shared with another kind of module (an LM head tied
    to the embedding) stays too, so tying holds. `module_filter(name, module)` False keeps a module's
    parameters. Returns `model`.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"store_frozen_weights_in_fp8: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if module_filter is not None and not callable(module_filter):
        raise TypeError("store_frozen_weights_in_fp8: argument 'module_filter' must be callable as "
                        "module_filter(name, module) -> bool")
    modules = list(model.named_modules(remove_duplicate=False))
    chosen: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    holders: dict[int, int] = {}
    for name, module in modules:
        for param in module._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
        if module_filter is not None and not module_filter(name, module):
            continue
        for pname in _frozen_candidates(module):
            chosen.setdefault(id(module._parameters[pname]), []).append((module, pname))
    stored: dict[int, torch.nn.Parameter] = {}
    for key, places in chosen.items():
        if len(places) != holders[key]:
            logger.info("fp8mp.store_frozen_weights_in_fp8: keeping %s.%s: shared with a module that is not "
                        "stored in FP8", type(places[0][0]).__name__, places[0][1])
            continue
        for module, pname in places:
            if key not in stored:
                stored[key] = torch.nn.Parameter(Fp8FrozenWeight.from_tensor(module._parameters[pname]),
                                                 requires_grad=False)
            module._parameters[pname] = stored[key]
            register_checkpoint_hooks(module)
    return model




# ------------------------------------------------------------------------------ FP8 all-gather
def enable_fp8_all_gather(model: torch.nn.Module, module_filter: ModuleFilter | None = None) -> torch.nn.Module:
    """Make the trainable weight of every fp8mp.nn.Linear of `model` (that `module_filter` accepts) an
    `Fp8AllGatherWeight` parameter, in place and before `fully_shard`: FSDP2 then all-gathers it as E4M3 codes
    (fp8mp/quantized/all_gather_weight.py). What `convert(model, fp8_all_gather=True)` does. Frozen, FP8-stored and
    already converted weights are left as they are; a weight shared with other modules (tying) is replaced
    in every one of them. Returns `model`."""
    replaced: dict[int, torch.nn.Parameter] = {}
    for name, module in model.named_modules():
        if type(module) is not Linear or (module_filter is not None and not module_filter(name, module)):
            continue
        weight = module._parameters.get("weight")
        if weight is not None and weight.requires_grad and type(weight) is torch.nn.Parameter:
            replaced[id(weight)] = Fp8AllGatherWeight.parameter_of(module, f"{name or '<root>'}.weight")
    for module in model.modules():
        for pname, param in module._parameters.items():
            if param is not None and id(param) in replaced:
                module._parameters[pname] = replaced[id(param)]
    return model
