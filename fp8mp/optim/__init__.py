"""Optimizers for FP8 training."""
from fp8mp.optim.master_weight_optimizer import MasterWeightOptimizer

__all__ = ["MasterWeightOptimizer"]
