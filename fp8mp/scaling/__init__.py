"""Layer scaling: recipes and the quantizers they become (quantizer_for: recipe_registry.py; the per-tensor
family: per_tensor_quantizer.py, per_tensor_grouped.py, current_scale.py; the block family: block_quantizer.py,
block_grouped.py), each module's Fp8Meta buffers, the thread's fp8_autocast contexts, amax reduction across
ranks, and the argument checks of config objects (recipes, policies, trainer config: config_checks.py). May import fp8mp.utils, fp8mp.ops and fp8mp.optim, never the layers above."""
from fp8mp.scaling import distributed, recipe
from fp8mp.scaling.autocast import fp8_autocast, get_fp8_group, get_fp8_recipe, is_fp8_enabled
from fp8mp.scaling.current_scale import current_scale
from fp8mp.scaling.fp8_meta import Fp8Meta
from fp8mp.scaling.recipe_registry import quantizer_for

__all__ = ["recipe", "distributed", "fp8_autocast", "get_fp8_group", "get_fp8_recipe", "is_fp8_enabled", "Fp8Meta", "current_scale",
           "quantizer_for"]
