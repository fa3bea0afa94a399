"""fp8mp: FP8 mixed-precision training for PyTorch.

Layers, bottom up (imports point down only; tests/test_layers.py keeps it so):
    fp8mp._C        the C++/CUDA ops (csrc/: _C.abi3.so and _cuda_ops.abi3.so, loaded by fp8mp/ops/native.py)
    fp8mp.ops       their Python face: fakes, autograd, wrappers; formats
    fp8mp.scaling   recipes, Fp8Meta, fp8_autocast, amax reduction across ranks
    fp8mp.nn        modules, their autograd functions, convert, LoRA, FP8 weights
    fp8mp.training  LossScaler, master weights, fallback, monitor, Trainer
    fp8mp.integrations  transformers (.hf: prepare), Lightning (.lightning: FP8Precision), accelerate (.accelerate)
"""
import sys as _sys

from fp8mp import integrations, nn, ops, scaling, training
from fp8mp.nn import convert, fp8_model_init, load_state_dict, precompute_fp8_weight_scales, unconvert
from fp8mp.ops import (cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias,
                       cuda_kernels_available,
                       cuda_kernels_status, fp8_gemm,
                       update_amax_history_and_scale)
from fp8mp.scaling import distributed, recipe
from fp8mp.scaling.autocast import fp8_autocast, get_fp8_group, get_fp8_recipe, is_fp8_enabled
from fp8mp.training import LossScaler, Trainer, TrainerConfig, fallback, monitor, step_in_backward
from fp8mp.training import loss_scaler as amp
from fp8mp import optim
from fp8mp.training.master_weight_optimizer import MasterWeightOptimizer as _MasterWeightOptimizer

# fp8mp.optim is the fused optimizers' layer; `fp8mp.optim.MasterWeightOptimizer` (it lives in the
# training layer, which fp8mp.optim may not import) is kept there for code written before.
optim.MasterWeightOptimizer = _MasterWeightOptimizer
optim.step_in_backward = step_in_backward  # the same: it lives in the training layer (it uses LossScaler's checks)

# Short public module paths: `fp8mp.recipe`, `fp8mp.monitor` and `fp8mp.fallback` are the documented
# names of modules that live in their layers; `fp8mp.amp` and `fp8mp.distributed` are
# kept only for compatibility with code written before the layered layout.
for _name, _module in {"recipe": recipe, "monitor": monitor, "fallback": fallback, "amp": amp,
                       "distributed": distributed}.items():
    _sys.modules[f"{__name__}.{_name}"] = _module

__version__ = "0.1.0"

__all__ = [
    "cast_to_fp8",
    "cast_to_fp8_transpose",
    "cast_to_fp8_transpose_dbias",
    "cast_from_fp8",
    "fp8_gemm",
    "cuda_kernels_available",
    "cuda_kernels_status",
    "recipe",
    "update_amax_history_and_scale",
    "fp8_autocast",
    "get_fp8_recipe",
    "is_fp8_enabled",
    "nn",
    "convert",
    "unconvert",
    "precompute_fp8_weight_scales",
    "load_state_dict",
    "amp",
    "LossScaler",
    "step_in_backward",
    "fp8_model_init",
    "optim",
    "fallback",
    "monitor",
    "distributed",
    "get_fp8_group",
    "Trainer",
    "TrainerConfig",
    "integrations",
    "__version__",
]
