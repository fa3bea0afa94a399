"""fp8mp: FP8 mixed-precision training for PyTorch.

Layers, bottom up (imports point down only; tests/test_layers.py keeps it so):
    fp8mp._C            the C++/CUDA ops (csrc/: _C.abi3.so and _cuda_ops.abi3.so, loaded by fp8mp/ops/native.py)
    fp8mp.utils         torch-only helpers (DTensor checks)
    fp8mp.ops           the ops' Python face: fakes, autograd, wrappers; formats
    fp8mp.optim         fused optimizers, the step in backward, the FP32 master-weight wrapper
    fp8mp.scaling       recipes, Fp8Meta, fp8_autocast, amax reduction across ranks
    fp8mp.quantized     quantized tensors and weight forms
    fp8mp.functions     the autograd functions of the FP8 layers
    fp8mp.memory        memory levers: FP8 saved activations, FP8 recompute, chunked loss, embedding grad rows
    fp8mp.parallel      tensor parallel (sharded Linear, styles), checkpoints through torch.distributed.checkpoint
    fp8mp.nn            modules, convert, LoRA, FP8 weights
    fp8mp.planning      precision plans: which recipe each layer trains under (PrecisionPlan)
    fp8mp.training      LossScaler, fallback, monitor, Trainer
    fp8mp.integrations  transformers (.hf: prepare), Lightning (.lightning: FP8Precision), accelerate (.accelerate)

The top-level modules (this file, recipe.py, monitor.py, fallback.py, amp.py, distributed.py) only re-export.
"""
from fp8mp import amp, distributed, fallback, integrations, monitor, nn, ops, optim, recipe, scaling, training
from fp8mp.nn import convert, fp8_model_init, load_state_dict, precompute_fp8_weight_scales, unconvert
from fp8mp.ops import (cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias,
                       cuda_kernels_available,
                       cuda_kernels_status, fp8_gemm,
                       update_amax_history_and_scale)
from fp8mp.optim import step_in_backward
from fp8mp.planning import PrecisionPlan, plan_precision, replan
from fp8mp.scaling.autocast import fp8_autocast, get_fp8_group, get_fp8_recipe, is_fp8_enabled
from fp8mp.training import LossScaler, Trainer, TrainerConfig

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
    "PrecisionPlan",
    "plan_precision",
    "replan",
    "__version__",
]
