"""Drop-in FP8 modules."""
from fp8mp.nn.linear import Linear

__all__ = ["Linear"]
