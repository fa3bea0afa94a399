"""Layer optim, every optimizer piece: torch.optim.Optimizer subclasses on fp8mp's fused step ops (FP8, bfloat16
or float32 states, stochastic rounding of bfloat16 parameters, non-finite steps skipped on the device), the step
in backward (step_in_backward.py) with its gradient row blocks, and the deprecated FP32 master-weight wrapper
(master_weights.py). Imports only fp8mp.utils, fp8mp.ops (the ops it runs) and torch."""
from fp8mp.optim.adamw import AdamW
from fp8mp.optim.fused import FusedOptimizer
from fp8mp.optim.lion import Lion
from fp8mp.optim.master_weights import MasterWeightOptimizer
from fp8mp.optim.step_in_backward import StepInBackward, step_in_backward

__all__ = ["AdamW", "Lion", "FusedOptimizer", "MasterWeightOptimizer", "StepInBackward", "step_in_backward"]
