"""Drop-in torch.nn modules backed by fp8mp's kernels."""
from fp8mp.nn.norm import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
