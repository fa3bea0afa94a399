"""Layer optim: torch.optim.Optimizer subclasses on fp8mp's fused step ops (FP8, bfloat16 or float32 states,
stochastic rounding of bfloat16 parameters, non-finite steps skipped on the device). Imports only
fp8mp.ops (the ops it runs) and torch."""
from fp8mp.optim.adamw import AdamW
from fp8mp.optim.fused import FusedOptimizer
from fp8mp.optim.lion import Lion

__all__ = ["AdamW", "Lion", "FusedOptimizer"]
