"""Drop-in torch.nn modules backed by fp8mp's kernels."""
from fp8mp.nn.linear import Linear
from fp8mp.nn.norm import LayerNorm, RMSNorm

# Modules fp8mp.unconvert turns back into their torch twins (each has `to_torch()`).
FP8_MODULES = (Linear, LayerNorm, RMSNorm)

__all__ = ["Linear", "LayerNorm", "RMSNorm", "FP8_MODULES"]
