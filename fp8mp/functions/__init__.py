"""Layer functions, the autograd functions, one per module kind and written once for every recipe: the FP8
linear (linear.py: LinearFunction, fp8_linear), the norm writing a linear's FP8 input (norm_linear.py), the
grouped linear of mixture-of-experts layers (grouped_linear.py: fp8_grouped_linear),
and the output dtype rule (output_dtype.py). They ask the quantizer of the
recipe in use for a call object and route its FP8 operands between the GEMMs. May import fp8mp.utils,
fp8mp.ops, fp8mp.optim, fp8mp.scaling and fp8mp.quantized; never fp8mp.memory or above."""
from fp8mp.functions.grouped_linear import GroupedLinearFunction, fp8_grouped_linear
from fp8mp.functions.linear import LinearFunction, fp8_linear
from fp8mp.functions.norm_linear import NormToFp8, norm_fp8_linear

__all__ = ["GroupedLinearFunction", "fp8_grouped_linear", "LinearFunction", "fp8_linear", "NormToFp8",
           "norm_fp8_linear"]
