"""fp8mp: FP8 mixed-precision training for PyTorch."""
from fp8mp.ops import cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cuda_kernels_available
from fp8mp import norm_ops  # noqa: F401,E402  (registers the norm ops' fake kernels and autograd)

__version__ = "0.1.0"

__all__ = ["cast_to_fp8", "cast_to_fp8_transpose", "cast_from_fp8", "cuda_kernels_available", "__version__"]
