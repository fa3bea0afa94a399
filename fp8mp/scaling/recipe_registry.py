"""The recipe registry: which quantizer each recipe becomes (`quantizer_for`).

The one place fp8mp looks at a recipe's type. A new recipe is a frozen dataclass in recipe.py, a quantizer of
its family (or an existing family's, with its own geometry), and one line here.
"""
from __future__ import annotations

from typing import Callable

from fp8mp.scaling.block_quantizer import BlockQuantizer
from fp8mp.scaling.per_tensor_quantizer import PerTensorQuantizer
from fp8mp.scaling.quantizer import Quantizer
from fp8mp.scaling.recipe import BlockScaling, CurrentScaling, DelayedScaling, MXFP8Scaling, RowwiseScaling


def _pow2_or_fp32(recipe) -> str:
    return "pow2" if recipe.power_of_2_scales else "fp32"


QUANTIZERS: dict[type, Callable[[object], Quantizer]] = {
    DelayedScaling: lambda r: PerTensorQuantizer(r, delayed=True),
    CurrentScaling: lambda r: PerTensorQuantizer(r, delayed=False),
    RowwiseScaling: lambda r: BlockQuantizer(r, block_k=None, weight_block_rows=1, scale_mode=_pow2_or_fp32(r)),
    BlockScaling: lambda r: BlockQuantizer(r, block_k=128, weight_block_rows=128, scale_mode=_pow2_or_fp32(r)),
    MXFP8Scaling: lambda r: BlockQuantizer(r, block_k=32, weight_block_rows=1, scale_mode="e8m0_" + r.scale_mode),
}


def is_recipe(recipe) -> bool:
    """Whether `recipe` is a recipe fp8mp has a quantizer for."""
    return type(recipe) in QUANTIZERS


def quantizer_for(recipe) -> Quantizer:
    """The quantizer of `recipe` (a new object: callers keep it as long as they keep the recipe)."""
    make = QUANTIZERS.get(type(recipe))
    if make is None:
        names = ", ".join(cls.__name__ for cls in QUANTIZERS)
        raise TypeError(f"fp8mp: a recipe must be one of {names}, got {type(recipe).__name__}")
    return make(recipe)
