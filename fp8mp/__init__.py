"""fp8mp: FP8 mixed-precision training for PyTorch."""
from fp8mp import recipe
from fp8mp.gemm import fp8_gemm
from fp8mp.ops import cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cuda_kernels_available
from fp8mp.scaling import update_amax_history_and_scale
from fp8mp.autocast import fp8_autocast, get_fp8_recipe, is_fp8_enabled
from fp8mp import nn
from fp8mp.convert import convert, unconvert
from fp8mp import norm_ops  # noqa: F401,E402  (registers the norm ops' fake kernels and autograd)
from fp8mp import amp
from fp8mp.amp import LossScaler
from fp8mp.fp8_weight import fp8_model_init
from fp8mp import optim
from fp8mp import fallback
from fp8mp import monitor
from fp8mp import distributed
from fp8mp.autocast import get_fp8_group
from fp8mp.trainer_config import TrainerConfig
from fp8mp.trainer import Trainer

__version__ = "0.1.0"

__all__ = [
    "cast_to_fp8",
    "cast_to_fp8_transpose",
    "cast_from_fp8",
    "fp8_gemm",
    "cuda_kernels_available",
    "recipe",
    "update_amax_history_and_scale",
    "fp8_autocast",
    "get_fp8_recipe",
    "is_fp8_enabled",
    "nn",
    "convert",
    "unconvert",
    "amp",
    "LossScaler",
    "fp8_model_init",
    "optim",
    "fallback",
    "monitor",
    "distributed",
    "get_fp8_group",
    "Trainer",
    "TrainerConfig",
    "__version__",
]
