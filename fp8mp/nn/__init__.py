"""Drop-in FP8 modules."""
from fp8mp.nn.linear import Linear

# Modules fp8mp.unconvert turns back into their torch twins (each has `to_torch()`).
FP8_MODULES = (Linear,)

__all__ = ["Linear", "FP8_MODULES"]
